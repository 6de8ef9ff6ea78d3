#include "python_free_cli/train_checkpoint.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>
#include <cstdlib>

#include "fleet/fleet.h"
#include "framework/comm/store.h"
#include "framework/error.h"
#include "framework/io/atomic_file.h"
#include "transpiler/local_sgd_pass.h"

DECLARE_string(save_dir);
DECLARE_string(save_inference_dir);
DECLARE_string(load_dir);
DEFINE_int32(save_every, 0,
             "Also save a checkpoint to --save_dir every this many steps (parameters, optimizer "
             "state, step, data position, RNG); with keel launch --max_restarts a restarted job "
             "resumes from the last one. 0: only after training.");

DEFINE_bool(auto_resume, false,
            "Resume from --save_dir's checkpoint when it holds one: for schedulers that restart or "
            "requeue a job (Kubernetes, Slurm). Restarts by keel launch --max_restarts always do.");

namespace keel {
namespace cli {

TrainCheckpoints::TrainCheckpoints() {
  KEEL_ENFORCE(FLAGS_save_every >= 0, "--save_every must be >= 0, got ", FLAGS_save_every);
  KEEL_ENFORCE(FLAGS_save_every == 0 || !FLAGS_save_dir.empty(), "--save_every=", FLAGS_save_every,
               " needs --save_dir (where the checkpoints go)");
  KEEL_ENFORCE(!FLAGS_auto_resume || !FLAGS_save_dir.empty(),
               "--auto_resume needs --save_dir (where it looks for a checkpoint)");
  const int64_t restart = RestartGenerationFromEnvironment();
  // A restarted job continues from its own latest checkpoint; a first run from --load_dir.
  if ((restart > 0 || FLAGS_auto_resume) && !FLAGS_save_dir.empty() &&
      HasCheckpoint(FLAGS_save_dir)) {
    resume_dir_ = FLAGS_save_dir;
  } else if (!FLAGS_load_dir.empty()) {
    KEEL_ENFORCE(HasCheckpoint(FLAGS_load_dir), "--load_dir=", FLAGS_load_dir, ": no ",
                 kPersistablesFile, " there");
    resume_dir_ = FLAGS_load_dir;
  } else if (restart > 0) {
    LOG(WARNING) << "restart " << restart << " (KEEL_RESTART_COUNT) but "
                 << (FLAGS_save_dir.empty() ? std::string("no --save_dir")
                                            : "no checkpoint in --save_dir=" + FLAGS_save_dir)
                 << ": training starts over from step 0";
  }
  if (!resume_dir_.empty()) resume_state_ = ReadTrainingState(resume_dir_);
}

uint64_t TrainCheckpoints::Seed(uint64_t flag_seed) {
  seed_ = flag_seed;
  if (!resume_state_ || resume_state_->seed == 0) return seed_;
  if (flag_seed == 0) return seed_ = resume_state_->seed;
  KEEL_ENFORCE(flag_seed == resume_state_->seed, "--seed=", flag_seed, " but the checkpoint in ",
               resume_dir_, " was trained with --seed=", resume_state_->seed,
               "; resuming continues its data order and random draws, so give the same seed "
               "(or none)");
  return flag_seed;
}

void TrainCheckpoints::CheckBeforeTraining(Executor& exe, const models::TrainableModel& m,
                                           bool rank0) const {
  if (!rank0) return;
  // A checkpoint is about the size of the persistables, plus its JSON header.
  uint64_t bytes = 4096;
  for (const VarDesc* v : m.main->global_block().AllVars()) {
    if (!v->persistable()) continue;
    const Variable* var = exe.scope().FindVar(v->name());
    if (var && var->tensor().initialized()) bytes += var->tensor().nbytes() + 256;
  }
  if (!FLAGS_save_dir.empty()) CheckCanWrite(FLAGS_save_dir, bytes, "--save_dir");
  if (!FLAGS_save_inference_dir.empty())
    CheckCanWrite(FLAGS_save_inference_dir, bytes, "--save_inference_dir");
}

int64_t TrainCheckpoints::Resume(Executor& exe, models::TrainableModel& m, int64_t batch_size,
                                 bool quiet) {
  if (resume_dir_.empty()) return 0;
  std::optional<TrainingState> st =
      load_checkpoint(exe, resume_dir_, *m.main, fleet::pass_made_vars(*m.main));
  try {
    fleet::rebuild_pass_made_vars(exe, *m.main, st ? st->step : -1);
  } catch (const Error& e) {
    KEEL_THROW("resuming from ", resume_dir_, ": ", e.what());
  }
  if (!st) {
    if (!quiet)
      std::printf("resumed parameters from %s (no training state: starting at step 0)\n",
                  resume_dir_.c_str());
    return 0;
  }
  if (st->world_size != fleet::worker_num())
    LOG(WARNING) << resume_dir_ << " was saved by " << st->world_size << " worker(s), this job has "
                 << fleet::worker_num() << ": the data shards differ from the saved run's";
  if (st->seed == 0)
    LOG(WARNING) << resume_dir_ << " was trained with --seed=0: the resumed data order and "
                 << "dropout draws differ from the interrupted run's (pass --seed for an exact "
                 << "resume)";
  // The data stream continues where the checkpoint was taken: replay it to that step.
  FeedMap skipped;
  for (int64_t i = 0; i < st->step; ++i) m.next_batch(batch_size, &skipped);
  if (resume_dir_ == FLAGS_save_dir) last_saved_step_ = st->step;
  if (!quiet) {
    std::printf("resumed from %s at step %lld\n", resume_dir_.c_str(),
                static_cast<long long>(st->step));
    std::fflush(stdout);
  }
  return st->step;
}

TrainingState TrainCheckpoints::State(int64_t steps_done) const {
  TrainingState st;
  st.step = steps_done;
  st.seed = seed_;
  st.world_size = fleet::worker_num();
  return st;
}

void TrainCheckpoints::AfterStep(Executor& exe, const models::TrainableModel& m, int64_t steps_done,
                                 bool rank0, bool quiet) {
  if (FLAGS_save_every <= 0 || steps_done % FLAGS_save_every != 0) return;
  // Rank 0 alone writes, without a barrier: its scope is its own, and in synchronous training
  // every rank holds the same values after the step. A rank killed mid-save leaves the previous
  // checkpoint in place (the file is replaced atomically).
  if (rank0)
    save_checkpoint(exe.scope(), FLAGS_save_dir, *m.main, State(steps_done),
                    fleet::pass_made_vars(*m.main));
  last_saved_step_ = steps_done;
  if (!quiet) {
    std::printf("checkpoint at step %lld in %s\n", static_cast<long long>(steps_done),
                FLAGS_save_dir.c_str());
    std::fflush(stdout);
  }
}

void TrainCheckpoints::SaveFinal(Executor& exe, const models::TrainableModel& m, int64_t steps_done,
                                 bool rank0, bool quiet) {
  if (FLAGS_save_dir.empty()) return;
  if (rank0 && last_saved_step_ != steps_done &&
      transpiler::LocalSGDBetweenAverages(exe.scope(), steps_done))
    std::fprintf(stderr,
                 "keel train: warning: step %lld falls between two LocalSGD averages, so the final "
                 "checkpoint holds rank 0's own parameters: it serves evaluation and inference, "
                 "and resuming training from it is refused\n",
                 static_cast<long long>(steps_done));
  if (rank0 && last_saved_step_ != steps_done)
    save_checkpoint(exe.scope(), FLAGS_save_dir, *m.main, State(steps_done),
                    fleet::pass_made_vars(*m.main));
  if (!quiet)
    std::printf("saved persistables to %s/%s\n", FLAGS_save_dir.c_str(), kPersistablesFile.c_str());
}

}  // namespace cli
}  // namespace keel
