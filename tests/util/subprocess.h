// Runs a shell command for CLI tests: its exit code, whether a signal killed it, its output.
#pragma once

#include <cstdint>
#include <map>
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
// The keel binary of this build (build/bin/keel).
std::string Keel();
// A fresh empty directory under /tmp, removed by the caller.
std::string MakeTempDir();
// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();
// A TCP connection to 127.0.0.1:`port` (its fd), or -1 when it cannot be made (safe in a forked
// child: sockets only).
int ConnectLocal(int port);
// Whether `s` contains `part` (for checks on a command's output or a log).
bool Contains(const std::string& s, const std::string& part);
// name -> bytes of every tensor in DIR/persistables.safetensors: checkpoints compared bit for bit.
std::map<std::string, std::string> CheckpointTensorBytes(const std::string& dir);
// Whether python3 can import the real `tensorboard` package (its read-back checks skip without).
bool HaveTensorboard();
// tag -> step -> value of the event files under DIR, as TensorBoard's own reader reads them.
std::map<std::string, std::map<int64_t, double>> ReadTensorboardScalars(const std::string& dir);

}  // namespace keel::testing
