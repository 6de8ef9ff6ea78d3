#include "transpiler/transpile.h"

#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/local_sgd_pass.h"
#include "transpiler/merge_optimizer_pass.h"

namespace keel {
namespace transpiler {

void TranspileCollective(Program& main, Program& startup,
                         const fleet::DistributedStrategy& strategy, const fleet::Role& role) {
  if (role.world_size <= 1) return;
  if (strategy.use_local_sgd) {
    LocalSGDPass().Apply(main, startup, strategy, role);
  } else {
    GradAllReducePass().Apply(main, startup, strategy, role);
    // One optimizer op per fused gradient group (one CUDA launch each); none without fusion.
    MergeOptimizerOpsPass().Apply(main, startup, strategy, role);
  }
}

}  // namespace transpiler
}  // namespace keel
