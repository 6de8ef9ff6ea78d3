// keel: train | inspect | bench | launch. `keel help` lists them.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/init.h"
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
    "  bench    time a built-in model's training step (or `allreduce` under keel launch, or\n"
    "           `gemm`: the GEMM on the MLP's shapes), one\n"
    "           JSON line: keel bench mlp|lenet|resnet|transformer|allreduce|gemm\n"
    "  launch   start this node's workers of a job: keel launch [flags] COMMAND [ARGS...]\n"
    "           --nproc_per_node=N | --selected_gpus=0,1  --nnodes=K --node_rank=R\n"
    "           --cluster_node_ips=IP,IP --node_ip=IP --started_port=P --master_addr=A\n"
    "           --master_port=P --log_dir=DIR (default log) --grace_period_s=S\n"
    "run `keel <command> --help` for all flags\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") ||
      !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  // Drop the subcommand so gflags sees only flags and positional args. For launch, gflags sees
  // only the launcher's flags: the worker command and its flags pass through untouched.
  std::vector<std::string> tail(argv + 2, argv + argc), launch_command;
  if (cmd == "launch") {
    keel::cli::LaunchArgs split = keel::cli::SplitLaunchArgs(tail);
    tail = split.flags;
    launch_command = split.command;
  }
  std::vector<char*> rest{argv[0]};
  for (std::string& a : tail) rest.push_back(a.data());
  int n = static_cast<int>(rest.size());
  char** av = rest.data();
  gflags::SetUsageMessage(kUsage);
  try {
    keel::Init(&n, &av);
    std::vector<std::string> args(av + 1, av + n);
    if (cmd == "train") return keel::cli::Train(args);
    if (cmd == "inspect") return keel::cli::Inspect(args);
    if (cmd == "bench") return keel::cli::Bench(args);
    if (cmd == "launch") {
      args.insert(args.end(), launch_command.begin(), launch_command.end());
      return keel::cli::Launch(args);
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
