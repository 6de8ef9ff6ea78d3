#!/usr/bin/env bash
# What a user outside keel's tree does, from an existing build (nothing is rebuilt):
#   1. cmake --install into a fresh prefix, where find_package(Keel) points KEEL_INCLUDE_DIR and
#      KEEL_EXECUTABLE;
#   2. configure and build examples/ against it with find_package(Keel 0.2);
#   3. run the examples alone and under the installed `keel launch` with two workers, writing
#      TensorBoard files, and the keel::Trainer example stopped and resumed;
#   4. cpack a .deb and check what it holds;
#   5. configure a parent project that adds keel with add_subdirectory: only the library is a
#      target, nothing gets -march=native, and the parent's program compiles as C++17.
#   tools/check_install.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
work=$(mktemp -d /tmp/keel-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/keel include/keel/keel.h lib/cmake/Keel/KeelConfig.cmake lib/cmake/Keel/KeelConfigVersion.cmake; do
  [ -e "$prefix/$f" ] || { echo "check_install: $prefix/$f was not installed" >&2; exit 1; }
done
grep -q "cxx_std_17" "$prefix"/lib/cmake/Keel/KeelTargets.cmake ||
  { echo "check_install: the exported keel::keel does not require C++17" >&2; exit 1; }

# The package's variables point into the prefix (glog's config once moved them to /usr).
mkdir -p "$work/vars"
cat >"$work/vars/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(keel_vars LANGUAGES CXX)
find_package(Keel 0.2 REQUIRED)
message(STATUS "KEEL_INCLUDE_DIR=${KEEL_INCLUDE_DIR}")
message(STATUS "KEEL_EXECUTABLE=${KEEL_EXECUTABLE}")
CMAKE
vars=$(cmake -S "$work/vars" -B "$work/vars/build" -DCMAKE_PREFIX_PATH="$prefix")
for v in "KEEL_INCLUDE_DIR=$prefix/include" "KEEL_EXECUTABLE=$prefix/bin/keel"; do
  grep -q -- "-- $v\$" <<<"$vars" ||
    { echo "check_install: find_package(Keel) does not set $v:" >&2; grep KEEL_ <<<"$vars" >&2; exit 1; }
done

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S examples -B "$work/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" >/dev/null
cmake --build "$work/examples"

"$work/examples/fit_mlp" --steps=40
# The installed keel and a user program on a machine without CUDA: every CUDA library hidden.
if [ -e "$build/libkeel_cuda.so" ]; then
  [ -e "$prefix/lib/libkeel_cuda.so.0.2" ] ||
    { echo "check_install: libkeel_cuda was not installed beside libkeel" >&2; exit 1; }
fi
set +e
tools/run_without_cuda.sh "$work/examples/fit_mlp" --steps=40 > "$work/nocuda.log" 2>&1
rc=$?
set -e
if [ $rc -eq 77 ]; then
  echo "check_install: no mount namespace here; the run without CUDA is skipped"
elif [ $rc -ne 0 ]; then
  echo "check_install: the installed keel fails with the CUDA libraries hidden:" >&2
  cat "$work/nocuda.log" >&2; exit 1
else
  tools/run_without_cuda.sh "$prefix/bin/keel" train --model=mlp --steps=3 > "$work/nocuda.log" 2>&1 ||
    { echo "check_install: installed keel train fails with CUDA hidden:" >&2; cat "$work/nocuda.log" >&2; exit 1; }
  echo "check_install: the installed keel trains with every CUDA library hidden"
fi
"$prefix/bin/keel" launch --nproc_per_node=2 --log_dir="$work/log" \
  "$work/examples/fit_mlp" --steps=40 --logdir="$work/tb"
ls "$work"/tb/events.out.tfevents.* >/dev/null
# The user model trained with keel::Trainer on two workers, stopped after step 24 and resumed.
"$prefix/bin/keel" launch --nproc_per_node=2 --log_dir="$work/log_cnn" "$work/examples/train_cnn" \
  --save_dir="$work/cnn" --save_every=10 --stop_at_step=24
"$prefix/bin/keel" launch --nproc_per_node=2 --log_dir="$work/log_cnn" "$work/examples/train_cnn" \
  --save_dir="$work/cnn" --save_every=10 --auto_resume > "$work/cnn.log"
grep -q "resumed from $work/cnn at step 25" "$work/cnn.log" ||
  { echo "check_install: train_cnn did not resume at step 25:" >&2; cat "$work/cnn.log" >&2; exit 1; }

(cd "$build" && cpack -G DEB -B "$work/deb" >/dev/null)
deb=$(ls "$work"/deb/keel_*.deb)
dpkg-deb -c "$deb" > "$work/deb.txt"
for f in ./usr/bin/keel ./usr/include/keel/keel.h ./usr/lib/cmake/Keel/KeelConfig.cmake; do
  grep -q " $f\$" "$work/deb.txt" || { echo "check_install: $deb lacks $f" >&2; exit 1; }
done
grep -q "libkeel.so.0.2" "$work/deb.txt" || { echo "check_install: $deb lacks libkeel.so" >&2; exit 1; }
echo "check_install: $(basename "$deb"): $(dpkg-deb -f "$deb" Depends)"

cmake -S tests/cmake/subproject -B "$work/sub" -G Ninja -DKEEL_DIR="$PWD" >/dev/null
targets=$(ninja -C "$work/sub" -t targets all)
grep -q "^libkeel\.so\|keel/libkeel\.so" <<<"$targets" || { echo "check_install: subproject lacks libkeel" >&2; exit 1; }
if grep -q "bin/keel:\|_test:\|bin/train_mlp" <<<"$targets"; then
  echo "check_install: keel as a subproject builds more than its library" >&2; exit 1
fi
if grep -q "march=native" "$work/sub/build.ninja"; then
  echo "check_install: keel as a subproject compiles with -march=native" >&2; exit 1
fi
grep -A9 "build CMakeFiles/app.dir/main.cc.o" "$work/sub/build.ninja" | grep -q "std=c++17" ||
  { echo "check_install: keel::keel does not pass on C++17" >&2; exit 1; }
echo "check_install: ok"
