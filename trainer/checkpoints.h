// The Trainer's checkpoints: save_dir and save_every checked before the first step, periodic
// checkpoints (parameters, optimizer state and the training state: step, seed, world size) from
// rank 0, and resuming exactly where a checkpoint left off (load_dir, or save_dir when `keel
// launch --max_restarts` restarted the job or auto_resume is set): the step count, the data
// stream (replayed by the Trainer to the saved step) and the random draws (dropout's, through
// the executor's run count) continue as in an uninterrupted run, so the resumed run's losses and
// parameters equal it bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "executor/executor.h"
#include "framework/io/checkpoint.h"
#include "framework/ir/program.h"
#include "trainer/trainer.h"

namespace keel {

class TrainerCheckpoints {
 public:
  // Checks the checkpoint options and picks the checkpoint to resume from, if any (before the
  // model is built: a checkpoint records the seed it was trained with, which a run without one
  // adopts). A keel::Error names the option.
  explicit TrainerCheckpoints(const TrainerOptions& options);

  // Resolves the seed: `seed` (from `what`, e.g. "--seed=5") when nonzero, else the resumed
  // checkpoint's. A checkpoint of another nonzero seed is a keel::Error (its data stream could
  // not be continued).
  uint64_t Seed(uint64_t seed, const std::string& what);
  // Whether a resume is possible in this run whatever the ranks' disks hold (the same answer on
  // every rank): a restart, auto_resume or load_dir.
  bool MayResume() const;
  int64_t resume_step() const { return resume_state_ ? resume_state_->step : 0; }

  // Before the first step (after startup ran): save_dir and save_inference_dir can be written
  // and a checkpoint fits the file size limit. Rank 0 only; a keel::Error names the option.
  void CheckBeforeTraining(Executor& exe, const Program& main, bool rank0) const;

  // Loads the resume checkpoint, if any. Returns the number of steps already done (0 for a fresh
  // start); `replay(steps)` brings the data stream to that step before it says so.
  int64_t Resume(Executor& exe, const Program& main, const std::function<void(int64_t)>& replay,
                 bool quiet);

  // After step `steps_done` (counting from 1): a checkpoint every save_every steps (rank 0).
  // Returns whether this step is a checkpoint's.
  bool AfterStep(Executor& exe, const Program& main, int64_t steps_done, bool rank0, bool quiet);
  // After training: the final checkpoint to save_dir (rank 0), when save_dir is set. Returns
  // whether save_dir is set.
  bool SaveFinal(Executor& exe, const Program& main, int64_t steps_done, bool rank0, bool quiet);

 private:
  std::string Opt(const std::string& field) const { return options_.option_prefix + field; }
  TrainingState State(int64_t steps_done) const;

  const TrainerOptions& options_;
  int64_t restart_ = 0;     // KEEL_RESTART_COUNT
  std::string resume_dir_;  // "" : fresh start
  std::optional<TrainingState> resume_state_;
  uint64_t seed_ = 0;
  int64_t last_saved_step_ = -1;
};

}  // namespace keel
