// Runs a shell command for CLI tests: its exit code, whether a signal killed it, its output.
#pragma once

#include <string>

namespace keel::testing {

struct CommandResult {
  int exit_code = -1;
  bool signaled = false;  // killed by a signal (a crash)
  std::string output;     // stdout and stderr together
};

CommandResult RunCommand(const std::string& cmd);
// build/bin/<name> for a binary this build made.
std::string BinPath(const std::string& name);
// A fresh empty directory under /tmp, removed by the caller.
std::string MakeTempDir();
// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();

}  // namespace keel::testing
