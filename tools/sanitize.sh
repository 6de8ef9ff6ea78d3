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
    # allocator_may_return_null and the 8 GiB cap: a fuzzed program's huge tensor fails to
    # allocate (a keel::Error) as it does under the RLIMIT_AS the plain build's fuzz test sets,
    # which ASan's shadow memory cannot live with.
    export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:detect_odr_violation=2:allocator_may_return_null=1:max_allocation_size_mb=8192
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
# What each job runs. ASan+UBSan: every test but the GPU ones (no CUDA here) and those bound by
# wall-clock time (fault injection with timeouts, two-host namespaces, mpirun, benchmarks).
# TSan (10-20x slower, and a TSan process takes 1.4 GB): the unit tests of the threaded parts
# (scheduler and executor, the store, the data loader, allocators, thread pool, profiler) and the
# two-rank data-parallel tests, and the parameter-server suites (sync, async, GEO, sparse tables:
# a trainer's communicator thread, a server's prefetch thread, Gloo's threads completing the
# transfers); the other collective and fleet multi-process
# suites (dozens of TSan processes each) are left to the ASan job and the plain build.
case $job in
  asan) select=(-E '^(Docs/DocCommands.RunAsWritten/docs_install|FaultTest|WorkerFaultTest|LaunchSecurityTest|MultiHostTest|MpirunTest|KeelBench|CrashTest|FleetFaults|Cuda|Cudnn|Gpu|GraphCapture|ExecutorCudaGraph)') ;;
  tsan) select=(-R '^(SchedulerTest|DependencyGraph|EventPlan|Executor[.]|EagerDeletion|OpTraits|Store[.]|StoreHandshake[.]|DataLoader|CachingAllocator|CpuAllocator|CpuThreads|ProfilerTest|Tensor[.]|Scope[.]|FdIo|DataParallel[.]NRanksOnBOverNRowsMatchOneRankOnB|ParameterServer[.]|ParameterServerAsync[.]|ParameterServerGeo[.]|ParameterServerSparse[.]|ParameterServerCli[.]AsyncDistributedTablePrefetchesWhileTheCommunicatorPushes|WorkerFaultTest[.]TheStoreOutlivesARankZeroThatFinishesFirst|PointToPoint[.]|GlooRing[.]|LaunchSecurityTest[.])'
                -E 'HazardEdgeKeepsTheAnswerAndRemovingItBreaksIt') ;;  # races on purpose
esac
if [ -n "${KEEL_SANITIZE_TESTS:-}" ]; then select=(-R "$KEEL_SANITIZE_TESTS"); fi
cmake -S . -B "$dir" -G Ninja -DKEEL_WITH_CUDA=OFF -DKEEL_NATIVE=OFF -DKEEL_WERROR=ON \
  "${cmake_args[@]}" > "$dir.configure.log" || { cat "$dir.configure.log"; exit 1; }
if [ "$job" = tsan ] && [ -z "${KEEL_SANITIZE_TESTS:-}" ]; then
  # Only what the selection runs: its test programs, the keel binary and the worker programs.
  workers=$(cd tests/workers && ls *_worker.cc | sed 's/\.cc$//')
  cmake --build "$dir" -j "$(nproc)" --target keel_cli train_mlp train_mlp_fleet $workers scheduler_test event_plan_test \
    executor_test eager_deletion_test op_traits_test store_test store_handshake_test data_parallel_test data_test \
    caching_allocator_test profiler_test runtime_test base_test parameter_server_async_test \
    parameter_server_cli_test parameter_server_test parameter_server_sparse_test
else
  cmake --build "$dir" -j "$(nproc)"
fi
ctest --test-dir "$dir" --output-on-failure -j 2 --timeout 900 "${select[@]}" "$@"

