#include "trainer/checkpoints.h"

#include <glog/logging.h>

#include <cstdio>

#include "executor/executor_io.h"
#include "fleet/fleet.h"
#include "framework/comm/store.h"
#include "framework/error.h"
#include "framework/io/atomic_file.h"
#include "transpiler/local_sgd_pass.h"

namespace keel {

TrainerCheckpoints::TrainerCheckpoints(const TrainerOptions& options) : options_(options) {
  const TrainerOptions& o = options;
  KEEL_ENFORCE(o.save_every >= 0, Opt("save_every"), " must be >= 0, got ", o.save_every);
  KEEL_ENFORCE(o.save_every == 0 || !o.save_dir.empty(), Opt("save_every"), "=", o.save_every,
               " needs ", Opt("save_dir"), " (where the checkpoints go)");
  KEEL_ENFORCE(!o.auto_resume || !o.save_dir.empty(), Opt("auto_resume"), " needs ",
               Opt("save_dir"), " (where it looks for a checkpoint)");
  restart_ = RestartGenerationFromEnvironment();
  // A restarted job continues from its own latest checkpoint; a first run from load_dir.
  if ((restart_ > 0 || o.auto_resume) && !o.save_dir.empty() && HasCheckpoint(o.save_dir)) {
    resume_dir_ = o.save_dir;
  } else if (!o.load_dir.empty()) {
    KEEL_ENFORCE(HasCheckpoint(o.load_dir), Opt("load_dir"), "=", o.load_dir, ": no ",
                 kPersistablesFile, " there");
    resume_dir_ = o.load_dir;
  } else if (restart_ > 0) {
    LOG(WARNING) << "restart " << restart_ << " (KEEL_RESTART_COUNT) but "
                 << (o.save_dir.empty() ? "no " + Opt("save_dir")
                                        : "no checkpoint in " + Opt("save_dir") + "=" + o.save_dir)
                 << ": training starts over from step 0";
  }
  if (!resume_dir_.empty()) resume_state_ = ReadTrainingState(resume_dir_);
}

bool TrainerCheckpoints::MayResume() const {
  return restart_ > 0 || options_.auto_resume || !options_.load_dir.empty();
}

uint64_t TrainerCheckpoints::Seed(uint64_t seed, const std::string& what) {
  seed_ = seed;
  if (!resume_state_ || resume_state_->seed == 0) return seed_;
  if (seed == 0) return seed_ = resume_state_->seed;
  KEEL_ENFORCE(seed == resume_state_->seed, what, " but the checkpoint in ", resume_dir_,
               " was trained with ", Opt("seed"), "=", resume_state_->seed,
               "; resuming continues its data order and random draws, so give the same seed "
               "(or none)");
  return seed;
}

void TrainerCheckpoints::CheckBeforeTraining(Executor& exe, const Program& main, bool rank0) const {
  if (!rank0) return;
  // A checkpoint is about the size of the persistables, plus its JSON header.
  uint64_t bytes = 4096;
  for (const VarDesc* v : main.global_block().AllVars()) {
    if (!v->persistable()) continue;
    const Variable* var = exe.scope().FindVar(v->name());
    if (var && var->tensor().initialized()) bytes += var->tensor().nbytes() + 256;
  }
  if (!options_.save_dir.empty()) CheckCanWrite(options_.save_dir, bytes, Opt("save_dir"));
  if (!options_.save_inference_dir.empty())
    CheckCanWrite(options_.save_inference_dir, bytes, Opt("save_inference_dir"));
}

int64_t TrainerCheckpoints::Resume(Executor& exe, const Program& main,
                                   const std::function<void(int64_t)>& replay, bool quiet) {
  if (resume_dir_.empty()) return 0;
  std::optional<TrainingState> st =
      load_checkpoint(exe, resume_dir_, main, fleet::pass_made_vars(main));
  try {
    fleet::rebuild_pass_made_vars(exe, main, st ? st->step : -1);
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
    LOG(WARNING) << resume_dir_ << " was trained with " << Opt("seed")
                 << "=0: the resumed data order and "
                 << "dropout draws differ from the interrupted run's (pass " << Opt("seed")
                 << " for an exact resume)";
  // The data stream continues where the checkpoint was taken.
  replay(st->step);
  if (resume_dir_ == options_.save_dir) last_saved_step_ = st->step;
  if (!quiet) {
    std::printf("resumed from %s at step %lld\n", resume_dir_.c_str(),
                static_cast<long long>(st->step));
    std::fflush(stdout);
  }
  return st->step;
}

TrainingState TrainerCheckpoints::State(int64_t steps_done) const {
  TrainingState st;
  st.step = steps_done;
  st.seed = seed_;
  st.world_size = fleet::worker_num();
  return st;
}

bool TrainerCheckpoints::AfterStep(Executor& exe, const Program& main, int64_t steps_done,
                                   bool rank0, bool quiet) {
  if (options_.save_every <= 0 || steps_done % options_.save_every != 0) return false;
  // Rank 0 alone writes, without a barrier: its scope is its own, and in synchronous training
  // every rank holds the same values after the step. A rank killed mid-save leaves the previous
  // checkpoint in place (the file is replaced atomically).
  if (rank0)
    save_checkpoint(exe.scope(), options_.save_dir, main, State(steps_done),
                    fleet::pass_made_vars(main));
  last_saved_step_ = steps_done;
  if (!quiet) {
    std::printf("checkpoint at step %lld in %s\n", static_cast<long long>(steps_done),
                options_.save_dir.c_str());
    std::fflush(stdout);
  }
  return true;
}

bool TrainerCheckpoints::SaveFinal(Executor& exe, const Program& main, int64_t steps_done,
                                   bool rank0, bool quiet) {
  if (options_.save_dir.empty()) return false;
  if (rank0 && last_saved_step_ != steps_done &&
      transpiler::LocalSGDBetweenAverages(exe.scope(), steps_done))
    std::fprintf(stderr,
                 "%s: warning: step %lld falls between two LocalSGD averages, so the final "
                 "checkpoint holds rank 0's own parameters: it serves evaluation and inference, "
                 "and resuming training from it is refused\n",
                 options_.name.c_str(), static_cast<long long>(steps_done));
  if (rank0 && last_saved_step_ != steps_done)
    save_checkpoint(exe.scope(), options_.save_dir, main, State(steps_done),
                    fleet::pass_made_vars(main));
  if (!quiet)
    std::printf("saved persistables to %s/%s\n", options_.save_dir.c_str(),
                kPersistablesFile.c_str());
  return true;
}

}  // namespace keel
