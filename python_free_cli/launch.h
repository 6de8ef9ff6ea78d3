// keel launch: the multi-process launcher (Paddle's `-m paddle.distributed.launch`, torchrun).
// The subcommand itself is keel::cli::Launch in commands.h; this header holds what keel_main.cc
// needs before gflags runs.
#pragma once

#include <string>
#include <vector>

namespace keel {
namespace cli {

// The arguments after `launch`, split into the launcher's flags and the worker command.
struct LaunchArgs {
  std::vector<std::string> flags;    // for gflags
  std::vector<std::string> command;  // COMMAND ARGS..., passed to every worker untouched
};

// gflags permutes and parses flags anywhere on the line, so the worker's own flags
// (`keel launch ./train --steps=5`) must be cut off before it runs. The command starts at the
// first argument that is neither a flag nor the separate value of a non-bool flag
// (`--log_dir D`); a bare `--` also ends the launcher's flags and is dropped.
LaunchArgs SplitLaunchArgs(const std::vector<std::string>& args);

}  // namespace cli
}  // namespace keel
