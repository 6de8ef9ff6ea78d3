// keel: train | inspect | bench | launch | flags. `keel help` lists them.
//
// python_free_cli/ holds the `keel` binary, one file (or a few) per subcommand: train*.cc,
// inspect.cc (with model_summary, text_diff), bench.cc, launch*.cc (the plan, the supervisor, the
// sentinel) with process_util.cc, help.cc, and this entry point. The folder keeps the name the
// design card gave it ("no Python needed to train"); there is no Python in keel.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/init.h"
#include "framework/profiler/profiler.h"
#include "python_free_cli/commands.h"
#include "python_free_cli/help.h"
#include "python_free_cli/launch.h"

namespace {

const char* kUsage =
    "usage: keel <command> [flags] [args]\n"
    "commands:\n"
    "  train    train a built-in model: keel train --model=mlp|lenet|resnet|transformer|ctr\n"
    "  launch   start this node's workers: keel launch --nproc_per_node=N COMMAND [ARGS...]\n"
    "           (--max_restarts=N restarts every worker on a failure, up to N times)\n"
    "  inspect  print a saved program, safetensors file or checkpoint; --strategy: the programs\n"
    "           a job's workers would run; --summary: parameters and FLOPs of a model\n"
    "  bench    time a built-in model's training step, all-reduce under keel launch, or the\n"
    "           GEMM on the MLP's shapes (keel bench gemm)\n"
    "  flags    list every flag keel defines with the commands that read it\n"
    "run `keel <command> --help` for its flags\n";

bool AsksForHelp(const std::vector<std::string>& flags) {
  for (const std::string& a : flags)
    if (a == "--help" || a == "-help" || a == "-h" || a == "--helpshort") return true;
  return false;
}

bool DefinedIn(const gflags::CommandLineFlagInfo& info, const char* dir) {
  return info.filename.find(dir) != std::string::npos;
}

// Flags defined by the keel binary itself (python_free_cli/), with their current state.
std::vector<gflags::CommandLineFlagInfo> KeelCliFlags() {
  std::vector<gflags::CommandLineFlagInfo> all, out;
  gflags::GetAllFlags(&all);
  for (auto& info : all)
    if (DefinedIn(info, "python_free_cli/")) out.push_back(info);
  return out;
}

// The flags of the keel binary's own (defined in python_free_cli/) that each subcommand reads.
// Given to another subcommand they would be ignored, so they are refused there. Library flags
// (--comm_timeout_s, --profile, ...) and glog's apply to every command; keel launch passes every
// flag that is not its own to the workers (launch.h).
const std::map<std::string, std::set<std::string>>& CommandFlags() {
  static const std::map<std::string, std::set<std::string>> flags = [] {
    // By the file that defines them: train*.cc belong to train, train_flags.cc (model, optimizer
    // and strategy settings) also to bench and inspect, bench.cc to bench, inspect.cc to inspect.
    std::set<std::string> train, model, bench, inspect;
    for (const gflags::CommandLineFlagInfo& info : KeelCliFlags()) {
      if (DefinedIn(info, "python_free_cli/train")) train.insert(info.name);
      if (DefinedIn(info, "python_free_cli/train_flags")) model.insert(info.name);
      if (DefinedIn(info, "python_free_cli/bench")) bench.insert(info.name);
      if (DefinedIn(info, "python_free_cli/inspect")) inspect.insert(info.name);
    }
    for (const char* n : {"model", "data", "batch_size", "mlp_hidden", "seed", "num_threads"}) {
      model.insert(n);
    }
    std::map<std::string, std::set<std::string>> f;
    f["train"] = train;
    f["train"].insert(model.begin(), model.end());
    f["bench"] = model;
    f["bench"].insert(bench.begin(), bench.end());
    f["bench"].insert("cuda_graph");  // timing replayed steps
    f["inspect"] = model;
    f["inspect"].insert(inspect.begin(), inspect.end());
    f["inspect"].insert("nnodes");
    return f;
  }();
  return flags;
}

// Refuses a keel_cli flag that `cmd` does not read, naming the commands that do.
void CheckCommandFlags(const std::string& cmd) {
  auto it = CommandFlags().find(cmd);
  if (it == CommandFlags().end()) return;
  for (const gflags::CommandLineFlagInfo& info : KeelCliFlags()) {
    if (info.is_default || it->second.count(info.name)) continue;
    std::string owners;
    for (const auto& [other, names] : CommandFlags())
      if (names.count(info.name)) owners += (owners.empty() ? "keel " : ", keel ") + other;
    if (keel::cli::IsLaunchFlag(info.name))
      owners += (owners.empty() ? "" : ", ") + std::string("keel launch");
    KEEL_THROW("--", info.name, " is not a flag of keel ", cmd,
               " (it would be ignored; it is a flag of ", owners.empty() ? "no command" : owners,
               ")");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") ||
      !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  if (cmd == "flags") {
    // Every flag keel defines, with who reads it: "NAME COMMANDS" (a keel_cli flag), "NAME
    // library" or "NAME launch". Tests walk this list.
    std::vector<gflags::CommandLineFlagInfo> all;
    gflags::GetAllFlags(&all);
    for (const auto& info : all) {
      std::string owner;
      if (DefinedIn(info, "python_free_cli/")) {
        for (const auto& [c, names] : CommandFlags())
          if (names.count(info.name)) owner += (owner.empty() ? "" : ",") + c;
        if (keel::cli::IsLaunchFlag(info.name))
          owner += (owner.empty() ? "" : ",") + std::string("launch");
      } else if (DefinedIn(info, "framework/") || DefinedIn(info, "fleet/") ||
                 DefinedIn(info, "ops/") || DefinedIn(info, "executor/") ||
                 DefinedIn(info, "transpiler/") || DefinedIn(info, "models/")) {
        owner = "library";
      } else {
        continue;  // glog's and gflags' own
      }
      std::printf("%s %s\n", info.name.c_str(), owner.empty() ? "none" : owner.c_str());
    }
    return 0;
  }
  // Drop the subcommand so gflags sees only flags and positional args. For launch, gflags sees
  // only the launcher's flags: the worker command and its flags pass through untouched.
  std::vector<std::string> tail(argv + 2, argv + argc), launch_command;
  std::map<std::string, std::string> launch_given;
  if (cmd == "launch") {
    keel::cli::LaunchArgs split = keel::cli::SplitLaunchArgs(tail);
    tail = split.flags;
    launch_command = split.command;
    launch_given = split.given;
  }
  const std::string help = keel::cli::CommandHelp(cmd);
  if (!help.empty() && AsksForHelp(tail)) {
    std::fputs(help.c_str(), stdout);
    return 0;
  }
  std::vector<char*> rest{argv[0]};
  for (std::string& a : tail) rest.push_back(a.data());
  int n = static_cast<int>(rest.size());
  char** av = rest.data();
  gflags::SetUsageMessage(kUsage);
  try {
    keel::Init(&n, &av);
    CheckCommandFlags(cmd);
    // --profile is for the programs that run ops; the launcher passes it to its workers.
    if (cmd == "launch" || cmd == "inspect") keel::profiler::Disarm();
    std::vector<std::string> args(av + 1, av + n);
    if (cmd == "train") return keel::cli::Train(args);
    if (cmd == "inspect") return keel::cli::Inspect(args);
    if (cmd == "bench") return keel::cli::Bench(args);
    if (cmd == "launch") {
      args.insert(args.end(), launch_command.begin(), launch_command.end());
      return keel::cli::Launch(args, launch_given);
    }
    std::fprintf(stderr, "keel: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const keel::Error& e) {
    std::fprintf(stderr, "keel %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
