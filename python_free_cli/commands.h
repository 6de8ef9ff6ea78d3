// The `keel` binary's subcommands. Each takes argv after the subcommand name (flags already
// parsed by gflags) and returns the process exit code; keel::Error escapes to main.
#pragma once

#include <string>
#include <vector>

namespace keel {
namespace cli {

int Train(const std::vector<std::string>& args);
int Inspect(const std::vector<std::string>& args);
int Bench(const std::vector<std::string>& args);

}  // namespace cli
}  // namespace keel
