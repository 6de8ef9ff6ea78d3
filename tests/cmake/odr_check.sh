#!/usr/bin/env bash
# One class, one definition: no class of namespace keel may be emitted both by a CUDA object
# (.cu.o) and by a C++ object (.cc.o) of libkeel unless it comes from a header both include (the
# allowed list below). Two kernel classes of one name, one in a .cuh and one in a .h, are one class
# to the linker: it keeps either's vtable, and a CUDA registration can end up running the CPU's
# code on device memory (as CopyKernel did). Usage: odr_check.sh OBJECT...
set -euo pipefail
ALLOWED='^(keel::Error|keel::OpKernel)$'
cu=$(mktemp) cc=$(mktemp)
trap 'rm -f "$cu" "$cc"' EXIT
classes() { nm -C --defined-only "$@" 2>/dev/null | sed -n 's/^.* [VWRr] typeinfo name for //p' |
            grep '^keel::' | grep -v 'anonymous namespace' | sort -u; }
objs_cu=() objs_cc=()
for o in "$@"; do case $o in *.cu.o) objs_cu+=("$o") ;; *.o) objs_cc+=("$o") ;; esac; done
if [ ${#objs_cu[@]} -eq 0 ]; then echo "odr_check: no CUDA objects (a CPU-only build): nothing to compare"; exit 0; fi
classes "${objs_cu[@]}" >"$cu"
classes "${objs_cc[@]}" >"$cc"
both=$(comm -12 "$cu" "$cc" | grep -Ev "$ALLOWED" || true)
if [ -n "$both" ]; then
  echo "odr_check: classes defined both in CUDA and in C++ objects of libkeel (rename one):"
  echo "$both"
  exit 1
fi
echo "odr_check: $(wc -l <"$cu") classes in ${#objs_cu[@]} CUDA objects, none also defined in the ${#objs_cc[@]} C++ objects"
