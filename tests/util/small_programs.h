// Small programs that several suites run.
#pragma once

#include "framework/dsl/layers.h"
#include "framework/ir/program.h"

namespace keel::testing {

// out = 2 * tanh(x) + 1 on x: float32 [-1, 3] (three ops: tanh, scale and the feed's data var).
struct TanhNet {
  Program main, startup;
  Var x, out;
  TanhNet();
};

}  // namespace keel::testing
