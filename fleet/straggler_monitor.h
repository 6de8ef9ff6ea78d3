// StragglerMonitor: names a rank that falls behind the others, with how far, before any timeout.
//
// In synchronous data parallelism every rank waits in each all-reduce for the slowest, so a slow
// rank shows up as the one whose compute time per step (step time minus time inside
// collectives) is high while the others' time inside collectives grows by as much. Each rank's
// monitor thread posts its mean compute time per step, its step count and how long ago it last
// finished a step to the store every --straggler_report_interval_s seconds (one small SET; no
// collective, nothing on the training thread but two clock reads per step). Rank 0's thread
// compares them and logs, by rank:
//   straggler: rank 1 computes 1.8 ms per step, the median rank 0.8 ms (2.1x): 0.9 ms per step
//     behind; the other ranks wait for it in every all-reduce
//   straggler: rank R has not reported for S s (stopped or hung?); its last report: step N, the
//     others wait for it in their collectives
//   straggler: rank R has finished no step for S s (hung?), after N step(s): it is in no
//     collective, while rank(s) 0, 2 wait for it in theirs
// The last one is a rank whose process lives (its monitor thread reports) but whose training
// thread finishes no step, outside any collective, for three intervals and ten of its usual
// steps, while other ranks wait inside a collective: a hang, not a slow rank (a slow rank still
// finishes steps). Each rank's report says how much of its current step it has spent inside
// collectives (RingRegistry::InFlightNs counts the one still running).
// Logged when a rank becomes a straggler and then at most once per 30 s while it lasts; a rank
// back in line is logged once.
//
//   fleet::StragglerMonitor monitor;   // after fleet::init (does nothing for one worker)
//   for (...) { exe.Run(...); monitor.StepDone(); }
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

namespace keel {
class StoreClient;
namespace fleet {

class StragglerMonitor {
 public:
  StragglerMonitor();
  ~StragglerMonitor();
  StragglerMonitor(const StragglerMonitor&) = delete;
  StragglerMonitor& operator=(const StragglerMonitor&) = delete;

  // After each training step (on the training thread).
  void StepDone();
  bool active() const { return thread_.joinable(); }

 private:
  void Loop();

  std::thread thread_;
  StoreClient* store_ = nullptr;  // the thread's connection (under mu_), aborted on destruction
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  // Written by StepDone, read by the thread (under mu_).
  int64_t steps_ = 0;
  double window_compute_s_ = 0, window_wall_s_ = 0;
  int64_t window_steps_ = 0;
  std::chrono::steady_clock::time_point last_step_end_;
  int64_t last_comm_ns_ = 0;
};

}  // namespace fleet
}  // namespace keel
