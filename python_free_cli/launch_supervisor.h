// keel launch's supervisor (launch_supervisor.cc says how it watches the workers).
#pragma once

#include "python_free_cli/launch_plan.h"

namespace keel {
namespace cli {

// Starts the plan's workers and supervises them until they have all ended; returns the
// launcher's exit code: 0, the failed worker's (128 + its signal when killed), or 128 + the
// signal that stopped the job.
int SuperviseWorkers(const LaunchPlan& plan);

}  // namespace cli
}  // namespace keel
