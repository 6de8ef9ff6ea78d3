// The `keel` binary's subcommands. Each takes argv after the subcommand name (flags already
// parsed by gflags) and returns the process exit code; keel::Error escapes to main.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "models/model_zoo.h"

namespace keel {
namespace cli {

int Train(const std::vector<std::string>& args);
// The ExecutionStrategy of --num_threads and --num_iteration_per_drop_scope.
ExecutionStrategy CliExecutionStrategy();
// fleet::init, then the named model with a distributed SGD (plain SGD for one worker).
models::TrainableModel BuildDistributedModel(const std::string& name, float lr, uint64_t seed);
// How one training step of `m` runs under keel train's flags (keel train and keel bench): the
// main program, or with --pp_degree > 1 this rank's pipeline stage as --micro_batches
// micro-batches; a fetched loss is then the global batch's mean on every rank.
using TrainingStepFn = std::function<std::vector<Tensor>(Executor& exe, const FeedMap& feed,
                                                         const std::vector<std::string>& fetch)>;
TrainingStepFn TrainingStep(const models::TrainableModel& m);
// --profile: writes this rank's Chrome trace and prints the per-op summary to stderr.
// Does nothing when the profiler is off.
void FinishProfile();
// On a parameter server of keel train or bench (after BuildDistributedModel): its startup, then
// (with `load_dir`) its blocks of that checkpoint, then its loop until every trainer stopped.
int RunParameterServer(const std::string& load_dir);
int Inspect(const std::vector<std::string>& args);
int Bench(const std::vector<std::string>& args);
// `keel launch [flags] COMMAND [ARGS...]`; `command` is COMMAND ARGS..., cut off before gflags
// ran by SplitLaunchArgs (launch.h), and `given` the flags given before it (LaunchArgs::given).
int Launch(const std::vector<std::string>& command,
           const std::map<std::string, std::string>& given);

}  // namespace cli
}  // namespace keel
