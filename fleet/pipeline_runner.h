// PipelineRunner: runs one pipeline stage's program (transpiler/pipeline_pass.h) a mini-batch at a
// time, as Paddle's section worker does (docs/pipeline.md).
//
// The stage program splits by op role into three sections: forward (the ops before the first
// Backward op), backward (up to the first Optimize op) and optimizer (the rest). A mini-batch's
// rows split into M micro-batches; forward and backward run once per micro-batch, the optimizer
// once per mini-batch (it reads the gradients the backward section accumulated).
//
// Each micro-batch in flight owns its state: the vars forward writes and backward reads (its
// activations, and those received from the previous stage) are taken out of the executor's
// scope after its forward run and handed back, without copies, to its backward run. Schedules:
//   F-then-B: the M forwards, then the M backwards: up to M micro-batches in flight;
//   1F1B:     S - stage - 1 forwards of warm-up, then one forward and one backward alternately,
//             then the remaining backwards: at most S - stage micro-batches in flight.
// Every stage runs forwards and backwards in micro-batch order, and transfers pair by (peer, tag,
// ordinal) (framework/comm/communicator.h) and sends never wait, so neither schedule can deadlock
// or pair a receive with another micro-batch's send.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/role.h"

namespace keel {
namespace fleet {

struct PipelineRunOptions {
  int stages = 1;
  int stage = 0;
  int micro_batches = 1;
  int micro_batch_size = 0;  // > 0: a mini-batch must hold micro_batches * this many rows
  bool one_f_one_b = true;   // false: F-then-B
};

// From DistributedStrategy::pipeline_configs and the role's place in the topology.
PipelineRunOptions PipelineRunOptionsFor(const DistributedStrategy& strategy, const Role& role);

class PipelineRunner {
 public:
  // `stage_program`: this rank's stage as the pipeline pass left it (and the data-parallel
  // passes after it). A keel::Error when its ops are not in forward, backward, optimizer order.
  PipelineRunner(Executor& exe, const Program& stage_program, PipelineRunOptions options);

  // One mini-batch: `feed` holds the whole mini-batch of the data vars (this stage takes the ones
  // its program reads, split by rows into micro-batches; rows must divide by micro_batches).
  // `fetch`: vars of this stage's forward section, returned as their mean over the micro-batches
  // (float types; for a mean loss, the mini-batch's loss), or persistables of the stage (the
  // learning rate) as the step left them. A keel::Error names a fetch this stage does not
  // compute.
  std::vector<Tensor> Step(const FeedMap& feed, const std::vector<std::string>& fetch = {});

  // Evaluation: forward only, in inference mode (the forward section as clone_for_test makes it:
  // dropout and batch norm switched to test), over `feed`'s rows split into M micro-batches when
  // they divide (else one). Every stage of the pipeline calls it with the same batch; `fetch`
  // (vars this stage's forward computes: the last stage's metrics) comes back as the mean over
  // the micro-batches. Nothing is stashed or accumulated, and no parameter changes.
  std::vector<Tensor> Evaluate(const FeedMap& feed, const std::vector<std::string>& fetch);

  // The most micro-batches this stage held in flight during the last Step.
  int peak_in_flight() const { return peak_; }
  const Program& forward_section() const { return *fwd_; }
  const Program& backward_section() const { return *bwd_; }
  const Program& optimizer_section() const { return *opt_; }

 private:
  struct MicroBatch;
  void Forward(MicroBatch& mb, const std::vector<std::string>& fetch);
  void Backward(MicroBatch& mb);

  Executor& exe_;
  PipelineRunOptions o_;
  std::unique_ptr<Program> fwd_, bwd_, opt_, test_;
  std::vector<std::string> stash_;                         // written by forward, read by backward
  std::set<std::string> fwd_data_, bwd_data_, test_data_;  // data vars each section reads
  std::set<std::string> fwd_written_, persistables_;
  int in_flight_ = 0, peak_ = 0;
};

}  // namespace fleet
}  // namespace keel
