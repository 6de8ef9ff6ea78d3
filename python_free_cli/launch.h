// keel launch: the multi-process launcher (Paddle's `-m paddle.distributed.launch`, torchrun).
// The subcommand itself is keel::cli::Launch in commands.h; this header holds what keel_main.cc
// needs before gflags runs.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace keel {
namespace cli {

// The arguments after `launch`, split into the launcher's flags and the worker command.
struct LaunchArgs {
  std::vector<std::string> flags;    // for gflags
  std::vector<std::string> command;  // COMMAND ARGS..., passed to every worker untouched
  // The flags given before the command, by name, with their values as typed (`--x` of a bool:
  // "true", `--nox`: "false"). Those that are not the launcher's own go to the workers.
  std::map<std::string, std::string> given;
};

// gflags permutes and parses flags anywhere on the line, so the worker's own flags
// (`keel launch ./train --steps=5`) must be cut off before it runs. The command starts at the
// first argument that is neither a flag nor the separate value of a non-bool flag
// (`--log_dir D`); a bare `--` also ends the launcher's flags and is dropped.
LaunchArgs SplitLaunchArgs(const std::vector<std::string>& args);

// Flags keel launch reads itself; any other flag given before the command is passed to every
// worker as FLAGS_name=value (and named in KEEL_LAUNCH_FLAGS, so that a worker that does not
// define it refuses to start).
bool IsLaunchFlag(const std::string& name);

}  // namespace cli
}  // namespace keel
