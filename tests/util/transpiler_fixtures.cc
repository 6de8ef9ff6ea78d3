#include "tests/util/transpiler_fixtures.h"

#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"

namespace keel::testing {

void BuildTrainedMlp(Program& main, Program& startup) {
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 3, "tanh");
  Var cost = layers::mean(layers::cross_entropy(layers::fc(h, 2, "softmax"), y));
  optimizer::SGD(0.1f).minimize(cost, &startup);
}

fleet::Role TwoOfFour() {
  fleet::Role r;
  r.rank = 1;
  r.world_size = 4;
  r.local_world_size = 4;
  r.local_rank = 1;
  return r;
}

}  // namespace keel::testing
