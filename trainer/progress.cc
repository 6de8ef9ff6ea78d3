#include "trainer/progress.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

namespace keel {

namespace {

std::string Clock(double seconds) {
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

}  // namespace

TrainProgress::TrainProgress(const TrainerOptions& options) : options_(options) {
  const std::string& mode = options.progress;
  const std::string& p = options.option_prefix;
  KEEL_ENFORCE(mode == "auto" || mode == "bar" || mode == "lines" || mode == "none", p,
               "progress='", mode, "' is not one of auto, bar, lines, none");
  bar_ = mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO));
  lines_ = mode != "none";
  KEEL_ENFORCE(!options.logdir_all_ranks || !options.logdir.empty(), p, "logdir_all_ranks needs ",
               p, "logdir");
  if (!options.logdir.empty()) {
    // A folder that cannot be made (a mistyped path) is an error now; writing into it later is
    // a convenience that warns and stops when it fails (LoggingFailed).
    std::error_code ec;
    std::filesystem::create_directories(options.logdir, ec);
    KEEL_ENFORCE(std::filesystem::is_directory(options.logdir), p, "logdir=", options.logdir,
                 ": not a directory and cannot be made one",
                 ec ? ": " + ec.message() : std::string());
  }
}

TrainProgress::~TrainProgress() { EndBarLine(); }

void TrainProgress::Begin(int64_t total_steps, int64_t samples_per_step, int rank, bool quiet) {
  total_steps_ = total_steps;
  samples_per_step_ = samples_per_step;
  quiet_ = quiet;
  if (!options_.logdir.empty()) {
    try {
      if (options_.logdir_all_ranks)
        tb_ = std::make_unique<SummaryWriter>(options_.logdir + "/rank_" + std::to_string(rank));
      else if (rank == 0)
        tb_ = std::make_unique<SummaryWriter>(options_.logdir);
    } catch (const Error& e) {
      LoggingFailed(e);
    }
  }
  start_ = last_ = std::chrono::steady_clock::now();
}

// TensorBoard is a convenience: a log disk that is full, read-only or over the file size limit
// stops the logging, with one warning, and training goes on (its checkpoints may still be
// writable elsewhere; under --max_restarts an error here would fail every restart alike).
void TrainProgress::LoggingFailed(const Error& e) {
  tb_.reset();
  std::fprintf(
      stderr, "%s: warning: %slogdir=%s: %s; TensorBoard logging stops here, training goes on\n",
      options_.name.c_str(), options_.option_prefix.c_str(), options_.logdir.c_str(), e.what());
}

void TrainProgress::Scalar(const std::string& tag, double value, int64_t step) {
  if (!tb_) return;
  try {
    tb_->AddScalar(tag, value, step);
  } catch (const Error& e) {
    LoggingFailed(e);
  }
}

std::string TrainProgress::Eta(int64_t steps_done) const {
  if (total_steps_ <= 0 || steps_done <= 0) return "";
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return Clock(elapsed / steps_done * static_cast<double>(total_steps_ - steps_done));
}

void TrainProgress::OnStep(int64_t step, const StepInfo& info) {
  const std::optional<float>&loss = info.loss, &lr = info.learning_rate;
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
  if (info.loss_scale) Scalar("amp/loss_scale", *info.loss_scale, step);
  if (info.skipped_steps)
    Scalar("amp/skipped_steps", static_cast<double>(*info.skipped_steps), step);
  if (quiet_ || !lines_) return;
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

void TrainProgress::OnEval(int64_t step, int epoch,
                           const std::vector<std::pair<std::string, double>>& metrics,
                           int64_t samples) {
  for (const auto& [name, value] : metrics) Scalar("eval/" + name, value, step);
  if (quiet_) return;
  EndBarLine();
  std::string line = epoch >= 0 ? "epoch " + std::to_string(epoch)
                                : "step " + std::to_string(static_cast<long long>(step));
  for (const auto& [name, value] : metrics) {
    char v[64];
    std::snprintf(v, sizeof(v), "%.4f", value);
    line += " test_" + name + " " + v;
  }
  if (samples >= 0) line += " (" + std::to_string(samples) + " test samples)";
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void TrainProgress::EndBarLine() {
  if (!bar_open_) return;
  std::printf("\n");
  std::fflush(stdout);
  bar_open_ = false;
}

void TrainProgress::Finish() {
  EndBarLine();
  if (!tb_) return;
  try {
    tb_->Flush();
  } catch (const Error& e) {
    LoggingFailed(e);
  }
}

}  // namespace keel
