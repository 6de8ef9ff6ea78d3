#include "trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fleet/fleet.h"
#include "fleet/straggler_monitor.h"
#include "framework/comm/store.h"
#include "framework/dsl/amp.h"
#include "framework/error.h"
#include "framework/fault_point.h"
#include "framework/profiler/profiler.h"
#include "trainer/checkpoints.h"
#include "trainer/progress.h"

namespace keel {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// A loader must hand this rank its own shard: the same data on every rank would train each step
// on copies, and an evaluation would count every sample once per rank.
void CheckShard(const DataLoader* loader, const char* field, int rank, int world) {
  if (!loader) return;
  const LoaderOptions& lo = loader->options();
  KEEL_ENFORCE(lo.rank == rank && lo.nranks == world, "TrainerModel::", field, " is shard ",
               lo.rank, " of ", lo.nranks,
               " (its LoaderOptions rank, nranks) but this worker is rank ", rank, " of ", world,
               ": make it with rank = fleet::worker_index(), nranks = fleet::worker_num()");
}

void CheckVar(const Program* program, const std::string& var, const std::string& what,
              const char* program_field) {
  KEEL_ENFORCE(program->global_block().HasVar(var), what, " names var '", var,
               "', which TrainerModel::", program_field, " does not have");
}

// Crash tests: KEEL_FAULT_POINT=trainer_step_N (or trainer_step_N@RANK) kills the worker right
// after step N, on a job's first attempt only, so that a restarted job gets past it.
bool StepFaultsArmed() {
  const char* v = std::getenv("KEEL_FAULT_POINT");
  return v != nullptr && std::strncmp(v, "trainer_step_", 13) == 0 &&
         RestartGenerationFromEnvironment() == 0;
}

}  // namespace

double EvalResult::metric(const std::string& name) const {
  std::string known;
  for (const auto& [n, v] : metrics) {
    if (n == name) return v;
    known += (known.empty() ? "" : ", ") + n;
  }
  KEEL_THROW("EvalResult: no metric '", name, "' (it has: ", known.empty() ? "none" : known, ")");
}

Trainer::Trainer(TrainerOptions options) : options_(std::move(options)) {
  const TrainerOptions& o = options_;
  KEEL_ENFORCE(o.steps >= 0, Opt("steps"), " must be >= 0, got ", o.steps);
  KEEL_ENFORCE(o.epochs >= 0, Opt("epochs"), " must be >= 0, got ", o.epochs);
  KEEL_ENFORCE(o.fetch_frequency > 0, Opt("fetch_frequency"), " must be positive, got ",
               o.fetch_frequency);
  KEEL_ENFORCE(o.eval_every >= 0, Opt("eval_every"), " must be >= 0, got ", o.eval_every);
  KEEL_ENFORCE(o.stop_check_every >= 0, Opt("stop_check_every"), " must be >= 0, got ",
               o.stop_check_every);
  ValidateExecutionStrategy(o.exec_strategy, Opt("exec_strategy") + ": ");
  checkpoints_ = std::make_unique<TrainerCheckpoints>(options_);
  progress_ = std::make_unique<TrainProgress>(options_);
}

Trainer::~Trainer() = default;

uint64_t Trainer::seed() {
  return checkpoints_->Seed(options_.seed, Opt("seed") + "=" + std::to_string(options_.seed));
}

int64_t Trainer::resume_step() const { return checkpoints_->resume_step(); }

void Trainer::add_callback(std::shared_ptr<Callback> callback) {
  KEEL_ENFORCE(callback != nullptr, "Trainer::add_callback: the callback is null");
  callbacks_.push_back(std::move(callback));
}

void Trainer::stop() { stop_requested_ = true; }

Executor& Trainer::executor() {
  KEEL_ENFORCE(exe_ != nullptr, "Trainer::executor: there is none before fit or evaluate");
  return *exe_;
}

void Trainer::ValidateModel(const TrainerModel& model, bool for_fit) const {
  const TrainerOptions& o = options_;
  KEEL_ENFORCE(model.main != nullptr, "TrainerModel::main is not set (the training program)");
  KEEL_ENFORCE(model.startup != nullptr,
               "TrainerModel::startup is not set (the program that initializes the parameters)");
  KEEL_ENFORCE(!(model.evaluate && model.eval_data),
               "TrainerModel::evaluate and TrainerModel::eval_data are both set: the Trainer "
               "evaluates either with the function or on the data, give one");
  if (model.eval_data) {
    KEEL_ENFORCE(model.test != nullptr,
                 "TrainerModel::eval_data needs TrainerModel::test (the forward program that "
                 "computes the metrics: main->clone_for_test() before minimize)");
    KEEL_ENFORCE(!model.metrics.empty(),
                 "TrainerModel::eval_data needs TrainerModel::metrics (the vars to evaluate)");
  } else {
    KEEL_ENFORCE(model.metrics.empty(),
                 "TrainerModel::metrics needs TrainerModel::eval_data (the batches to compute "
                 "them on)");
  }
  for (const TrainerMetric& m : model.metrics) {
    KEEL_ENFORCE(!m.name.empty(), "TrainerModel::metrics: the metric of var '", m.var,
                 "' has no name");
    CheckVar(model.test, m.var, "TrainerModel::metrics '" + m.name + "'", "test");
  }
  const bool evaluates = model.evaluate || model.eval_data;
  if (!o.save_inference_dir.empty()) {
    KEEL_ENFORCE(!model.inference_feeds.empty() && !model.inference_targets.empty(),
                 Opt("save_inference_dir"), "=", o.save_inference_dir,
                 " needs TrainerModel::inference_feeds and inference_targets (what the "
                 "inference program takes and gives)");
  }
  if (!for_fit) return;
  KEEL_ENFORCE(!model.loss.empty(), "TrainerModel::loss is not set (the loss var of main)");
  // A run_step fetches the loss its own way (a pipeline stage before the last holds none).
  if (!model.run_step) CheckVar(model.main, model.loss, "TrainerModel::loss", "main");
  if (!model.learning_rate.empty())
    CheckVar(model.main, model.learning_rate, "TrainerModel::learning_rate", "main");
  const bool loader = model.train_data != nullptr, fn = static_cast<bool>(model.next_batch);
  KEEL_ENFORCE(loader || fn,
               "TrainerModel has no training data: set train_data (a DataLoader) or next_batch");
  KEEL_ENFORCE(!(loader && fn),
               "TrainerModel::train_data and TrainerModel::next_batch are both set: give one");
  KEEL_ENFORCE(model.batches_per_epoch >= 0, "TrainerModel::batches_per_epoch must be >= 0, got ",
               model.batches_per_epoch);
  KEEL_ENFORCE(!loader || model.batches_per_epoch == 0,
               "TrainerModel::batches_per_epoch is for next_batch; train_data's epochs are the "
               "loader's (",
               model.train_data ? model.train_data->batches_per_epoch() : 0, " batches)");
  KEEL_ENFORCE(model.batch_size >= 0, "TrainerModel::batch_size must be >= 0, got ",
               model.batch_size);
  const int64_t epoch_len =
      loader ? model.train_data->batches_per_epoch() : model.batches_per_epoch;
  KEEL_ENFORCE(!loader || epoch_len > 0, "TrainerModel::train_data yields no batch in an epoch (",
               model.train_data->samples_per_rank(),
               " samples for this rank, batch_size=", model.train_data->options().batch_size,
               model.train_data->options().drop_last ? ", drop_last" : "", ")");
  if (o.epochs > 0 && epoch_len > 0)
    KEEL_ENFORCE(o.steps == 0, Opt("steps"), "=", o.steps, " with ", Opt("epochs"), "=", o.epochs,
                 ": the training data is finite, an epoch is ", epoch_len,
                 " steps, and the steps would be ignored; give one of them");
  if (o.epochs > 0 && epoch_len == 0)
    KEEL_ENFORCE(o.steps > 0, Opt("epochs"), "=", o.epochs,
                 " with an endless TrainerModel::next_batch: an epoch is ", Opt("steps"),
                 " steps; set it");
  KEEL_ENFORCE(o.eval_every == 0 || evaluates, Opt("eval_every"), "=", o.eval_every,
               ": the model has nothing to evaluate (set TrainerModel::eval_data with test and "
               "metrics, or TrainerModel::evaluate)");
}

void Trainer::Start(TrainerModel& model, bool for_fit) {
  if (model_) {
    KEEL_ENFORCE(
        model_ == &model,
        "Trainer: fit and evaluate were given different TrainerModels; a Trainer runs one");
    return;
  }
  if (!fleet::initialized()) fleet::init();  // one worker unless a launcher's environment says
  const int rank = fleet::worker_index(), world = fleet::worker_num();
  rank0_ = rank == 0;
  quiet_ = !rank0_ && !options_.log_all_ranks;
  CheckShard(model.train_data.get(), "train_data", rank, world);
  CheckShard(model.eval_data.get(), "eval_data", rank, world);
  // The seed checkpoints record: the option's, else the program's (a model built with the seed
  // seed() chose has it as its random seed).
  const auto program_seed = static_cast<uint64_t>(model.main->random_seed());
  if (options_.seed == 0 && program_seed != 0)
    checkpoints_->Seed(program_seed,
                       "the main program's random seed " + std::to_string(program_seed));
  else
    seed();

  exe_ = std::make_unique<Executor>(fleet::worker_place(), options_.exec_strategy);
  exe_->Run(*model.startup);
  model_ = &model;
  checkpoints_->CheckBeforeTraining(*exe_, *model.main, rank0_);
  loaded_step_ = checkpoints_->Resume(
      *exe_, *model.main,
      [this, for_fit](int64_t steps) {
        if (for_fit) ReplayData(steps);
      },
      quiet_);
  steps_done_ = loaded_step_;
}

void Trainer::ReplayData(int64_t steps) {
  FeedMap skipped;
  if (model_->train_data) {
    DataLoader& loader = *model_->train_data;
    const int64_t per_epoch = loader.batches_per_epoch();
    data_epoch_ = steps / per_epoch;
    loader.StartEpoch(data_epoch_);
    for (int64_t i = 0; i < steps % per_epoch; ++i) loader.Next(&skipped);
  } else {
    for (int64_t i = 0; i < steps; ++i) model_->next_batch(&skipped);
  }
  positioned_ = true;
}

void Trainer::NextBatch(FeedMap* feed) {
  if (model_->train_data) {
    while (!model_->train_data->Next(feed)) model_->train_data->StartEpoch(++data_epoch_);
  } else {
    model_->next_batch(feed);
  }
}

EvalResult Trainer::RunEvaluation() {
  if (model_->evaluate) return model_->evaluate(*exe_);
  const std::vector<TrainerMetric>& metrics = model_->metrics;
  std::vector<std::string> vars;
  for (const TrainerMetric& m : metrics) vars.push_back(m.var);
  // Per metric the sum over batches of (batch mean x rows), then the rows: summed over the ranks,
  // each ratio is the mean over the whole evaluation data.
  Tensor sums(DType::kFloat64, DDim({static_cast<int64_t>(metrics.size()) + 1}));
  double* s = sums.data<double>();
  std::fill(s, s + metrics.size() + 1, 0.0);
  DataLoader& loader = *model_->eval_data;
  loader.StartEpoch(0);
  FeedMap feed;
  while (loader.Next(&feed)) {
    std::vector<Tensor> out = exe_->Run(*model_->test, feed, vars);
    const auto rows = static_cast<double>(feed.begin()->second.dims()[0]);
    for (size_t i = 0; i < metrics.size(); ++i) {
      KEEL_ENFORCE(out[i].numel() == 1, "TrainerModel::metrics '", metrics[i].name, "': var ",
                   metrics[i].var, " has shape ", out[i].dims().str(),
                   "; a metric is the batch's mean, one element");
      s[i] += out[i].item<double>() * rows;
    }
    s[metrics.size()] += rows;
  }
  if (fleet::worker_num() > 1) fleet::all_reduce(&sums);
  EvalResult r;
  const double total = s[metrics.size()];
  r.samples = static_cast<int64_t>(total);
  for (size_t i = 0; i < metrics.size(); ++i)
    r.metrics.emplace_back(metrics[i].name, total > 0 ? s[i] / total : 0.0);
  return r;
}

EvalResult Trainer::Evaluate(int64_t step, int epoch) {
  EvalResult r = RunEvaluation();
  r.step = step;
  r.epoch = epoch;
  progress_->OnEval(step, epoch, r.metrics, r.samples);
  Tell([&](Callback& c) { c.on_eval_end(*this, r); });
  return r;
}

EvalResult Trainer::evaluate(TrainerModel& model) {
  ValidateModel(model, /*for_fit=*/false);
  KEEL_ENFORCE(model.evaluate || model.eval_data,
               "Trainer::evaluate: the model has nothing to evaluate (set TrainerModel::eval_data "
               "with test and metrics, or TrainerModel::evaluate)");
  Start(model, /*for_fit=*/false);
  EvalResult r = RunEvaluation();
  r.step = steps_done_ - 1;
  Tell([&](Callback& c) { c.on_eval_end(*this, r); });
  return r;
}

bool Trainer::StopNow(int64_t steps_done) {
  if (fleet::worker_num() == 1 || options_.stop_check_every == 0) return stop_requested_;
  if (steps_done % options_.stop_check_every != 0) return false;
  // One rank's request stops every rank after the same step.
  if (fleet::metrics::max(stop_requested_ ? 1.0 : 0.0) > 0) stop_requested_ = true;
  return stop_requested_;
}

TrainResult Trainer::fit(TrainerModel& model) {
  KEEL_ENFORCE(!fitted_,
               "Trainer::fit: this Trainer has trained already (a Trainer fits once; make "
               "another to train again)");
  ValidateModel(model, /*for_fit=*/true);
  fitted_ = true;
  Start(model, /*for_fit=*/true);
  if (!positioned_) ReplayData(loaded_step_);
  const TrainerOptions& o = options_;
  const int rank = fleet::worker_index(), world = fleet::worker_num();
  const int64_t epoch_len =
      model.train_data ? model.train_data->batches_per_epoch() : model.batches_per_epoch;
  const int epochs = std::max(1, o.epochs);
  const int64_t steps_per_epoch = o.epochs > 0 && epoch_len > 0 ? epoch_len : o.steps;
  const int64_t total_steps = steps_per_epoch * epochs;
  int64_t samples = model.batch_size;
  if (samples == 0 && model.train_data) samples = model.train_data->options().batch_size;
  progress_->Begin(total_steps, samples * world, rank, quiet_);
  const bool evaluates = model.evaluate || model.eval_data;
  std::vector<std::string> fetch = {model.loss};
  if (!model.learning_rate.empty()) fetch.push_back(model.learning_rate);
  // With loss scaling, the scale and the skipped-steps counter ride along with the loss (two [1]
  // vars in the same fetch: no sync of their own).
  const amp::LossScalingVars scaling = amp::FindLossScalingVars(*model.main);
  const size_t scale_at = fetch.size();
  const bool scales = !scaling.loss_scaling.empty() && !scaling.skipped_steps.empty();
  if (scales) {
    fetch.push_back(scaling.loss_scaling);
    fetch.push_back(scaling.skipped_steps);
  }

  TrainResult result;
  result.start_step = loaded_step_;
  FitInfo info;
  info.start_step = loaded_step_;
  info.total_steps = total_steps;
  info.steps_per_epoch = steps_per_epoch;
  info.epochs = epochs;
  info.rank = rank;
  info.world_size = world;
  Tell([&](Callback& c) { c.on_train_begin(*this, info); });

  FeedMap feed;
  fleet::StragglerMonitor straggler;
  profiler::StartFromFlags();
  const bool step_faults = StepFaultsArmed();
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  int64_t step = loaded_step_;  // steps done
  bool stopped = false;
  for (int epoch = static_cast<int>(step / std::max<int64_t>(1, steps_per_epoch));
       epoch < epochs && !stopped; ++epoch) {
    for (int64_t i = step - epoch * steps_per_epoch; i < steps_per_epoch && !stopped; ++i) {
      NextBatch(&feed);
      if (samples == 0 && !feed.empty() && feed.begin()->second.dims().size() > 0) {
        samples = feed.begin()->second.dims()[0];
        progress_->set_samples_per_step(samples * world);
      }
      // The loss is fetched (copied out) only on the steps that show it.
      const bool at_end = step + 1 == total_steps;
      const bool fetches = step % o.fetch_frequency == 0;
      const std::vector<std::string>& want = fetches ? fetch : std::vector<std::string>{};
      std::vector<Tensor> out =
          model.run_step ? model.run_step(*exe_, feed, want) : exe_->Run(*model.main, feed, want);
      straggler.StepDone();
      StepInfo s;
      s.step = step;
      s.epoch = epoch_len > 0 ? step / epoch_len : epoch;
      if (!out.empty()) s.loss = result.last_loss = out[0].item<float>();
      if (!out.empty() && !model.learning_rate.empty()) s.learning_rate = out[1].item<float>();
      if (!out.empty() && scales) {
        s.loss_scale = out[scale_at].item<float>();
        s.skipped_steps = static_cast<int64_t>(out[scale_at + 1].item<float>());
      }
      const Clock::time_point now = Clock::now();
      s.step_ms = 1000.0 * Seconds(last, now);
      s.elapsed_s = Seconds(start, now);
      last = now;
      progress_->OnStep(step, s);
      Tell([&](Callback& c) { c.on_step_end(*this, s); });
      if (step_faults) FaultPoint(("trainer_step_" + std::to_string(step)).c_str());
      steps_done_ = ++step;
      if (checkpoints_->AfterStep(*exe_, *model.main, step, rank0_, quiet_)) {
        SaveInfo saved{o.save_dir, step, false};
        Tell([&](Callback& c) { c.on_save(*this, saved); });
      }
      if (o.eval_every > 0 && evaluates && (step % o.eval_every == 0 || at_end))
        result.last_eval = Evaluate(step - 1, -1);
      stopped = StopNow(step) && step < total_steps;
    }
    if (stopped) break;
    if (o.epochs > 0 && evaluates) result.last_eval = Evaluate(step - 1, epoch);
    // Every rank ends the epoch at the same step: a stop asked there (say from on_eval_end) is
    // agreed on before the next epoch.
    if (o.epochs > 0 && epoch + 1 < epochs)
      stopped = (world == 1 || o.stop_check_every == 0)
                    ? stop_requested_.load()
                    : fleet::metrics::max(stop_requested_ ? 1.0 : 0.0) > 0;
  }
  progress_->Finish();
  profiler::FinishFromFlags();
  result.steps_done = step;
  result.stopped = stopped;
  if (checkpoints_->SaveFinal(*exe_, *model.main, step, rank0_, quiet_)) {
    SaveInfo saved{o.save_dir, step, true};
    Tell([&](Callback& c) { c.on_save(*this, saved); });
  }
  if (!o.save_inference_dir.empty()) {
    fleet::save_inference_model(*exe_, o.save_inference_dir, model.inference_feeds,
                                model.inference_targets, model.main);
    if (!quiet_) std::printf("saved inference model to %s\n", o.save_inference_dir.c_str());
  }
  Tell([&](Callback& c) { c.on_train_end(*this, result); });
  return result;
}

}  // namespace keel
