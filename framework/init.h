// keel::Init: gflags + glog, and Paddle-style FLAGS_name=value environment variables.
#pragma once

namespace keel {

// Parses command-line flags (removing them from argv), then applies every FLAGS_<name>=<value>
// in the environment that the command line did not set. An unknown FLAGS_ name is a warning;
// a malformed value is a keel::Error naming the variable.
void Init(int* argc, char*** argv);

// Applies FLAGS_ environment variables only (Init calls it). Returns how many were applied.
int ApplyFlagsFromEnv();

}  // namespace keel
