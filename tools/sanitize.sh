#!/usr/bin/env bash
# Sanitizer jobs (CI runs both): builds keel and its tests with a sanitizer into its own folder,
# CPU only, then runs the unit and multi-process tests the job covers.
#   tools/sanitize.sh asan   clang, AddressSanitizer + UndefinedBehaviorSanitizer, build-asan/
#   tools/sanitize.sh tsan   gcc, Debug, ThreadSanitizer, build-tsan/
# Extra arguments go to ctest (e.g. -R Store). A finding fails the test that made it: every
# sanitizer report aborts the process (-fno-sanitize-recover, halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:?usage: tools/sanitize.sh asan|tsan [ctest args]}
shift
case $job in
  asan)
    dir=build-asan
    cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang
                -DCMAKE_CXX_COMPILER=clang++ "-DKEEL_SANITIZE=address,undefined")
    export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0:detect_odr_violation=2
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    export LSAN_OPTIONS=suppressions=$PWD/tools/sanitizer/lsan.supp
    ;;
  tsan)
    dir=build-tsan
    cmake_args=(-DCMAKE_BUILD_TYPE=Debug -DKEEL_SANITIZE=thread)
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/sanitizer/tsan.supp"
    ;;
  *) echo "tools/sanitize.sh: unknown job '$job' (asan or tsan)" >&2; exit 2 ;;
esac
# What each job runs: the unit tests of the runtime, executor, communication, data and io layers
# and the multi-process data-parallel tests. Model training and the timing-bound fault-tolerance
# suites are left to the plain build (under TSan they run 10-20x slower).
tests=${KEEL_SANITIZE_TESTS:-'^(Scheduler|EventPlan|Executor|ExecutorThreads|EagerDeletion|OpTraits|Store|Collective|CollectiveOps|ShmCommunicator|Gloo|CommContext|DataLoader|Mnist|Csv|Gzip|Safetensors|Checkpoint|Io|AtomicFile|CachingAllocator|CpuThreads|Profiler|DataParallel|FleetApi)'}
cmake -S . -B "$dir" -G Ninja -DKEEL_WITH_CUDA=OFF -DKEEL_NATIVE=OFF -DKEEL_WERROR=ON \
  "${cmake_args[@]}" > "$dir.configure.log" || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j "$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j 2 --timeout 900 -R "$tests" "$@"
