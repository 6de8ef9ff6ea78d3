// A test worker (tests/workers/NAME.cc) trained on 1 process or under `keel launch` on several,
// and the persistables it saved (<dir>/save/persistables.safetensors).
#pragma once

#include <string>

#include "framework/io/safetensors.h"

namespace keel::testing {

struct Trained {
  NamedTensors saved;  // empty when the run failed
  std::string output;  // the console, then every worker's log
};

// Runs `worker --out=<dir>/save<flags>` alone (nranks 1) or on nranks workers (one math thread
// each, logs under <dir>/log), EXPECTs exit 0 and loads what it saved.
Trained TrainWorker(const std::string& worker, int nranks, const std::string& dir,
                    const std::string& flags);

}  // namespace keel::testing
