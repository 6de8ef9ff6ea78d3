#include "framework/runtime/cpu_threads.h"

#include <omp.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/ThreadPool>

#include "framework/error.h"

namespace keel {
namespace cpu_threads {

namespace {

// Eigen's thread environment, with pool threads named and kept at one OpenMP thread.
struct KeelThreadEnvironment {
  struct Task {
    std::function<void()> f;
  };
  class EnvThread {
   public:
    explicit EnvThread(std::function<void()> f) : thr_(std::move(f)) {}
    ~EnvThread() { thr_.join(); }
    void OnCancel() {}

   private:
    std::thread thr_;
  };
  EnvThread* CreateThread(std::function<void()> f) {
    return new EnvThread([f = std::move(f)] {
      BlockSignalsInThisThread();
      pthread_setname_np(pthread_self(), "keel-cpu");
      UseOneOpenMPThread();
      f();
    });
  }
  Task CreateTask(std::function<void()> f) { return Task{std::move(f)}; }
  void ExecuteTask(const Task& t) { t.f(); }
};

using Pool = Eigen::ThreadPoolTempl<KeelThreadEnvironment>;

std::mutex g_mu;
int g_budget = 1;
bool g_spin = false;
std::unique_ptr<Pool> g_pool;

struct ParallelForState {
  std::atomic<int64_t> next{0};
  int64_t done = 0;
  std::mutex mu;
  std::condition_variable cv;
};

void Drain(ParallelForState& s, int64_t n, const std::function<void(int64_t)>& fn) {
  int64_t mine = 0;
  for (int64_t i; (i = s.next.fetch_add(1, std::memory_order_relaxed)) < n; ++mine) fn(i);
  if (mine == 0) return;
  std::lock_guard<std::mutex> lock(s.mu);
  s.done += mine;
  if (s.done == n) s.cv.notify_all();
}

// ParallelFor calls in flight, which idle threads outside the pool may help with (HelpOnce), and
// the helper tasks queued on the pool that have not started yet (HelpWanted).
struct Job {
  std::shared_ptr<ParallelForState> state;
  int64_t n;
  const std::function<void(int64_t)>* fn;
};
std::mutex g_jobs_mu;
std::vector<Job> g_jobs;
std::vector<const std::function<void()>*> g_listeners;
std::atomic<int> g_unstarted_helpers{0};

}  // namespace

void SetBudget(int n, bool spin_when_idle) {
  KEEL_ENFORCE(n >= 1, "the CPU thread budget must be >= 1, got ", n);
  std::lock_guard<std::mutex> lock(g_mu);
  UseOneOpenMPThread();
  if (n == g_budget && spin_when_idle == g_spin) return;
  g_pool.reset();  // joins its threads
  if (n > 1) g_pool = std::make_unique<Pool>(n - 1, spin_when_idle);
  g_budget = n;
  g_spin = spin_when_idle;
}

bool SpinWhenIdle() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_spin && g_budget > 1;
}

bool ShouldSpin(int budget, int local_workers, int cpus) {
  return budget > 1 && static_cast<int64_t>(budget) * std::max(1, local_workers) <= cpus;
}

int Budget() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_budget;
}

bool Schedule(std::function<void()> task) {
  Pool* pool = g_pool.get();
  if (pool == nullptr) return false;
  pool->Schedule(std::move(task));
  return true;
}

std::atomic<int64_t> g_split_calls{0};

int64_t SplitCalls() { return g_split_calls.load(std::memory_order_relaxed); }

void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  Pool* pool = g_pool.get();
  if (n <= 0) return;
  if (n > 1) g_split_calls.fetch_add(1, std::memory_order_relaxed);
  if (n == 1 || pool == nullptr) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // Helpers and the caller take pieces from one counter; a helper that starts late finds none
  // left and returns without touching `fn`, so a busy pool never delays the caller, and `fn`
  // (alive until all n pieces are done) is never called after this returns.
  auto shared = std::make_shared<ParallelForState>();
  const int64_t helpers = std::min<int64_t>(n - 1, pool->NumThreads());
  {
    std::lock_guard<std::mutex> lock(g_jobs_mu);
    g_jobs.push_back(Job{shared, n, &fn});
    for (const auto* listener : g_listeners) (*listener)();
  }
  g_unstarted_helpers.fetch_add(static_cast<int>(helpers));
  for (int64_t h = 0; h < helpers; ++h)
    pool->Schedule([shared, n, &fn] {
      g_unstarted_helpers.fetch_sub(1);
      Drain(*shared, n, fn);
    });
  Drain(*shared, n, fn);
  {
    std::unique_lock<std::mutex> lock(shared->mu);
    shared->cv.wait(lock, [&] { return shared->done == n; });
  }
  std::lock_guard<std::mutex> lock(g_jobs_mu);
  for (size_t i = 0; i < g_jobs.size(); ++i)
    if (g_jobs[i].state == shared) {
      g_jobs.erase(g_jobs.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
}

bool HelpWanted() { return g_unstarted_helpers.load(std::memory_order_relaxed) > 0; }

bool HelpOnce() {
  Job job;
  {
    std::lock_guard<std::mutex> lock(g_jobs_mu);
    auto it = std::find_if(g_jobs.begin(), g_jobs.end(), [](const Job& j) {
      return j.state->next.load(std::memory_order_relaxed) < j.n;
    });
    if (it == g_jobs.end()) return false;
    job = *it;
  }
  // Claims pieces only while some are left: once all n are claimed `fn` is not touched, so its
  // owner may return (and unregister the job) while this thread still holds the pointer.
  Drain(*job.state, job.n, *job.fn);
  return true;
}

void AddHelpListener(const std::function<void()>* on_job) {
  std::lock_guard<std::mutex> lock(g_jobs_mu);
  g_listeners.push_back(on_job);
}

void RemoveHelpListener(const std::function<void()>* on_job) {
  std::lock_guard<std::mutex> lock(g_jobs_mu);
  g_listeners.erase(std::remove(g_listeners.begin(), g_listeners.end(), on_job), g_listeners.end());
}

void ParallelForRange(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t pieces = (n + grain - 1) / grain;
  if (pieces == 1) return fn(0, n);
  ParallelFor(pieces, [&](int64_t p) { fn(p * grain, std::min(n, (p + 1) * grain)); });
}

void BlockSignalsInThisThread() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
}

void UseOneOpenMPThread() {
  thread_local bool set = false;
  if (!set) {
    omp_set_num_threads(1);
    set = true;
  }
}

}  // namespace cpu_threads
}  // namespace keel
