// TrainMonitor: what `keel train` shows and records while it trains. On stdout, a progress bar
// redrawn in place when stdout is a terminal, else one plain line per fetched step:
//   step 40 loss 0.612345 samples/s 5120.3 step_ms 25.0 lr 0.01 eta 0:01:13
// (--progress=auto|bar|lines). With --logdir, TensorBoard scalars train/loss,
// train/learning_rate, train/samples_per_sec, train/step_time_ms and eval/accuracy, from rank 0
// or, with --logdir_all_ranks, from every rank into DIR/rank_N.
#pragma once

#include <gflags/gflags.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "framework/error.h"
#include "framework/summary/summary_writer.h"

DECLARE_int32(eval_every);
DECLARE_string(logdir);
DECLARE_bool(logdir_all_ranks);

namespace keel {
namespace cli {

class TrainMonitor {
 public:
  // total_steps: the run's length (0: unknown, no ETA); samples_per_step: of all workers;
  // quiet: this rank prints nothing (it may still write its own TensorBoard folder).
  TrainMonitor(int64_t total_steps, int64_t samples_per_step, int rank, bool quiet);
  ~TrainMonitor();

  // After each step; `loss` and `lr` when they were fetched this step.
  void OnStep(int64_t step, std::optional<float> loss, std::optional<float> lr);
  // After an evaluation at `step` (epoch >= 0 after an epoch's end, -1 from --eval_every).
  void OnEval(int64_t step, int epoch, double accuracy, int64_t samples = -1);
  // Ends the bar's line; flushes TensorBoard.
  void Finish();

 private:
  void EndBarLine();
  // One scalar to TensorBoard; a failed write turns the logging off (LoggingFailed).
  void Scalar(const std::string& tag, double value, int64_t step);
  void LoggingFailed(const Error& e);
  std::string Eta(int64_t steps_done) const;

  int64_t total_steps_, samples_per_step_;
  bool quiet_, bar_;
  bool bar_open_ = false;
  std::unique_ptr<SummaryWriter> tb_;
  std::chrono::steady_clock::time_point start_, last_;
  int64_t last_step_ = -1;
};

}  // namespace cli
}  // namespace keel
