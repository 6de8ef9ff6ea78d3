// Paddle's io API, which takes the executor: framework/io's functions work on a scope and a
// place; these pass the executor's (and load_checkpoint also sets the executor's run count).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/io/checkpoint.h"

namespace keel {

void save_persistables(Executor& exe, const std::string& dirname, const Program& program,
                       const std::set<std::string>& skip = {});
void load_persistables(Executor& exe, const std::string& dirname, const Program& program,
                       const std::set<std::string>& skip = {});
// framework/io's load_checkpoint into exe's scope and place; when the file holds a training
// state, also sets exe's run count of `program` to state.step (Executor::SetRunCount), so random
// ops continue with the draws of that step.
std::optional<TrainingState> load_checkpoint(Executor& exe, const std::string& dirname,
                                             const Program& program,
                                             const std::set<std::string>& skip = {});
void save_inference_model(const std::string& dirname, const std::vector<std::string>& feeds,
                          const std::vector<std::string>& targets, Executor& exe,
                          const Program& program);
InferenceModel load_inference_model(const std::string& dirname, Executor& exe);

}  // namespace keel
