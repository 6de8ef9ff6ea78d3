#include "python_free_cli/train_monitor.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "framework/error.h"

DEFINE_string(progress, "auto",
              "bar (redrawn in place) | lines (one per fetched step) | auto: a bar on a "
              "terminal, else lines.");
DEFINE_string(logdir, "",
              "Write TensorBoard event files here: loss, learning rate, samples/s, step time, "
              "eval accuracy.");
DEFINE_bool(logdir_all_ranks, false,
            "With --logdir: every worker writes its own DIR/rank_N (default: rank 0 writes DIR).");
DEFINE_int32(eval_every, 0,
             "Evaluate on the test data every this many steps (and at the end); 0: only after "
             "each epoch with --epochs.");

namespace keel {
namespace cli {

namespace {

std::string Clock(double seconds) {
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

}  // namespace

TrainMonitor::TrainMonitor(int64_t total_steps, int64_t samples_per_step, int rank, bool quiet)
    : total_steps_(total_steps), samples_per_step_(samples_per_step), quiet_(quiet) {
  const std::string& mode = FLAGS_progress;
  KEEL_ENFORCE(mode == "auto" || mode == "bar" || mode == "lines", "--progress='", mode,
               "' is not one of auto, bar, lines");
  bar_ = mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO));
  KEEL_ENFORCE(!FLAGS_logdir_all_ranks || !FLAGS_logdir.empty(),
               "--logdir_all_ranks needs --logdir");
  if (!FLAGS_logdir.empty()) {
    // A folder that cannot be made (a mistyped path) is an error now; writing into it later is
    // a convenience that warns and stops when it fails (LoggingFailed).
    std::error_code ec;
    std::filesystem::create_directories(FLAGS_logdir, ec);
    KEEL_ENFORCE(std::filesystem::is_directory(FLAGS_logdir), "--logdir=", FLAGS_logdir,
                 ": not a directory and cannot be made one",
                 ec ? ": " + ec.message() : std::string());
    try {
      if (FLAGS_logdir_all_ranks)
        tb_ = std::make_unique<SummaryWriter>(FLAGS_logdir + "/rank_" + std::to_string(rank));
      else if (rank == 0)
        tb_ = std::make_unique<SummaryWriter>(FLAGS_logdir);
    } catch (const Error& e) {
      LoggingFailed(e);
    }
  }
  start_ = last_ = std::chrono::steady_clock::now();
}

TrainMonitor::~TrainMonitor() { EndBarLine(); }

// TensorBoard is a convenience: a log disk that is full, read-only or over the file size limit
// stops the logging, with one warning, and training goes on (its checkpoints may still be
// writable elsewhere; under --max_restarts an error here would fail every restart alike).
void TrainMonitor::LoggingFailed(const Error& e) {
  tb_.reset();
  std::fprintf(stderr,
               "keel train: warning: --logdir=%s: %s; TensorBoard logging stops here, "
               "training goes on\n",
               FLAGS_logdir.c_str(), e.what());
}

void TrainMonitor::Scalar(const std::string& tag, double value, int64_t step) {
  if (!tb_) return;
  try {
    tb_->AddScalar(tag, value, step);
  } catch (const Error& e) {
    LoggingFailed(e);
  }
}

std::string TrainMonitor::Eta(int64_t steps_done) const {
  if (total_steps_ <= 0 || steps_done <= 0) return "";
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return Clock(elapsed / steps_done * static_cast<double>(total_steps_ - steps_done));
}

void TrainMonitor::OnStep(int64_t step, std::optional<float> loss, std::optional<float> lr) {
  if (!loss) return;
  auto now = std::chrono::steady_clock::now();
  const int64_t steps = step - last_step_;
  const double s = std::chrono::duration<double>(now - last_).count();
  const double samples_per_s = s > 0 ? static_cast<double>(steps * samples_per_step_) / s : 0.0;
  const double step_ms = steps > 0 ? 1000.0 * s / static_cast<double>(steps) : 0.0;
  last_ = now;
  last_step_ = step;
  Scalar("train/loss", *loss, step);
  if (lr) Scalar("train/learning_rate", *lr, step);
  Scalar("train/samples_per_sec", samples_per_s, step);
  Scalar("train/step_time_ms", step_ms, step);
  if (quiet_) return;
  const std::string eta = Eta(step + 1);
  if (bar_) {
    std::string line;
    if (total_steps_ > 0) {
      const int width = 24;
      const double frac = static_cast<double>(step + 1) / static_cast<double>(total_steps_);
      const int fill = static_cast<int>(frac * width);
      char head[64];
      std::snprintf(head, sizeof(head), "%3d%% [", static_cast<int>(frac * 100));
      line = head + std::string(fill, '#') + std::string(width - fill, ' ') + "] ";
      line += std::to_string(step + 1) + "/" + std::to_string(total_steps_);
    } else {
      line = "step " + std::to_string(step);
    }
    char tail[160];
    std::snprintf(tail, sizeof(tail), " loss %.4f %.1f samples/s%s%s", *loss, samples_per_s,
                  eta.empty() ? "" : " eta ", eta.c_str());
    std::printf("\r%s%s\033[K", line.c_str(), tail);
    bar_open_ = true;
  } else {
    std::printf("step %lld loss %.6f samples/s %.1f step_ms %.2f", static_cast<long long>(step),
                *loss, samples_per_s, step_ms);
    if (lr) std::printf(" lr %.6g", *lr);
    if (!eta.empty()) std::printf(" eta %s", eta.c_str());
    std::printf("\n");
  }
  std::fflush(stdout);
}

void TrainMonitor::OnEval(int64_t step, int epoch, double accuracy, int64_t samples) {
  Scalar("eval/accuracy", accuracy, step);
  if (quiet_) return;
  EndBarLine();
  const std::string count =
      samples >= 0 ? " (" + std::to_string(samples) + " test samples)" : std::string();
  if (epoch >= 0)
    std::printf("epoch %d test_accuracy %.4f%s\n", epoch, accuracy, count.c_str());
  else
    std::printf("step %lld test_accuracy %.4f%s\n", static_cast<long long>(step), accuracy,
                count.c_str());
  std::fflush(stdout);
}

void TrainMonitor::EndBarLine() {
  if (!bar_open_) return;
  std::printf("\n");
  std::fflush(stdout);
  bar_open_ = false;
}

void TrainMonitor::Finish() {
  EndBarLine();
  if (!tb_) return;
  try {
    tb_->Flush();
  } catch (const Error& e) {
    LoggingFailed(e);
  }
}

}  // namespace cli
}  // namespace keel
