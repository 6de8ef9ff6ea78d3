// TensorParallelPass: the rings and the start of a tensor-parallel job (docs/tensor-parallel.md).
//
// The model itself is built tensor-parallel by the DSL (framework/dsl/tensor_parallel.h: sharded
// parameters cut from their full initial value by c_split in startup, c_identity /
// mp_allreduce_sum / c_split / c_concat on ring kTensorParallelRingId in main). This pass gives
// that ring to the program.
//
// Requires: main and startup built inside a TensorParallelGuard of options.degree (every c_split /
//   c_concat of either program has nranks == degree, else a keel::Error naming the op and var);
//   startup initializes every parameter.
// Guarantees, appended to startup: one c_comm_init of ring kTensorParallelRingId (degree ranks,
//   this rank `rank`, group `group`), then a c_broadcast from group rank 0 of every REPLICATED
//   parameter of main (every parameter that startup's c_split of a "@TP_FULL" var does not
//   write), then a c_sync_comm_stream: the ranks of a group start with the same replicated
//   parameters even without a program random seed (under AMP O2 each one's float32 master
//   first, then it). Sharded parameters (and O2 masters) are each rank's own.
//   In main, with AMP's loss scaling: right after check_finite_and_unscale, its FoundInfinite
//   becomes the maximum over the group (InsertOverflowFlagMax on ring kTensorParallelRingId): the
//   ranks check different shards of the sharded parameters' gradients, and must skip alike.
// Leaves alone: every other op of main (but checks them), every op already in startup.
#pragma once

#include <string>

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

// The ring id of the tensor-parallel group. Data-parallel rings use 0 .. 3 * 8 - 1 at most
// (nccl_comm_num <= 8 flat rings, plus two per flat ring under hierarchy); fleet's eager ring is
// INT_MAX.
inline constexpr int kTensorParallelRingId = 32;

struct TensorParallelOptions {
  int degree = 1;     // ranks of the tensor-parallel group
  int rank = 0;       // this rank's index in its group
  std::string group;  // the group's name (fleet::Topology::TpGroupName)
  int device = -1;    // this rank's GPU; -1 on CPU
};

class TensorParallelPass : public Pass {
 public:
  explicit TensorParallelPass(TensorParallelOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "tensor_parallel"; }
  void Apply(Program& main, Program& startup) const override;

 private:
  TensorParallelOptions options_;
};

}  // namespace transpiler
}  // namespace keel
