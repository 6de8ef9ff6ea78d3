#include "trainer/checkpoints.h"

#include <glog/logging.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "executor/executor_io.h"
#include "fleet/fleet.h"
#include "fleet/model_parallel_checkpoint.h"
#include "fleet/ps_checkpoint.h"
#include "fleet/role_maker.h"
#include "framework/base/strings.h"
#include "framework/comm/store.h"
#include "framework/error.h"
#include "framework/io/atomic_file.h"
#include "transpiler/local_sgd_pass.h"

namespace keel {

namespace {

// The workers of this job: fleet's when it is initialized, else what the environment says (one
// when it says nothing usable; fleet::init names the problem then).
int WorkersOfThisJob() {
  if (fleet::initialized()) return fleet::worker_num();
  try {
    return fleet::CloudRoleMaker(true).Generate().world_size;
  } catch (const Error&) {
    return 1;
  }
}

bool ParameterServerJob() { return fleet::initialized() && fleet::role().is_ps(); }

// A parameter-server trainer's parameters as it received them from the servers (its startup).
std::vector<std::pair<std::string, Tensor>> ReceivedParameters(Executor& exe, const Program& main) {
  std::vector<std::pair<std::string, Tensor>> out;
  if (!ParameterServerJob()) return out;
  const Program* original = fleet::ps_single_device_program(main);
  if (!original) return out;
  for (const VarDesc* v : original->global_block().AllVars()) {
    if (!v->is_parameter()) continue;
    const Variable* var = exe.scope().FindVar(v->name());
    if (var && var->tensor().initialized())
      out.emplace_back(v->name(), var->tensor().Clone(CPUPlace()));
  }
  return out;
}

}  // namespace

TrainerCheckpoints::TrainerCheckpoints(const TrainerOptions& options) : options_(options) {
  const TrainerOptions& o = options;
  KEEL_ENFORCE(o.save_every >= 0, Opt("save_every"), " must be >= 0, got ", o.save_every);
  KEEL_ENFORCE(o.save_every == 0 || !o.save_dir.empty(), Opt("save_every"), "=", o.save_every,
               " needs ", Opt("save_dir"), " (where the checkpoints go)");
  KEEL_ENFORCE(!o.auto_resume || !o.save_dir.empty(), Opt("auto_resume"), " needs ",
               Opt("save_dir"), " (where it looks for a checkpoint)");
  restart_ = RestartGenerationFromEnvironment();
  // A restarted job continues from its own latest checkpoint; a first run from load_dir.
  if ((restart_ > 0 || o.auto_resume) && !o.save_dir.empty() && HasCheckpoint(o.save_dir))
    local_dir_ = o.save_dir;
  else if (!o.load_dir.empty())
    local_dir_ = o.load_dir;
  // Alone, a missing or unreadable checkpoint is an error now. In a job, another rank may have
  // the checkpoint (each node's folder is its own) and send it: the ranks agree before training.
  const bool alone = WorkersOfThisJob() == 1;
  if (alone && !o.load_dir.empty() && local_dir_ == o.load_dir)
    KEEL_ENFORCE(HasCheckpoint(o.load_dir), Opt("load_dir"), "=", o.load_dir, ": no ",
                 kPersistablesFile, " there");
  if (local_dir_.empty()) return;
  try {
    resume_state_ = ReadTrainingState(local_dir_);
  } catch (const Error&) {
    if (alone) throw;
  }
}

bool TrainerCheckpoints::MayResume() const {
  return restart_ > 0 || options_.auto_resume || !options_.load_dir.empty();
}

void TrainerCheckpoints::Agree() {
  if (agreed_) return;
  agreed_ = true;
  const TrainerOptions& o = options_;
  const bool together = fleet::worker_num() > 1 && MayResume();
  std::optional<CheckpointFile> local;
  std::string error;
  try {
    if (!local_dir_.empty()) local = ReadCheckpointFile(local_dir_, /*set_aside_damaged=*/true);
  } catch (const Error& e) {
    if (!together) throw;
    error = e.what();
  }
  auto agreed = std::make_unique<AgreedCheckpoint>();
  // The folder this rank looked in, for messages: a restart looks in save_dir.
  std::string looked = local_dir_;
  if (looked.empty() && (restart_ > 0 || o.auto_resume)) looked = o.save_dir;
  if (together)
    *agreed = AgreeOnCheckpoint(std::move(local), looked, error);
  else
    agreed->file = std::move(local);
  resume_state_.reset();
  if (!agreed->error.empty()) {
    // Load reports it, so that every rank fails together.
  } else if (agreed->file) {
    resume_state_ = agreed->file->state;
    resume_from_ = agreed->received ? agreed->file->path : local_dir_;
  } else if (!o.load_dir.empty()) {
    // No rank has a checkpoint, so none has load_dir's.
    std::vector<std::string> where;
    for (size_t r = 0; r < agreed->ranks.size(); ++r)
      where.push_back(agreed->ranks[r].Describe(static_cast<int>(r)) + " in " +
                      (agreed->ranks[r].dir.empty() ? "none" : agreed->ranks[r].dir));
    KEEL_THROW(Opt("load_dir"), "=", o.load_dir, ": no ", kPersistablesFile, " there",
               where.empty() ? "" : " on any node (" + StrJoin(where, ", ") + ")");
  } else if (restart_ > 0) {
    LOG(WARNING) << "restart " << restart_ << " (KEEL_RESTART_COUNT) but "
                 << (o.save_dir.empty() ? "no " + Opt("save_dir")
                                        : "no checkpoint in " + Opt("save_dir") + "=" + o.save_dir +
                                              (together ? " on any node" : ""))
                 << ": training starts over from step 0";
  }
  agreed_checkpoint_ = std::move(agreed);
}

uint64_t TrainerCheckpoints::Seed(uint64_t seed, const std::string& what) {
  if (fleet::initialized()) Agree();
  seed_ = seed;
  if (!resume_state_ || resume_state_->seed == 0) return seed_;
  if (seed == 0) return seed_ = resume_state_->seed;
  KEEL_ENFORCE(seed == resume_state_->seed, what, " but the checkpoint in ", resume_from_,
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
  Agree();
  if (fleet::worker_num() == 1 || !MayResume()) return Load(exe, main, replay, quiet);
  // Every rank resumes, or none trains: a rank that failed would leave the others waiting in the
  // first step's all-reduce.
  int64_t step = -1;
  std::string error;
  try {
    step = Load(exe, main, replay, quiet);
  } catch (const Error& e) {
    error = e.what();
  }
  CheckEveryRankResumed(*agreed_checkpoint_, step, error);
  return step;
}

int64_t TrainerCheckpoints::Load(Executor& exe, const Program& main,
                                 const std::function<void(int64_t)>& replay, bool quiet) {
  KEEL_ENFORCE(agreed_checkpoint_->error.empty(), agreed_checkpoint_->error);
  if (!agreed_checkpoint_->file) return 0;
  // A parameter-server trainer received its parameters from the servers, which loaded the same
  // checkpoint (fleet::run_server): they must agree, or the servers started from elsewhere.
  const std::vector<std::pair<std::string, Tensor>> received = ReceivedParameters(exe, main);
  // A model-parallel rank keeps its part of the complete checkpoint (its stage, its shards).
  std::optional<TrainingState> st;
  fleet::LoadThisRanksPart(exe, main,
                           [&](Scope& scope, const Place& place, const Program& program,
                               const std::set<std::string>& skip) {
                             st = load_checkpoint(scope, place, *agreed_checkpoint_->file, program,
                                                  skip);
                           });
  for (const auto& [name, got] : received) {
    const Tensor& loaded = exe.scope().FindVar(name)->tensor();
    KEEL_ENFORCE(loaded.nbytes() == got.nbytes() &&
                     std::memcmp(loaded.raw_data(), got.raw_data(), got.nbytes()) == 0,
                 "resuming from ", resume_from_, ": parameter ", name,
                 " as the servers hold it differs from the checkpoint's; the servers did not "
                 "load this checkpoint (give every process of the job the same ",
                 Opt("load_dir"), " / ", Opt("save_dir"), ")");
  }
  if (st) exe.SetRunCount(main, st->step);
  agreed_checkpoint_->file->bytes = std::string();  // loaded: the memory goes back
  try {
    fleet::rebuild_pass_made_vars(exe, main, st ? st->step : -1);
  } catch (const Error& e) {
    KEEL_THROW("resuming from ", resume_from_, ": ", e.what());
  }
  if (!st) {
    if (!quiet)
      std::printf("resumed parameters from %s (no training state: starting at step 0)\n",
                  resume_from_.c_str());
    return 0;
  }
  if (st->world_size != fleet::worker_num())
    LOG(WARNING) << resume_from_ << " was saved by " << st->world_size
                 << " worker(s), this job has " << fleet::worker_num()
                 << ": the data shards differ from the saved run's";
  if (st->seed == 0)
    LOG(WARNING) << resume_from_ << " was trained with " << Opt("seed")
                 << "=0: the resumed data order and "
                 << "dropout draws differ from the interrupted run's (pass " << Opt("seed")
                 << " for an exact resume)";
  // The data stream continues where the checkpoint was taken.
  replay(st->step);
  // A checkpoint this rank's own save_dir holds need not be written again at that step.
  if (!agreed_checkpoint_->received && local_dir_ == options_.save_dir) last_saved_step_ = st->step;
  if (!quiet) {
    std::printf("resumed from %s at step %lld\n", resume_from_.c_str(),
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

void TrainerCheckpoints::Write(Executor& exe, const Program& main, int64_t steps_done,
                               bool write) const {
  const TrainingState st = State(steps_done);
  // Parameter-server mode: trainer 0 pulls what the servers hold (fleet/ps_checkpoint.h).
  if (ParameterServerJob()) {
    if (write) fleet::SavePsCheckpoint(exe, options_.save_dir, main, &st);
    return;
  }
  fleet::CheckpointOnRankZero gathered(exe, main);
  if (write)
    save_checkpoint(gathered.scope(), options_.save_dir, gathered.program(), st, gathered.skip());
}

bool TrainerCheckpoints::AfterStep(Executor& exe, const Program& main, int64_t steps_done,
                                   bool rank0, bool quiet) {
  if (options_.save_every <= 0 || steps_done % options_.save_every != 0) return false;
  // Rank 0 alone writes, without a barrier: its scope is its own, and in synchronous training
  // every rank holds the same values after the step. A rank killed mid-save leaves the previous
  // checkpoint in place (the file is replaced atomically). Under sharding every rank first sends
  // rank 0 the optimizer state it owns, under pipeline and tensor parallelism its stage's
  // persistables and its shards, so the checkpoint is complete.
  Write(exe, main, steps_done, rank0);
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
  {
    // A collective under sharding and model parallelism, entered by every rank whatever its
    // last_saved_step_ (a rank that received its checkpoint from rank 0 does not know that step).
    Write(exe, main, steps_done, rank0 && last_saved_step_ != steps_done);
  }
  if (!quiet)
    std::printf("saved persistables to %s/%s\n", options_.save_dir.c_str(),
                kPersistablesFile.c_str());
  return true;
}

}  // namespace keel
