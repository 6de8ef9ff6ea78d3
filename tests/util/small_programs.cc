#include "tests/util/small_programs.h"

#include "framework/dsl/program_guard.h"

namespace keel::testing {

TanhNet::TanhNet() {
  ProgramGuard g(main, startup);
  x = layers::data("x", {-1, 3});
  out = layers::scale(layers::tanh(x), 2.0f, 1.0f);
}

}  // namespace keel::testing
