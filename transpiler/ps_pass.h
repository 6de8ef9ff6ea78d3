// ParameterServerPass: Paddle's DistributeTranspiler in synchronous mode
// (docs/parameter-server.md). From the single-device programs minimize left, it makes the programs
// of one process of a parameter-server job: a trainer's (options.server_index = -1) or server
// server_index's. Servers hold the parameters and run the optimizer; trainers run forward and
// backward, send gradients and receive parameters.
//
// Requires: main holds forward, backward (each parameter gradient's last writer before the
//   optimizer section) and the optimizer section as minimize left it: every op with op_role
//   Optimize either updates one parameter (op_role_var = [param, grad]: sgd, momentum, adam, ...
//   and weight decay's scale/sum) or belongs to no parameter (the learning-rate schedule:
//   increment, lr_schedule), reading no gradient. Parameters have known shapes. Startup
//   initializes each parameter and each optimizer state var by ops that write only it.
//   An optimize op over several parameters (clip_by_global_norm, check_finite_and_unscale) is a
//   keel::Error naming it (not built).
// Guarantees (PlanParameterServer): the updated parameters, in the order of their first update
//   op, are cut into whole-row blocks by Paddle's slice_variable rule (SliceRows: at most
//   nservers blocks, each of at least min_block_size elements but the last, rows rounded up),
//   named "<param>.block<i>" (the parameter's own name when it is one block), and the blocks,
//   in that order, are dealt round-robin to the servers (block k to server k % nservers); a
//   gradient's blocks follow its parameter's ("<grad>.block<i>").
//   trainer main: the optimizer section is removed (with the vars only it used); right after the
//     last writer of each gradient, a send of its blocks to their servers; at the end
//     send_barrier, a recv per parameter (into its blocks), fetch_barrier, and a concat (axis 0)
//     of each split parameter's blocks into the parameter.
//   trainer startup: the initializers of parameters, optimizer state and learning rate are
//     removed; instead each parameter is received from the servers (recv, fetch_barrier,
//     concat): every trainer starts from the servers' values.
//   server main: block 0 holds its blocks (persistable), the optimizer state of its blocks
//     ("<state>.block<i>", row-sliced when the state has the parameter's shape, a copy per block
//     otherwise, e.g. Adam's beta powers), the learning-rate vars, and one listen_and_serv op
//     whose sub-blocks are: the learning-rate schedule (lr_decay_block_id; run once per step),
//     then per block of this server: sum of the trainers' gradients "<grad block>.trainer_<t>",
//     scale by 1/ntrainers, and the parameter's update ops on the block (vars renamed). Its State
//     input lists PsServerState (for checkpoints: a trainer may ask for it between steps).
//   server startup: the learning rate's initializers; per parameter with blocks here its
//     initializer (the whole parameter, as in one process, then split along rows into the
//     blocks), and its state's initializers per block (fill_constant given the block's shape;
//     another initializer of the whole state, then split).
//   Async mode (options.mode = kAsync): the same programs but for the server's optimize blocks,
//     which apply one trainer's gradient as it arrives (no sum over trainers, no 1/ntrainers:
//     listen_and_serv's Grads are the blocks' gradients themselves, "<grad block>"), and the
//     attr mode = 1 on send, recv and listen_and_serv (the server serves each trainer's step on
//     its own; the trainer's send_barrier / fetch_barrier wait for its own transfers only).
//     With the communicator (send_queue_size > 0) the trainer's startup fetch_barrier carries
//     its attrs (send_queue_size, max_merge_var_num, max_staleness), and main's recv ops,
//     fetch_barrier and concats move from the end of the step to its start, before the first op
//     that reads a parameter they write: the ops before it (a distributed table's lookups, which
//     ask the servers for rows) overlap the communicator's last push and pull.
//   GEO mode (options.mode = kGeo, Paddle's GeoCommunicator): the trainer keeps its whole program
//     (forward, backward, optimizer, learning rate, optimizer state and their initializers) and
//     a persistable snapshot "<param>@GEO_OLD" of each parameter; at the end of main one
//     geo_communicate op which, every geo_k-th run, sends each block's (param - old) / ntrainers,
//     receives the servers' blocks into the parameter and sets old = param. Its startup receives
//     the parameters from the servers (as sync's) and copies them into the snapshots. Each
//     server holds its parameter blocks only (no optimizer state, no learning rate); its optimize
//     blocks add a trainer's delta "<block>@GEO_DELTA" to the block (sum), served as in async
//     mode (mode=2).
//   Sparse embedding tables (docs/sparse-embeddings.md): a parameter whose gradient is
//     row-sparse (is_sparse) is cut and dealt as any other, its send says is_sparse (per block:
//     the row count, then rows + values), and a server's sync optimize block merges the
//     trainers' parts with merge_sparse_grad (row by row in trainer order, then 1/ntrainers)
//     instead of sum and scale; listen_and_serv lists them in RowGrads (sparse_blocks). A table
//     every lookup_table of which says is_distributed (one lookup; needs is_sparse; not in GEO
//     mode) gets one plan block per server (block k on server k, named after the table, rows
//     -1; its slot is its first block's): the trainer's lookup_table and lookup_table_grad become
//     distributed_lookup_table and distributed_lookup_table_grad, its send says is_distributed
//     (row id to server id % nservers), and the table, its row-shaped state and their
//     initializers leave the trainer. Each server lists its shard in listen_and_serv's TableVars
//     (table, "<table>@IDS", row-shaped state), the trainers' row gradients after the sparse
//     blocks' in RowGrads, and the table's optimize block (merge, then its update ops) in
//     table_blocks; its startup keeps the table's row_seeded_random and the row-shaped state's
//     fill_constant in place but of [0, D] (later initializers draw what they draw in one
//     process). PsServerState lists a table's state that is not row-shaped (Adam's beta powers,
//     a copy on each server); the shard's rows and row-shaped state go to a checkpoint after it
//     (fleet/ps_checkpoint.h).
//   Trainers (options.worker_memory_mb > 0): a trainer program whose persistable vars exceed the
//     budget is refused naming the largest.
//   So a sync step of W trainers on b rows each updates the parameters as one process on the
//   W x b rows (the mean of the trainers' mean gradients is the mean gradient of all rows).
// Leaves alone: forward and backward ops (the trainer's), sub-blocks of the trainer's program, the
//   random seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

// Rows per block of a var of dims `shape` cut for `nservers` servers (Paddle's slice_variable).
std::vector<int64_t> SliceRows(const std::vector<int64_t>& shape, int nservers,
                               int64_t min_block_size = 8192);

struct PsPlan {
  struct Block {
    std::string param, grad;  // the whole parameter and its gradient
    std::string name, grad_name;
    int index = 0;     // in the parameter (0..)
    int64_t rows = 0;  // its rows
    int64_t row0 = 0;  // its first row in the parameter
    int server = 0;
  };
  struct Param {
    std::string name, grad;
    std::vector<int64_t> shape;
    std::vector<int> blocks;         // indices into PsPlan::blocks
    std::vector<std::string> state;  // persistable vars of its update ops (not the rate)
    std::vector<size_t> ops;         // its update ops, indices into main's block 0
    bool sparse = false;             // its gradient is row-sparse (an is_sparse embedding)
    // An is_distributed embedding table: it lives on the servers only, id on server id % S (one
    // block per server, each named after the table, rows = -1: created on first touch).
    bool distributed = false;
    bool split() const { return blocks.size() > 1; }
  };
  std::vector<Param> params;
  std::vector<Block> blocks;
  std::vector<size_t> lr_ops;        // optimize ops of no parameter (learning-rate schedule)
  std::vector<std::string> lr_vars;  // the persistable vars they and the updates share
};
PsPlan PlanParameterServer(const Program& main, int nservers, int64_t min_block_size = 8192);

// What server `server` holds besides its parameter blocks, in the order its listen_and_serv lists
// it (slot State; what a checkpoint pulls): the persistable learning-rate vars (a constant rate, a
// schedule's step counter; not the rate a schedule computes each step), then per parameter with
// blocks there, per state var, per block of this server its copy. `var` is the single-device var it
// belongs to: rows [row0, row0 + rows) of it when rows >= 0, else all of it (an unsplit
// parameter's state, a per-block copy of a scalar such as Adam's beta powers, the learning rate).
struct PsStateBlock {
  std::string name, var;
  int64_t row0 = 0, rows = -1;
  std::vector<int64_t> dims;  // of `name`
};
std::vector<PsStateBlock> PsServerState(const PsPlan& plan, const Program& main, int server);

// A trainer's forward-only program (an evaluation program: clone_for_test of the single-device
// main) under the same plan: each lookup_table of a distributed table becomes
// distributed_lookup_table (the table's rows from the servers, as the trainer's main program
// fetches them) and the table leaves the program. `mode` and `nservers` as the job's.
void RewriteDistributedLookups(Program& program, const PsPlan& plan, int nservers, int mode);

// Paddle's modes (DistributedStrategy.a_sync / a_sync_configs.k_steps): the attr "mode" of send,
// recv and listen_and_serv.
enum class PsMode : int { kSync = 0, kAsync = 1, kGeo = 2 };

struct PsOptions {
  PsMode mode = PsMode::kSync;
  int geo_k = 0;  // kGeo: push every geo_k steps (>= 1)
  int nservers = 1;
  int ntrainers = 1;
  int server_index = -1;  // -1: a trainer's programs; else that server's
  int64_t min_block_size = 8192;
  // A trainer's budget (MiB; 0: none) for its persistable vars: a trainer program that needs
  // more is refused naming the largest (DistributedStrategy::ps_worker_memory_mb).
  int64_t worker_memory_mb = 0;
  // kAsync: the trainer's communicator (the startup's fetch_barrier's attrs;
  // DistributedStrategy.a_sync_configs).
  int send_queue_size = 16;
  int max_merge_var_num = 1;
  int max_staleness = 0;
};

class ParameterServerPass : public Pass {
 public:
  explicit ParameterServerPass(PsOptions options) : options_(options) {}
  std::string name() const override { return "parameter_server"; }
  void Apply(Program& main, Program& startup) const override;

 private:
  void ApplyTrainer(const PsPlan& plan, Program& main, Program& startup) const;
  void ApplyServer(const PsPlan& plan, Program& main, Program& startup) const;
  void ApplyGeoTrainer(const PsPlan& plan, Program& main, Program& startup) const;
  PsOptions options_;
};

}  // namespace transpiler
}  // namespace keel
