#include "executor/executor_io.h"

namespace keel {

void save_persistables(Executor& exe, const std::string& dirname, const Program& program,
                       const std::set<std::string>& skip) {
  save_persistables(exe.scope(), dirname, program, skip);
}

void load_persistables(Executor& exe, const std::string& dirname, const Program& program,
                       const std::set<std::string>& skip) {
  load_persistables(exe.scope(), exe.place(), dirname, program, skip);
}

std::optional<TrainingState> load_checkpoint(Executor& exe, const std::string& dirname,
                                             const Program& program,
                                             const std::set<std::string>& skip) {
  std::optional<TrainingState> state =
      load_checkpoint(exe.scope(), exe.place(), dirname, program, skip);
  if (state) exe.SetRunCount(program, state->step);
  return state;
}

void save_inference_model(const std::string& dirname, const std::vector<std::string>& feeds,
                          const std::vector<std::string>& targets, Executor& exe,
                          const Program& program) {
  save_inference_model(dirname, feeds, targets, exe.scope(), program);
}

InferenceModel load_inference_model(const std::string& dirname, Executor& exe) {
  return load_inference_model(dirname, exe.scope(), exe.place());
}

}  // namespace keel
