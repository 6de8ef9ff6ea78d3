#include "framework/dsl/pipeline.h"

#include "framework/error.h"

namespace keel {

namespace {
int& CurrentStage() {
  static thread_local int stage = -1;
  return stage;
}
}  // namespace

PipelineStageGuard::PipelineStageGuard(int stage) : saved_(CurrentStage()) {
  KEEL_ENFORCE(stage >= 0, "PipelineStageGuard: stage ", stage, " must be >= 0");
  CurrentStage() = stage;
}

PipelineStageGuard::~PipelineStageGuard() { CurrentStage() = saved_; }

int current_pipeline_stage() { return CurrentStage(); }

std::string PipelineStageName(int stage) { return "stage:" + std::to_string(stage); }

}  // namespace keel
