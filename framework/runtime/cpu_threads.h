// The process's CPU threads: one budget of cores (--cpu_math_threads) shared by the executor's
// inter-op workers and the intra-op ParallelFor of big kernels (GEMM).
//
// The budget is the calling thread plus a pool of budget-1 threads (Eigen's ThreadPool, which
// sleeps instead of spinning when idle). Kernels split their work into chunks that depend on the
// shape only, never on the number of threads, so results are the same bits on any budget; oneDNN
// itself is kept at one OpenMP thread per caller, so no OpenMP team spins beside the pool.
#pragma once

#include <cstdint>
#include <functional>

namespace keel {
namespace cpu_threads {

// Sets the budget (>= 1). Call it when no kernel or executor run is in flight (keel::Init does,
// from --cpu_math_threads); the pool is rebuilt when the size changes.
//
// spin_when_idle: a pool thread that runs out of work spins briefly (Eigen's bounded spin, about
// 100 microseconds) before it sleeps, so the next op's pieces find it awake; waking a sleeping
// thread costs tens of microseconds, a lot beside kernels of 100 microseconds (measured: ResNet-20
// on 2 threads, 72.6-72.9 ms a step spinning against 77.6-81.6 ms not). Only when the budget does
// not oversubscribe the CPUs (ShouldSpin), so a spinning thread never takes a core another of
// keel's threads needs for long.
void SetBudget(int n, bool spin_when_idle = false);
bool SpinWhenIdle();
// Whether a process with this budget, among local_workers such processes on cpus CPUs, spins.
bool ShouldSpin(int budget, int local_workers, int cpus);
int Budget();

// Queues `task` on a pool thread; returns false (running nothing) when the budget is 1.
bool Schedule(std::function<void()> task);

// Runs fn(i) for every i in [0, n): on the calling thread and on pool threads that are idle, and
// returns when all are done. The split into n pieces is the caller's, so it must not depend on
// Budget() when results must be reproducible. fn must not throw.
void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

// Work sharing between the executor's workers and kernels' ParallelFor, so that inter-op workers
// never keep a core from an op's pieces:
// - HelpWanted: some ParallelFor has helper tasks queued on the pool that no pool thread has
//   started (a pool thread running executor ops should return to the pool).
// - HelpOnce: runs pieces of a ParallelFor in flight on the calling thread (an executor worker
//   with nothing ready to run); false when there is none.
// - Add/RemoveHelpListener: `on_job` is called (under an internal lock: it must only signal)
//   whenever a ParallelFor starts.
bool HelpWanted();
bool HelpOnce();
void AddHelpListener(const std::function<void()>* on_job);
void RemoveHelpListener(const std::function<void()>* on_job);

// Runs fn(begin, end) for the pieces [k * grain, min(n, (k + 1) * grain)) of [0, n), as
// ParallelFor does; the cut depends on n and grain only. For element-wise work, and for
// reductions whose every sum lies inside one piece.
void ParallelForRange(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// ParallelFor calls of more than one piece since the process started, budget 1 or not (tests: a
// kernel that should cut its work into pieces does).
int64_t SplitCalls();

// Elements per piece of memory-bound element-wise kernels: 128 KiB of float32, a few tens of
// microseconds of work, well above the cost of handing a piece to another thread.
constexpr int64_t kElementwiseGrain = int64_t{1} << 17;

// Makes the calling thread use one OpenMP thread (what oneDNN's CPU primitives use), so oneDNN
// runs on the thread that calls it. Cheap after the first call on a thread.
void UseOneOpenMPThread();

// Blocks every signal in the calling thread. keel's own threads (the pool, ring streams) call it
// first: a process signal (SIGCHLD, SIGTERM) must reach the thread that waits for it (keel
// launch reads them from a signalfd), never a library thread that would drop it.
void BlockSignalsInThisThread();

}  // namespace cpu_threads
}  // namespace keel
