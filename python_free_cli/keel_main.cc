// keel: train | inspect | bench | launch | flags. `keel help` lists them.
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
#include "python_free_cli/launch.h"

namespace {

const char* kUsage =
    "usage: keel <command> [flags] [args]\n"
    "commands:\n"
    "  train    train a built-in model: --model=mlp|lenet|resnet|transformer --steps=N\n"
    "           --epochs=E --batch_size=B --optimizer=sgd|momentum|adam|adamw --lr=F --seed=S\n"
    "           --data=mnist:DIR --save_dir=DIR --load_dir=DIR --fetch_frequency=K\n"
    "  inspect  print a saved program (__model__) or safetensors file, or a checkpoint dir\n"
    "  bench    time a built-in model's training step (or `allreduce` under keel launch), one\n"
    "           JSON line: keel bench mlp|lenet|resnet|transformer|allreduce\n"
    "  launch   start this node's workers of a job: keel launch [flags] COMMAND [ARGS...]\n"
    "           --nproc_per_node=N | --selected_gpus=0,1  --nnodes=K --node_rank=R\n"
    "           --cluster_node_ips=IP,IP --node_ip=IP --started_port=P --master_addr=A\n"
    "           --master_port=P --log_dir=DIR (default log) --grace_period_s=S\n"
    "           --cpu_math_threads=T; any other flag before COMMAND goes to every worker\n"
    "  flags    list every flag keel defines with the commands that read it\n"
    "run `keel <command> --help` for all flags\n";

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
  static const std::set<std::string> model = {"batch_size",
                                              "lr",
                                              "optimizer",
                                              "data",
                                              "mlp_hidden",
                                              "nccl_comm_num",
                                              "local_sgd_steps",
                                              "local_sgd_warmup_steps",
                                              "hierarchical_allreduce_inter_nranks",
                                              "fuse_all_reduce_ops"};
  static const std::map<std::string, std::set<std::string>> flags = [] {
    std::map<std::string, std::set<std::string>> f;
    f["train"] = model;
    f["train"].insert({"model", "steps", "epochs", "seed", "save_dir", "save_inference_dir",
                       "load_dir", "fetch_frequency", "num_iteration_per_drop_scope",
                       "log_all_ranks"});
    f["bench"] = model;
    f["bench"].insert({"bench_steps", "bench_warmup", "bench_numel"});
    f["inspect"] = {"dot"};
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
