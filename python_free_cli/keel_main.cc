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
#include "python_free_cli/help.h"
#include "python_free_cli/launch.h"

namespace {

const char* kUsage =
    "usage: keel <command> [flags] [args]\n"
    "commands:\n"
    "  train    train a built-in model: keel train --model=mlp|lenet|resnet|transformer\n"
    "  launch   start this node's workers: keel launch --nproc_per_node=N COMMAND [ARGS...]\n"
    "  inspect  print a saved program, safetensors file or checkpoint; --strategy: the programs\n"
    "           a job's workers would run; --summary: parameters and FLOPs of a model\n"
    "  bench    time a built-in model's training step, or all-reduce under keel launch\n"
    "run `keel <command> --help` for its flags\n";

bool AsksForHelp(const std::vector<std::string>& flags) {
  for (const std::string& a : flags)
    if (a == "--help" || a == "-help" || a == "-h" || a == "--helpshort") return true;
  return false;
}

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
