// The Trainer's checkpoints: save_dir and save_every checked before the first step, periodic
// checkpoints (parameters, optimizer state and the training state: step, seed, world size) from
// rank 0, and resuming exactly where a checkpoint left off (load_dir, or save_dir when `keel
// launch --max_restarts` restarted the job or auto_resume is set): the step count, the data
// stream (replayed by the Trainer to the saved step) and the random draws (dropout's, through
// the executor's run count) continue as in an uninterrupted run, so the resumed run's losses and
// parameters equal it bit for bit. In a job, the ranks first agree on the checkpoint (the newest
// any of them can read: the folders may be each node's own) and the ranks that lack it receive
// it (trainer/resume.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "executor/executor.h"
#include "framework/io/checkpoint.h"
#include "framework/ir/program.h"
#include "trainer/resume.h"
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
  // not be continued). Once fleet is initialized, the ranks agree on the checkpoint first (so
  // every rank of a job must call it, or none).
  uint64_t Seed(uint64_t seed, const std::string& what);
  // Whether a resume is possible in this run whatever the ranks' disks hold (the same answer on
  // every rank): a restart, auto_resume or load_dir.
  bool MayResume() const;
  int64_t resume_step() const { return resume_state_ ? resume_state_->step : 0; }

  // Before the first step (after startup ran): save_dir and save_inference_dir can be written
  // and a checkpoint fits the file size limit. Rank 0 only; a keel::Error names the option.
  void CheckBeforeTraining(Executor& exe, const Program& main, bool rank0) const;

  // Loads the resume checkpoint, if any (agreeing on it first). Returns the number of steps
  // already done (0 for a fresh start); `replay(steps)` brings the data stream to that step
  // before it says so. In a job every rank calls it; a rank that fails makes every rank's call a
  // keel::Error naming it.
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
  // save_dir's checkpoint after `steps_done` steps: every rank gathers (a collective under
  // sharding and model parallelism), and the one with `write` (rank 0) writes it.
  void Write(Executor& exe, const Program& main, int64_t steps_done, bool write) const;
  // Reads this rank's checkpoint and, in a job that may resume, agrees with the other ranks on
  // the one to load (once; fleet must be initialized).
  void Agree();
  int64_t Load(Executor& exe, const Program& main, const std::function<void(int64_t)>& replay,
               bool quiet);

  const TrainerOptions& options_;
  int64_t restart_ = 0;    // KEEL_RESTART_COUNT
  std::string local_dir_;  // the folder this rank resumes from when it has a checkpoint there
  bool agreed_ = false;
  std::unique_ptr<AgreedCheckpoint> agreed_checkpoint_;  // after Agree: what this rank loads
  std::string resume_from_;  // where the loaded checkpoint came from, for messages
  std::optional<TrainingState> resume_state_;  // this rank's until Agree, then the job's
  uint64_t seed_ = 0;
  int64_t last_saved_step_ = -1;
};

}  // namespace keel
