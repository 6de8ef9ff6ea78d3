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
//   double acc = fleet::metrics::acc(correct, total);   // over every rank's shard
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "framework/comm/communicator.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/tensor_parallel.h"

namespace keel {
namespace transpiler {
struct PsPlan;
}
namespace fleet {

// Reads the role; with more than one worker, starts (rank 0) and joins the rendezvous store, then
// checks that every rank has the same ring configuration (--cpu_comm_backend), naming it if not.
void init(const RoleMaker& role_maker = CloudRoleMaker(true));
bool initialized();
const Role& role();
int worker_index();
int worker_num();
bool is_first_worker();
// Parameter-server mode (fleet::init(CloudRoleMaker(false)), docs/parameter-server.md):
// worker_index and worker_num count the trainers; a server runs its programs with run_server, a
// trainer calls stop_worker once it has run its last step (the servers then stop).
bool is_server();
bool is_worker();
int server_num();
int server_index();
// Runs startup_program() (the server's blocks and optimizer state) and main_program()
// (listen_and_serv) until every trainer has called stop_worker. With `load_dir`, between the two
// the server takes its blocks (and their optimizer state, the learning rate) from the checkpoint
// there, one a parameter-server job of any shape saved (fleet/ps_checkpoint.h): the trainers'
// startup then receives the checkpoint's parameters.
void run_server(Executor& exe, const std::string& load_dir = "");
// Tells every server this trainer is done (after its last step); in sync mode every trainer
// must have run the same number of steps, or the servers end the job naming the two trainers.
void stop_worker();
// CUDAPlace(selected GPU) when FLAGS_selected_gpus names one, else CPUPlace.
Place worker_place();
// The tensor-parallel group this worker builds its model in (docs/tensor-parallel.md): build
// inside `TensorParallelGuard tp(fleet::tensor_parallel_config(strategy));` with the strategy
// given to distributed_optimizer. Degree 1 (plain layers) without strategy.tensor_parallel.
TensorParallelConfig tensor_parallel_config(const DistributedStrategy& strategy);
// Waits until every worker arrives (through the store; works before any ring exists). Arrival is
// bounded by FLAGS_comm_timeout_s (the error names the ranks that did not arrive); a peer whose
// process exits or is killed fails the wait at once, naming its rank.
// In parameter-server mode the trainers meet (on fleet's ring of the trainers); a server may not
// call it.
void barrier_worker();

// In parameter-server mode all_reduce and the metrics reduce over the trainers only, on a ring of
// theirs (a server may not call them).
// `tensor` reduced over all workers, in place on every worker (paddle.distributed.all_reduce):
// a collective outside any program, for metrics and other host-side values. Every worker must
// call it in the same order with the same dtype and shape. It runs on a ring of its own, created
// at the first call; a CUDA tensor is staged through host memory. One worker: unchanged.
void all_reduce(Tensor* tensor, ReduceOp op = ReduceOp::kSum);

// Global metrics from per-worker partial values (Paddle's fleet.metrics), each an all_reduce.
namespace metrics {
double sum(double local);
double max(double local);
double min(double local);
// Accuracy over all workers: sum(correct) / sum(total); 0 when the total is 0.
double acc(double correct, double total);
}  // namespace metrics

class DistributedOptimizer {
 public:
  DistributedOptimizer(std::unique_ptr<optimizer::Optimizer> opt, DistributedStrategy strategy);
  // Backward, the optimizer's update ops, then (with more than one worker) the transpiler passes
  // the strategy asks for. Then ranks compare the fingerprints of the main program and the startup
  // program (initializer seeds aside: parameters come from rank 0) through the store: a
  // difference fails here, in seconds, naming the first differing op. A program can be minimized
  // once (a keel::Error says so otherwise); several programs each once are fine.
  std::vector<ParamGrad> minimize(Var loss, Program* startup = nullptr,
                                  const std::set<std::string>& no_grad_set = {});
  const DistributedStrategy& strategy() const { return strategy_; }
  // The learning-rate var its minimize created (fetch it to log the rate; the optimizer passed to
  // distributed_optimizer was copied and knows none).
  const std::string& learning_rate_var() const {
    return amp_ ? amp_->inner().learning_rate_var() : opt_->learning_rate_var();
  }
  // With strategy().amp: the mixed-precision optimizer minimize() used (its loss-scaling vars).
  const amp::MixedPrecisionOptimizer* amp_optimizer() const { return amp_.get(); }

 private:
  std::shared_ptr<optimizer::Optimizer> opt_;
  std::shared_ptr<amp::MixedPrecisionOptimizer> amp_;
  DistributedStrategy strategy_;
};

template <typename Opt>
DistributedOptimizer distributed_optimizer(const Opt& opt, DistributedStrategy strategy = {}) {
  return DistributedOptimizer(opt.Clone(), std::move(strategy));
}

// The programs the last minimize() rewrote.
Program& main_program();
Program& startup_program();

// Rank 0 writes the persistables (atomically); the others write nothing and return at once. No
// worker waits for another (as in Paddle's collective fleet), so
// `if (fleet::worker_index() == 0) fleet::save_persistables(...)` works too. A worker that reads
// the files back must first meet rank 0, e.g. at barrier_worker().
// A checkpoint holds the user's variables, those of the program before transpiling: variables a
// pass made (LocalSGD's snapshots and counters) are left out, so that any strategy can resume it.
// Gradient merge's buffers and counter belong to the user's program (it runs on one worker too):
// a checkpoint holds them, and a resume continues an accumulation where it stopped.
// In parameter-server mode trainer 0 writes (the others return at once), between two steps: the
// single-device program's persistables, its parameters and the optimizer state and learning rate
// pulled from every server (the servers answer while they wait for the next step), so one process
// loads it with load_persistables on the program it built before fleet. In GEO mode: the servers'
// parameters and trainer 0's own optimizer state (fleet/ps_checkpoint.h).
// Under DistributedStrategy::sharding every rank must call it (the optimizer state of other
// owners is gathered to rank 0, ShardedStateOnRankZero), and the checkpoint is complete: one
// process, or a job of another world size, loads it. Likewise under pipeline and tensor
// parallelism: every rank calls it, rank 0 gathers the other stages' persistables and the other
// ranks' shards, and writes the single-device program's persistables (whole tensors, the names
// one process has), fleet/model_parallel_checkpoint.h; load_persistables gives each stage its
// own and each tensor-parallel rank its part.
void save_persistables(Executor& exe, const std::string& dirname, const Program* program = nullptr);
// Under sharding, for the lifetime of this object the scope of each data-parallel group's first
// rank (rank 0 without pipeline or tensor parallelism) also holds the optimizer state of the
// parameters the group's other ranks own (broadcast by the owners on the group's ring: a
// collective every rank enters, in the same order); nothing otherwise. For a checkpoint rank 0
// writes (gathering the other stages and shards from those ranks, model_parallel_checkpoint.h).
class ShardedStateOnRankZero {
 public:
  ShardedStateOnRankZero(Executor& exe, const Program& program);
  ~ShardedStateOnRankZero();
  ShardedStateOnRankZero(const ShardedStateOnRankZero&) = delete;
  ShardedStateOnRankZero& operator=(const ShardedStateOnRankZero&) = delete;

 private:
  Scope* scope_;
  std::vector<std::string> gathered_;
};
// Under sharding, erases from `scope` the optimizer state of the parameters this rank does not own
// (a loaded checkpoint holds every owner's); rebuild_pass_made_vars calls it.
// Loads a checkpoint into `program` (default: main_program()): the user's variables from the
// file, then the pass-made ones rebuilt by the startup ops that made them (a LocalSGD snapshot
// becomes the loaded parameter; counters restart).
void load_persistables(Executor& exe, const std::string& dirname, const Program* program = nullptr);
// The persistables the transpiler added to `program` (LocalSGD snapshots and counters): checkpoints
// leave them out, and rebuild_pass_made_vars recreates them from the loaded user variables.
// In parameter-server mode: the persistables of a trainer's or server's program that the
// single-device program lacks (blocks, GEO's snapshots).
std::set<std::string> pass_made_vars(const Program& program);
// Parameter-server mode: the single-device main program minimize split into `program` (a
// trainer's or a server's main) and its plan; nullptr when `program` is no such program.
const Program* ps_single_device_program(const Program& program);
const transpiler::PsPlan* ps_plan(const Program& program);
// Parameter-server mode: makes `test`, a forward-only program cloned from the single-device main
// before minimize (an evaluation program), run on a trainer of `main`: each lookup of a
// distributed table fetches the batch's rows from the servers as `main`'s lookup does
// (transpiler::RewriteDistributedLookups). Nothing to do (a no-op) when `main` has no such table.
void ps_program_for_test(const Program& main, Program* test);
// With `steps_done` >= 0 (a checkpoint's training step): also sets the state that counts steps
// (LocalSGD's step and since-average counters) to where the interrupted run was, and refuses a
// LocalSGD checkpoint taken between two averages (keel::Error). With several workers it also
// refuses a gradient-merge checkpoint taken between two merge steps (each worker's merge buffers
// are its own; the checkpoint holds rank 0's).
void rebuild_pass_made_vars(Executor& exe, const Program& program, int64_t steps_done = -1);
void DropUnownedState(Scope& scope, const Program& program);
void save_inference_model(Executor& exe, const std::string& dirname,
                          const std::vector<std::string>& feeds,
                          const std::vector<std::string>& targets,
                          const Program* program = nullptr);

// Compares this rank's program with every other rank's through the store (rank 0 checks all,
// the others check rank 0's). A keel::Error names both fingerprints and the first differing op.
// Every rank must make the same sequence of checks (each call has store keys of its own).
void CheckProgramsMatch(const Program& program, const std::string& what);

// Forgets the role, rings and store (tests that init several times in one process).
void reset();

}  // namespace fleet
}  // namespace keel
