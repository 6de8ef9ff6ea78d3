// Pipeline stages in the DSL (docs/pipeline.md): ops built while a PipelineStageGuard lives carry
// op_device = "stage:<n>" (Paddle's device_guard("gpu:<n>")); with DistributedStrategy::pipeline,
// transpiler/pipeline_pass.h gives each rank of a pipeline group the ops of its stage. A model is
// built once, the same on every rank, every forward op inside some stage; without the pipeline
// switch the marks change nothing.
//
//   { PipelineStageGuard s0(0); h = layers::fc(x, 64, "relu"); }
//   { PipelineStageGuard s1(1); loss = layers::mean(layers::cross_entropy(layers::fc(h, 10,
//                                                   "softmax"), y)); }
#pragma once

#include <string>

namespace keel {

class PipelineStageGuard {
 public:
  // stage >= 0; a keel::Error otherwise.
  explicit PipelineStageGuard(int stage);
  ~PipelineStageGuard();
  PipelineStageGuard(const PipelineStageGuard&) = delete;
  PipelineStageGuard& operator=(const PipelineStageGuard&) = delete;

 private:
  int saved_;
};

// The stage ops are built in now; -1 outside any guard.
int current_pipeline_stage();
// "stage:<n>", the op_device value of stage n.
std::string PipelineStageName(int stage);

}  // namespace keel
