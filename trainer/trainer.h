// keel::Trainer: the training loop of `keel train` for any model. A user describes the model
// (programs, loss, data, evaluation) in a TrainerModel, says how to train in TrainerOptions, and
// calls fit(); the Trainer runs the steps and brings what a long run needs:
//
//   progress   a line per fetched step (or a bar on a terminal) with loss, samples/s and ETA
//   TensorBoard  train/loss, train/learning_rate, train/samples_per_sec, train/step_time_ms,
//              amp/loss_scale and amp/skipped_steps with loss scaling, eval/<metric>,
//              written by rank 0 (or every rank) into `logdir`
//   evaluation every `eval_every` steps and after each epoch, each rank on its shard of the
//              evaluation data, the metrics combined over all ranks
//   checkpoints  every `save_every` steps and at the end into `save_dir` (rank 0 writes); a
//              restarted job (keel launch --max_restarts) or `auto_resume` continues from the
//              latest one, every rank from the same step, with the same data and random draws
//              as the uninterrupted run: the resumed run's parameters equal it bit for bit
//   callbacks  on_train_begin, on_step_end, on_eval_end, on_save, on_train_end; a callback
//              may stop training (the ranks agree on the step)
//
// It runs alone and under `keel launch` alike: fleet::init first (fit calls it when nobody did),
// then the model built with fleet::distributed_optimizer(...).minimize. docs/trainer.md has a
// user's guide; examples/train_cnn.cc is a complete program.
//
//   keel::TrainerOptions opts;
//   opts.epochs = 4;
//   opts.save_dir = "ckpt";
//   opts.save_every = 50;
//   keel::Trainer trainer(opts);
//   keel::TrainerModel model;
//   model.main = &main_program;
//   model.startup = &startup_program;
//   model.loss = loss.name();
//   model.train_data = train_loader;          // a DataLoader sharded by fleet's rank
//   trainer.fit(model);
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "executor/execution_strategy.h"
#include "executor/executor.h"
#include "framework/data/data_loader.h"
#include "framework/ir/program.h"

namespace keel {

class TrainerCheckpoints;
class TrainProgress;

// What evaluate() reports: every metric over the whole evaluation data, all ranks together.
struct EvalResult {
  int64_t step = -1;    // the last step trained before it ran (as the step lines number them)
  int epoch = -1;       // the epoch it ends; -1: from eval_every or a call to evaluate()
  int64_t samples = 0;  // evaluation samples, all ranks together
  std::vector<std::pair<std::string, double>> metrics;  // (name, value), in the model's order
  // The value of metric `name`; a keel::Error names it when there is none.
  double metric(const std::string& name) const;
};

// A metric of the evaluation: a one-element var of the test program holding the batch's mean
// (an accuracy, a mean loss). The Trainer weights each batch by its rows and divides by the rows
// of every rank: the result is the mean over the whole evaluation data.
struct TrainerMetric {
  std::string name;  // how it is printed (test_<name>) and logged (eval/<name>)
  std::string var;
};

// The model: programs, feeds, data. The Trainer keeps pointers; what they point to must outlive
// it. Programs are the user's (fleet's minimize rewrites them in place).
struct TrainerModel {
  Program* main = nullptr;     // the training program, after minimize
  Program* startup = nullptr;  // run once before training (fleet broadcasts rank 0's parameters)
  Program* test = nullptr;     // forward only (main->clone_for_test() before minimize); evaluation
  std::string loss;            // the loss var of main, fetched every fetch_frequency steps
  std::string learning_rate;   // optional: the rate var (DistributedOptimizer::learning_rate_var)

  // Training data: exactly one of
  //   train_data  a DataLoader of this rank's shard (LoaderOptions rank = fleet::worker_index(),
  //               nranks = fleet::worker_num()); its batches' names are the feeds; epochs follow
  //               the loader's (StartEpoch(e)), and a resumed run skips to its position;
  //   next_batch  fills the feeds of the next step (an endless stream, or batches_per_epoch
  //               long); a resumed run calls it once per step already done, so the stream
  //               continues where it was.
  std::shared_ptr<DataLoader> train_data;
  std::function<void(FeedMap* feed)> next_batch;
  int64_t batches_per_epoch = 0;  // next_batch: 0 = endless (an epoch is then options.steps)
  int64_t batch_size = 0;  // samples per step and rank, for samples/s (0: train_data's, or the fed)

  // Evaluation (optional): either eval_data with test and metrics, run by the Trainer, or an
  // evaluate function of the user's, which every rank calls and which returns global metrics.
  std::shared_ptr<DataLoader> eval_data;  // this rank's shard (even_shards = false: each sample
                                          // exactly once in the job)
  std::vector<TrainerMetric> metrics;
  std::function<EvalResult(Executor& exe)> evaluate;

  // What options.save_inference_dir saves: the feeds and targets of the pruned program.
  std::vector<std::string> inference_feeds, inference_targets;

  // How one training step runs (optional): given the Trainer's executor, the step's feeds and
  // what to fetch (the loss, then the rate; empty on steps that show nothing), it returns the
  // fetched values. Empty: exe.Run(*main, feed, fetch). A pipeline stage sets it to run the
  // mini-batch as micro-batches (fleet::PipelineRunner, docs/pipeline.md).
  std::function<std::vector<Tensor>(Executor& exe, const FeedMap& feed,
                                    const std::vector<std::string>& fetch)>
      run_step;
};

struct TrainerOptions {
  // Length. steps: the run's steps, counting those a resumed checkpoint did. epochs: that many
  // passes over train_data (evaluating after each); with an endless next_batch an epoch is
  // `steps` steps. With finite data give one of them.
  int64_t steps = 0;
  int epochs = 0;

  // Watching. The loss (and rate) is fetched every fetch_frequency steps: the progress line,
  // TensorBoard and StepInfo::loss have it on those steps only (fetching copies and syncs).
  int fetch_frequency = 1;
  std::string progress = "auto";  // bar | lines | none | auto (a bar on a terminal, else lines)
  bool log_all_ranks = false;     // every rank prints, not only rank 0
  std::string logdir;             // TensorBoard event files (rank 0 writes)
  bool logdir_all_ranks = false;  // every rank writes logdir/rank_N
  int eval_every = 0;  // evaluate every this many steps and at the last; 0: after epochs only

  // Checkpoints: the persistables with the training state (step, seed, world size), written by
  // rank 0 every save_every steps and after training. A job restarted by keel launch
  // --max_restarts resumes from save_dir's latest; so does any run with auto_resume (a job
  // requeued by Kubernetes or Slurm); otherwise load_dir, when set, is where a run starts from.
  std::string save_dir;
  int save_every = 0;
  bool auto_resume = false;
  std::string load_dir;
  std::string save_inference_dir;  // after training, rank 0 saves the inference model here
  // The seed of the model's initialization and data, recorded in checkpoints and checked on
  // resume; 0: the main program's random seed (0 again: none, and the resumed run warns).
  uint64_t seed = 0;

  // Running.
  ExecutionStrategy exec_strategy;  // of the Trainer's executor (startup, evaluation)
  // Under several workers the ranks agree on a stop requested by a callback (Trainer::stop) every
  // this many steps, through one all-reduce of a flag, and at each epoch's end; 0: never (every
  // rank must then request it at the same step, e.g. from on_eval_end, whose metrics are
  // global). One worker stops right after the step that asked.
  int stop_check_every = 1;

  // How messages name things: an option is option_prefix + its field name (a CLI passes "--",
  // its flags having the fields' names), and warnings begin with `name`.
  std::string option_prefix = "TrainerOptions::";
  std::string name = "keel::Trainer";
};

struct FitInfo {
  int64_t start_step = 0;  // steps already done (a resumed checkpoint's), where training begins
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 0;
  int epochs = 1;
  int rank = 0, world_size = 1;
};

struct StepInfo {
  int64_t step = 0;  // the step just run, counted from 0
  int64_t epoch = 0;
  std::optional<float> loss;           // on the steps that fetched it (this rank's loss)
  std::optional<float> learning_rate;  // when the model names its var, on the same steps
  // With loss scaling (amp with float16, or a set init_loss_scaling), on the same steps: the
  // scale after this step and the steps skipped for overflow so far (the run's, resumes included).
  std::optional<float> loss_scale;
  std::optional<int64_t> skipped_steps;
  double step_ms = 0;    // this step's wall time, data included
  double elapsed_s = 0;  // since this fit began training
};

struct SaveInfo {
  std::string dir;
  int64_t step = 0;    // steps done, as recorded in the checkpoint
  bool final = false;  // the checkpoint after training (or after a stop)
};

struct TrainResult {
  int64_t start_step = 0;  // where training began (a resumed checkpoint's step, else 0)
  int64_t steps_done = 0;  // where it ended
  bool stopped = false;    // a callback stopped it early
  std::optional<float> last_loss;
  std::optional<EvalResult> last_eval;
};

class Trainer;

// Override what you need. Every rank calls its callbacks (rank 0 is where one usually prints:
// fleet::is_first_worker()); they run on the training thread, between steps.
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(Trainer& trainer, const FitInfo& info) {}
  virtual void on_step_end(Trainer& trainer, const StepInfo& step) {}
  virtual void on_eval_end(Trainer& trainer, const EvalResult& eval) {}
  // After a checkpoint was saved (by rank 0; the other ranks are told too).
  virtual void on_save(Trainer& trainer, const SaveInfo& save) {}
  virtual void on_train_end(Trainer& trainer, const TrainResult& result) {}
};

// A Callback from functions, for lambdas; unset ones do nothing.
struct LambdaCallback : Callback {
  std::function<void(Trainer&, const FitInfo&)> train_begin;
  std::function<void(Trainer&, const StepInfo&)> step_end;
  std::function<void(Trainer&, const EvalResult&)> eval_end;
  std::function<void(Trainer&, const SaveInfo&)> save;
  std::function<void(Trainer&, const TrainResult&)> train_end;

  void on_train_begin(Trainer& t, const FitInfo& i) override {
    if (train_begin) train_begin(t, i);
  }
  void on_step_end(Trainer& t, const StepInfo& s) override {
    if (step_end) step_end(t, s);
  }
  void on_eval_end(Trainer& t, const EvalResult& e) override {
    if (eval_end) eval_end(t, e);
  }
  void on_save(Trainer& t, const SaveInfo& s) override {
    if (save) save(t, s);
  }
  void on_train_end(Trainer& t, const TrainResult& r) override {
    if (train_end) train_end(t, r);
  }
};

class Trainer {
 public:
  // Checks the options (a keel::Error names the first one out of range) and finds the checkpoint
  // to resume from, if any. Needs no fleet yet: a program may ask seed() before building its
  // model.
  explicit Trainer(TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // options.seed, or, when it is 0, the seed the resumed checkpoint was trained with (0 when
  // there is none): a run that lets the checkpoint choose builds its model with this seed. Once
  // fleet is initialized, this is where the ranks of a job agree on the checkpoint (the newest
  // any of them can read; their folders may be each node's own): call it on every rank or none.
  uint64_t seed();
  // The step the resumed checkpoint records; 0 for a fresh start (this rank's own checkpoint
  // until the ranks agreed, in seed() or fit).
  int64_t resume_step() const;

  void add_callback(std::shared_ptr<Callback> callback);

  // Runs startup, resumes, trains, evaluates and saves as the options say. A Trainer fits once;
  // `model` must stay the one evaluate() was given, if it ran before.
  TrainResult fit(TrainerModel& model);
  // Evaluates `model` now (every rank must call it) and tells the callbacks. Before fit it runs
  // startup and loads the checkpoint the options name first.
  EvalResult evaluate(TrainerModel& model);

  // Asks training to stop after the current step (from a callback, or another thread). The
  // checkpoint after training is saved as usual.
  void stop();
  bool stop_requested() const { return stop_requested_; }

  // The executor that runs the model (its scope holds the parameters): after fit or evaluate.
  Executor& executor();
  const TrainerOptions& options() const { return options_; }

 private:
  std::string Opt(const std::string& field) const { return options_.option_prefix + field; }
  void ValidateModel(const TrainerModel& model, bool for_fit) const;
  // Startup, checks before the first step, the checkpoint; once per Trainer.
  // `for_fit`: also bring the training data to the resumed step.
  void Start(TrainerModel& model, bool for_fit);
  void NextBatch(FeedMap* feed);
  // The training data at step `steps`, as an uninterrupted run has it there.
  void ReplayData(int64_t steps);
  // Evaluates, logs and tells the callbacks (in fit).
  EvalResult Evaluate(int64_t step, int epoch);
  EvalResult RunEvaluation();
  // After `steps_done` steps: whether training stops here (agreed by the ranks when due).
  bool StopNow(int64_t steps_done);
  template <typename F>
  void Tell(F f) {
    for (auto& c : callbacks_) f(*c);
  }

  TrainerOptions options_;
  std::unique_ptr<TrainerCheckpoints> checkpoints_;
  std::unique_ptr<TrainProgress> progress_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::unique_ptr<Executor> exe_;
  TrainerModel* model_ = nullptr;  // set by Start
  bool fitted_ = false;
  bool rank0_ = true, quiet_ = false;
  int64_t loaded_step_ = 0;  // the step of the checkpoint Start loaded
  int64_t steps_done_ = 0;
  bool positioned_ = false;  // the training data is at loaded_step_
  int64_t data_epoch_ = 0;   // train_data's current epoch
  std::atomic<bool> stop_requested_{false};
};

}  // namespace keel
