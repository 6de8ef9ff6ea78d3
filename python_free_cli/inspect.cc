// keel inspect: look at programs and checkpoints without training.
//   keel inspect FILE|DIR        a __model__ program as text, a .safetensors file as a table, a
//                                checkpoint directory as both (--dot: programs as Graphviz)
//   keel inspect --strategy [--model=NAME | FILE [--startup=FILE]] --nranks=N --nnodes=K
//                [keel train's strategy flags] [--diff] [--dot] [--program=main|startup|all]
//                the main and startup programs one rank of that job runs, transpiled here
//                without starting any worker (--diff: only what the transpiler changed)
//   keel inspect --summary [--model=NAME | FILE|DIR]
//                parameters with shapes and counts, totals, forward FLOPs per sample
#include <gflags/gflags.h>
#include <sys/stat.h>

#include <cstdio>
#include <memory>

#include "fleet/fleet.h"
#include "fleet/transpile.h"
#include "framework/dsl/amp.h"
#include "framework/error.h"
#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "python_free_cli/commands.h"
#include "python_free_cli/model_summary.h"
#include "python_free_cli/text_diff.h"
#include "python_free_cli/train_flags.h"

DEFINE_bool(dot, false, "keel inspect: print programs as Graphviz digraphs instead of text.");
DEFINE_bool(strategy, false,
            "keel inspect: transpile the program for --nranks/--nnodes and keel train's strategy "
            "flags, and print the main and startup programs one rank runs.");
DEFINE_int32(nranks, 2, "keel inspect --strategy: workers in the job.");
DEFINE_int32(rank, 0,
             "keel inspect --strategy: the rank whose programs are shown; -1: every rank's, in "
             "rank order.");
DEFINE_bool(ps, false,
            "keel inspect --strategy: a parameter-server job of --nservers servers (ranks "
            "0..nservers-1) and --nworkers trainers, in --ps_mode (docs/parameter-server.md).");
DEFINE_int32(nservers, 1, "keel inspect --strategy --ps: parameter servers.");
DEFINE_int32(nworkers, 2, "keel inspect --strategy --ps: trainers.");
DECLARE_string(ps_mode);  // train_flags.cc
DECLARE_int32(geo_k);
DECLARE_int32(ps_max_staleness);
DEFINE_bool(diff, false,
            "keel inspect --strategy: show only what the transpiler changed, as a line diff.");
DEFINE_string(program, "all", "keel inspect --strategy: main | startup | all.");
DEFINE_string(startup, "",
              "keel inspect --strategy FILE: the startup program saved with the __model__ "
              "(default: one that declares main's persistables and initializes nothing).");
DEFINE_bool(summary, false,
            "keel inspect: parameters with shapes and counts, totals, and forward FLOPs per "
            "sample of a built-in model (--model) or a saved program.");
DECLARE_string(model);
DECLARE_string(amp);
DECLARE_int32(nnodes);
DECLARE_int32(mlp_hidden);
DECLARE_string(data);
DECLARE_int32(batch_size);

namespace keel {
namespace cli {

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsDir(const std::string& path) {
  struct stat st;
  KEEL_ENFORCE(::stat(path.c_str(), &st) == 0, path, ": no such file or directory");
  return S_ISDIR(st.st_mode);
}

void PrintTensors(const std::string& path) {
  std::map<std::string, std::string> meta;
  NamedTensors ts = LoadSafetensors(path, &meta);
  std::printf("# %s: %zu tensors\n", path.c_str(), ts.size());
  for (auto& kv : meta) std::printf("# %s = %s\n", kv.first.c_str(), kv.second.c_str());
  for (auto& [name, t] : ts)
    std::printf("%s : %s%s\n", name.c_str(), DTypeName(t.dtype()), t.dims().str().c_str());
}

void PrintProgram(const std::string& path) {
  auto program = LoadProgram(path);
  std::fputs((FLAGS_dot ? program->ToDot() : program->ToText()).c_str(), stdout);
}

// A __model__ path: FILE itself, or DIR/__model__.
std::string ModelPath(const std::string& path) {
  if (!IsDir(path)) return path;
  std::string p = path + "/" + kModelFile;
  struct stat st;
  KEEL_ENFORCE(::stat(p.c_str(), &st) == 0, path, ": holds no ", kModelFile);
  return p;
}

// The built-in model's programs before any transpiling; `minimize` (may be empty) appends
// backward and the optimizer.
models::TrainableModel BuildLocal(models::MinimizeFn minimize,
                                  const TensorParallelConfig& tp = {}) {
  models::ModelConfig cfg;
  cfg.name = FLAGS_model;
  cfg.seed = 1;  // program text does not depend on it but for the seeds it records
  cfg.hidden = FLAGS_mlp_hidden;
  ModelSettingsFromFlags(&cfg, FLAGS_ps);
  TensorParallelGuard tp_group(tp);  // --tp_degree: this rank's shards
  cfg.data = FLAGS_data;
  cfg.batch_size = FLAGS_batch_size;
  cfg.make_optimizer = [](const std::string& default_name, float default_lr) {
    return OptimizerFromFlags(default_name, default_lr, 0);
  };
  cfg.minimize = std::move(minimize);
  cfg.programs_only = true;
  return models::BuildModel(cfg);
}

int StrategyOfRank(const std::vector<std::string>& args, int rank);

int Strategy(const std::vector<std::string>& args) {
  KEEL_ENFORCE(args.size() <= 1, "inspect --strategy takes at most one FILE|DIR, got ", args.size(),
               " arguments");
  if (FLAGS_ps) {
    KEEL_ENFORCE(FLAGS_nservers >= 1 && FLAGS_nworkers >= 1, "--nservers=", FLAGS_nservers,
                 " and --nworkers=", FLAGS_nworkers, " must be >= 1");
    KEEL_ENFORCE(!FlagIsSet("nranks") && !FlagIsSet("nnodes"),
                 "--nranks / --nnodes do not combine with --ps: the job is --nservers + "
                 "--nworkers processes");
    FLAGS_nranks = FLAGS_nservers + FLAGS_nworkers;
  } else {
    for (const char* f : {"nservers", "nworkers", "ps_mode", "geo_k", "ps_max_staleness"})
      KEEL_ENFORCE(!FlagIsSet(f), "--", f, " goes with inspect --strategy --ps");
  }
  KEEL_ENFORCE(FLAGS_nranks >= 1, "--nranks must be >= 1, got ", FLAGS_nranks);
  KEEL_ENFORCE(FLAGS_nnodes >= 1 && FLAGS_nranks % FLAGS_nnodes == 0, "--nnodes=", FLAGS_nnodes,
               " must divide --nranks=", FLAGS_nranks);
  KEEL_ENFORCE(FLAGS_rank >= -1 && FLAGS_rank < FLAGS_nranks, "--rank=", FLAGS_rank,
               " is not in 0..", FLAGS_nranks - 1, " (or -1: every rank)");
  KEEL_ENFORCE(FLAGS_program == "main" || FLAGS_program == "startup" || FLAGS_program == "all",
               "--program='", FLAGS_program, "' is not one of main, startup, all");
  KEEL_ENFORCE(!(FLAGS_diff && FLAGS_dot), "--diff and --dot do not combine: pick one");
  KEEL_ENFORCE(args.empty() || !FlagIsSet("model"),
               "--model and a FILE both name the program: pick one");
  KEEL_ENFORCE(!args.empty() || FLAGS_startup.empty(), "--startup goes with a saved FILE");
  if (FLAGS_rank >= 0) return StrategyOfRank(args, FLAGS_rank);
  for (int rank = 0; rank < FLAGS_nranks; ++rank) StrategyOfRank(args, rank);
  return 0;
}

// One rank's programs for --strategy.
int StrategyOfRank(const std::vector<std::string>& args, int rank) {
  fleet::Role role;
  role.world_size = FLAGS_nranks;
  role.rank = rank;
  role.local_world_size = FLAGS_nranks / FLAGS_nnodes;
  role.local_rank = rank % role.local_world_size;
  role.master_port = 1;  // no store is started: the passes only read ranks
  fleet::DistributedStrategy strategy = StrategyFromFlags();
  if (FLAGS_ps) {
    role.training_role = rank < FLAGS_nservers ? "PSERVER" : "TRAINER";
    role.server_num = FLAGS_nservers;
    role.trainer_num = FLAGS_nworkers;
    KEEL_ENFORCE(FLAGS_ps_mode == "sync" || FLAGS_ps_mode == "async" || FLAGS_ps_mode == "geo",
                 "--ps_mode='", FLAGS_ps_mode, "' is not one of sync, async, geo");
    KEEL_ENFORCE(FLAGS_ps_mode == "geo" || !FlagIsSet("geo_k"), "--geo_k goes with --ps_mode=geo");
    KEEL_ENFORCE(FLAGS_ps_mode == "async" || !FlagIsSet("ps_max_staleness"),
                 "--ps_max_staleness goes with --ps_mode=async");
    KEEL_ENFORCE(FLAGS_ps_mode != "geo" || FLAGS_geo_k >= 1,
                 "--ps_mode=geo needs --geo_k >= 1, got ", FLAGS_geo_k);
    // Trainers send gradients to servers: fusion (on by default here) steps aside, and asking
    // for it is refused by the strategy, naming it.
    if (!FlagIsSet("fuse_all_reduce_ops")) strategy.fuse_all_reduce_ops = false;
    strategy.a_sync = FLAGS_ps_mode != "sync";
    strategy.a_sync_configs.k_steps = FLAGS_ps_mode == "geo" ? FLAGS_geo_k : 0;
    if (FLAGS_ps_mode == "async") strategy.a_sync_configs.max_staleness = FLAGS_ps_max_staleness;
  }
  strategy.ApplyFlagOverrides();
  strategy.Validate(role);
  fleet::DistributedStrategy::RequireImplemented(strategy);

  std::string what, main_before, startup_before;
  std::unique_ptr<Program> main, startup;
  models::TrainableModel m;
  if (args.empty()) {
    what = "model " + FLAGS_model;
    m = BuildLocal(
        [&](Var loss, Program* st, const optimizer::Optimizer& opt) {
          // What fleet's minimize does before transpiling: recompute, then mixed precision
          // (its rewrite decided by this machine's CPU kernels, as keel train on it would run).
          auto o = opt.Clone();
          if (strategy.recompute) o->set_recompute(strategy.recompute_configs.checkpoints);
          if (strategy.amp)
            amp::decorate(*o, strategy.amp_configs).minimize(loss, st);
          else
            o->apply_gradients(o->backward(loss), st);
          main_before = loss.block()->program()->ToText();
          startup_before = st->ToText();
          fleet::Transpile(*loss.block()->program(), *st, strategy, role);
        },
        fleet::TensorParallelConfigFor(strategy, role));
  } else {
    // A saved training program has its backward and updates already: nothing to rewrite.
    KEEL_ENFORCE(!strategy.amp, "--amp=", FLAGS_amp,
                 " rewrites a program before its backward: give --model, not a saved FILE");
    KEEL_ENFORCE(!strategy.recompute,
                 "--recompute changes a program's backward: give --model, not a saved FILE");
    what = ModelPath(args[0]);
    main = LoadProgram(what);
    if (!FLAGS_startup.empty()) {
      startup = LoadProgram(FLAGS_startup);
    } else {
      startup = std::make_unique<Program>();
      for (const VarDesc* v : main->global_block().AllVars())
        if (v->persistable()) *startup->global_block().Var(v->name()) = *v;
    }
    main_before = main->ToText();
    startup_before = startup->ToText();
    fleet::Transpile(*main, *startup, strategy, role);
  }
  const Program& main_after = main ? *main : *m.main;
  const Program& startup_after = startup ? *startup : *m.startup;

  if (FLAGS_ps) {
    std::printf("# %s, parameter-server job of %d server(s) and %d trainer(s): rank %d is %s; %s\n",
                what.c_str(), FLAGS_nservers, FLAGS_nworkers, rank,
                role.is_server() ? StrCat("server ", rank).c_str()
                                 : StrCat("trainer ", role.trainer_id()).c_str(),
                strategy.ToString().c_str());
  } else {
    std::printf("# %s, rank %d of %d on %d node(s); %s\n", what.c_str(), rank, FLAGS_nranks,
                FLAGS_nnodes, strategy.ToString().c_str());
  }
  auto show = [&](const char* name, const Program& after, const std::string& before) {
    if (FLAGS_program != "all" && FLAGS_program != name) return;
    if (FLAGS_dot) {
      std::fputs(after.ToDot().c_str(), stdout);
      return;
    }
    if (FLAGS_diff) {
      std::string d = LineDiff(before, after.ToText());
      std::printf("# ---- %s program: transpiler changes (-before +after)\n%s", name,
                  d.empty() ? "# (none)\n" : d.c_str());
      return;
    }
    std::printf("# ---- %s program\n%s", name, after.ToText().c_str());
  };
  show("main", main_after, main_before);
  show("startup", startup_after, startup_before);
  return 0;
}

int Summary(const std::vector<std::string>& args) {
  KEEL_ENFORCE(args.size() <= 1, "inspect --summary takes at most one FILE|DIR, got ", args.size(),
               " arguments");
  KEEL_ENFORCE(args.empty() || !FlagIsSet("model"),
               "--model and a FILE both name the program: pick one");
  if (args.empty()) {
    models::TrainableModel m = BuildLocal(nullptr);
    std::fputs(SummarizeModel(*m.test, "model " + FLAGS_model).text.c_str(), stdout);
  } else {
    std::string path = ModelPath(args[0]);
    std::fputs(SummarizeModel(*LoadProgram(path), path).text.c_str(), stdout);
  }
  return 0;
}

}  // namespace

int Inspect(const std::vector<std::string>& args) {
  KEEL_ENFORCE(!(FLAGS_strategy && FLAGS_summary), "--strategy and --summary: pick one");
  if (FLAGS_strategy) return Strategy(args);
  if (FLAGS_summary) return Summary(args);
  for (const char* f : {"nranks", "rank", "nnodes", "diff", "program", "startup", "model", "ps"})
    KEEL_ENFORCE(!FlagIsSet(f), "--", f, " goes with inspect --strategy",
                 std::string(f) == "model" ? " or --summary" : "");
  KEEL_ENFORCE(args.size() == 1, "inspect takes one FILE or DIR, got ", args.size(), " arguments");
  const std::string& path = args[0];
  // --dot prints a program's digraph and nothing else, so that the output goes to `dot` as it is:
  // a directory's tensors are left out, and a tensors file alone is an error.
  if (IsDir(path)) {
    bool any = false;
    struct stat st;
    for (const std::string& f : {kModelFile, kParamsFile, kPersistablesFile}) {
      std::string p = path + "/" + f;
      if (::stat(p.c_str(), &st) != 0) continue;
      any = true;
      if (f == kModelFile)
        PrintProgram(p);
      else if (!FLAGS_dot)
        PrintTensors(p);
    }
    KEEL_ENFORCE(any, path, ": holds none of ", kModelFile, ", ", kParamsFile, ", ",
                 kPersistablesFile);
    struct stat model;
    KEEL_ENFORCE(!FLAGS_dot || ::stat((path + "/" + kModelFile).c_str(), &model) == 0,
                 "--dot draws a program, and ", path, " holds no ", kModelFile, " (only tensors)");
    return 0;
  }
  if (EndsWith(path, ".safetensors")) {
    KEEL_ENFORCE(!FLAGS_dot, "--dot draws a program, and ", path, " holds tensors");
    PrintTensors(path);
  } else {
    PrintProgram(path);
  }
  return 0;
}

}  // namespace cli
}  // namespace keel
