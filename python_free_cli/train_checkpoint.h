// keel train's checkpoints: --save_dir and --save_every checked before the first step, periodic
// checkpoints (parameters, optimizer state and the training state: step, seed, world size) from
// rank 0, and resuming exactly where a checkpoint left off (--load_dir, or --save_dir when
// `keel launch --max_restarts` restarted the job): the step count, the data stream (replayed to
// the saved step) and the random draws (dropout's, through the executor's run count) continue as
// in an uninterrupted run, so the resumed run's losses and parameters equal it bit for bit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "executor/executor.h"
#include "executor/executor_io.h"
#include "framework/io/checkpoint.h"
#include "models/model_zoo.h"

namespace keel {
namespace cli {

class TrainCheckpoints {
 public:
  // Reads the flags and picks the checkpoint to resume from, if any (before the model is built:
  // a checkpoint of a run with --seed=0 records the seed it drew, which the resumed run adopts).
  TrainCheckpoints();

  // The seed to build the model with: --seed, or the resumed checkpoint's when --seed is 0.
  // A checkpoint of another seed is a keel::Error (its data stream could not be continued).
  uint64_t Seed(uint64_t flag_seed);

  // Before the first step (after startup ran): --save_dir and --save_inference_dir can be
  // written and a checkpoint fits the file size limit. Rank 0 only; a keel::Error names the flag.
  void CheckBeforeTraining(Executor& exe, const models::TrainableModel& m, bool rank0) const;

  // Loads the resume checkpoint, if any, and replays the data stream to its step. Returns the
  // number of steps already done (0 for a fresh start).
  int64_t Resume(Executor& exe, models::TrainableModel& m, int64_t batch_size, bool quiet);

  // After step `steps_done` (counting from 1): a checkpoint every --save_every steps (rank 0).
  void AfterStep(Executor& exe, const models::TrainableModel& m, int64_t steps_done, bool rank0,
                 bool quiet);
  // After training: the final checkpoint to --save_dir (rank 0), if --save_dir is set.
  void SaveFinal(Executor& exe, const models::TrainableModel& m, int64_t steps_done, bool rank0,
                 bool quiet);

 private:
  TrainingState State(int64_t steps_done) const;

  std::string resume_dir_;  // "" : fresh start
  std::optional<TrainingState> resume_state_;
  uint64_t seed_ = 0;
  int64_t last_saved_step_ = -1;
};

}  // namespace cli
}  // namespace keel
