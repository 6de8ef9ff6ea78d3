// A transpiler pass rewrites a (main, startup) program pair for a strategy and a role.
// Each pass does one rewrite through the IR's own API and says, in its header, what it requires,
// guarantees and leaves alone; tests print the programs before and after (golden text).
#pragma once

#include <string>

#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "framework/ir/program.h"

namespace keel {
namespace transpiler {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  virtual void Apply(Program& main, Program& startup, const fleet::DistributedStrategy& strategy,
                     const fleet::Role& role) const = 0;
};

}  // namespace transpiler
}  // namespace keel
