// TrainProgress: what the Trainer shows and records while it trains. On stdout, a progress bar
// redrawn in place when stdout is a terminal, else one plain line per fetched step:
//   step 40 loss 0.612345 samples/s 5120.3 step_ms 25.00 lr 0.01 eta 0:01:13
// (TrainerOptions::progress = auto | bar | lines | none), and a line per evaluation:
//   step 99 test_accuracy 0.9120 (2000 test samples)
// With a logdir, TensorBoard scalars train/loss, train/learning_rate, train/samples_per_sec,
// train/step_time_ms, with loss scaling amp/loss_scale and amp/skipped_steps, and eval/<metric>,
// from rank 0 or, with logdir_all_ranks, from every rank
// into DIR/rank_N. A log that cannot be written warns once and stops; training goes on.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/error.h"
#include "framework/summary/summary_writer.h"
#include "trainer/trainer.h"

namespace keel {

class TrainProgress {
 public:
  // Checks options.progress, logdir_all_ranks and that logdir can be made (a keel::Error names
  // the option). Writes nothing yet.
  explicit TrainProgress(const TrainerOptions& options);
  ~TrainProgress();

  // Before the first step: total_steps is the run's length (0: unknown, no ETA);
  // samples_per_step counts all workers (0: unknown until set_samples_per_step); quiet: this rank
  // prints nothing (it may still write its own TensorBoard folder).
  void Begin(int64_t total_steps, int64_t samples_per_step, int rank, bool quiet);
  void set_samples_per_step(int64_t n) { samples_per_step_ = n; }

  // After each step; its loss, rate and loss scaling when they were fetched this step.
  void OnStep(int64_t step, const StepInfo& info);
  // After an evaluation at `step` (epoch >= 0 after an epoch's end, -1 from eval_every).
  void OnEval(int64_t step, int epoch, const std::vector<std::pair<std::string, double>>& metrics,
              int64_t samples = -1);
  // Ends the bar's line; flushes TensorBoard.
  void Finish();

 private:
  void EndBarLine();
  // One scalar to TensorBoard; a failed write turns the logging off (LoggingFailed).
  void Scalar(const std::string& tag, double value, int64_t step);
  void LoggingFailed(const Error& e);
  std::string Eta(int64_t steps_done) const;

  const TrainerOptions& options_;
  int64_t total_steps_ = 0, samples_per_step_ = 0;
  bool quiet_ = false, bar_ = false, lines_ = true;
  bool bar_open_ = false;
  std::unique_ptr<SummaryWriter> tb_;
  std::chrono::steady_clock::time_point start_, last_;
  int64_t last_step_ = -1;
};

}  // namespace keel
