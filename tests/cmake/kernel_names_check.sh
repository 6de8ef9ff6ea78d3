#!/bin/sh
# Kernel class templates registered from different files must have different names: a kernel in
# an anonymous namespace is not enough (GCC gave `recv` the kernel of `recv_v2`, both named
# RecvKernel, through their shared factory instantiation). Prints each name defined twice.
# Usage: kernel_names_check.sh SOURCE_DIR
cd "$1" || exit 2
dups=$(grep -ho 'class [A-Za-z0-9_]*Kernel\b' ops/*.cc ops/*.h ops/*.cu 2>/dev/null |
       awk '$2 != "Kernel" {print $2}' | sort | uniq -d)
status=0
for k in $dups; do
  files=$(grep -l "class $k\b" ops/*.cc ops/*.h ops/*.cu 2>/dev/null | tr '\n' ' ')
  echo "kernel class $k is defined in more than one place: $files"
  status=1
done
exit $status
