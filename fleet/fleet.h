// fleet::: the user's facade for data-parallel training, after Paddle's Fleet (the seed's four
// steps): init with a role, a DistributedStrategy, distributed_optimizer(opt, strategy).minimize,
// and saving from rank 0.
//
//   fleet::init(fleet::CloudRoleMaker(true));
//   auto opt = fleet::distributed_optimizer(optimizer::SGD(0.01), strategy);
//   opt.minimize(cost, &startup_program);
//   Executor exe(fleet::worker_place());
//   ...
//   fleet::save_persistables(exe, "./model");
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "framework/dsl/optimizer.h"

namespace keel {
namespace fleet {

// Reads the role; with more than one worker, starts (rank 0) and joins the rendezvous store.
void init(const RoleMaker& role_maker = CloudRoleMaker(true));
bool initialized();
const Role& role();
int worker_index();
int worker_num();
bool is_first_worker();
// CUDAPlace(selected GPU) when FLAGS_selected_gpus names one, else CPUPlace.
Place worker_place();
// Waits until every worker arrives (through the store; works before any ring exists).
void barrier_worker();

class DistributedOptimizer {
 public:
  DistributedOptimizer(std::unique_ptr<optimizer::Optimizer> opt, DistributedStrategy strategy);
  // Backward, the optimizer's update ops, then (with more than one worker) the transpiler passes
  // the strategy asks for. Then ranks compare program fingerprints through the store: different
  // programs fail here, in seconds, naming the first differing op.
  std::vector<ParamGrad> minimize(Var loss, Program* startup = nullptr,
                                  const std::set<std::string>& no_grad_set = {});
  const DistributedStrategy& strategy() const { return strategy_; }

 private:
  std::shared_ptr<optimizer::Optimizer> opt_;
  DistributedStrategy strategy_;
};

template <typename Opt>
DistributedOptimizer distributed_optimizer(const Opt& opt, DistributedStrategy strategy = {}) {
  return DistributedOptimizer(opt.Clone(), std::move(strategy));
}

// The programs the last minimize() rewrote.
Program& main_program();
Program& startup_program();

// Rank 0 writes the persistables (atomically); the others wait at a barrier and write nothing.
// The barrier has its own, longer timeout (--save_timeout_s): saving may take a while.
// A checkpoint holds the user's variables, those of the program before transpiling: variables a
// pass made (LocalSGD's snapshots and counters) are left out, so that any strategy can resume it.
void save_persistables(Executor& exe, const std::string& dirname, const Program* program = nullptr);
// Loads a checkpoint into `program` (default: main_program()): the user's variables from the
// file, then the pass-made ones rebuilt by the startup ops that made them (a LocalSGD snapshot
// becomes the loaded parameter; counters restart).
void load_persistables(Executor& exe, const std::string& dirname, const Program* program = nullptr);
// The persistables the transpiler added to `program` (LocalSGD snapshots and counters): checkpoints
// leave them out, and rebuild_pass_made_vars recreates them from the loaded user variables.
std::set<std::string> pass_made_vars(const Program& program);
void rebuild_pass_made_vars(Executor& exe, const Program& program);
void save_inference_model(Executor& exe, const std::string& dirname,
                          const std::vector<std::string>& feeds,
                          const std::vector<std::string>& targets,
                          const Program* program = nullptr);

// Compares this rank's program with every other rank's through the store (rank 0 checks all,
// the others check rank 0's). A keel::Error names both fingerprints and the first differing op.
void CheckProgramsMatch(const Program& program, const std::string& what);

// Forgets the role, rings and store (tests that init several times in one process).
void reset();

}  // namespace fleet
}  // namespace keel
