// A transpiler pass rewrites a (main, startup) program pair. Each pass does one rewrite through
// the IR's own API and says, in its header, what it requires, guarantees and leaves alone; tests
// print the programs before and after (golden text).
//
// A pass takes its own options struct at construction (plain data: ring counts, ranks, sizes),
// which fleet fills from the user's DistributedStrategy and Role (fleet/transpile.h): the
// transpiler layer knows nothing of fleet's types, so a pass can be used, and tested, alone.
#pragma once

#include <string>

#include "framework/ir/program.h"

namespace keel {
namespace transpiler {

// The rings a data-parallel pass sets up in startup, and this rank's place on them.
struct RingOptions {
  int nrings = 1;     // rings gradients are spread over (DistributedStrategy::nccl_comm_num)
  int nranks = 1;     // ranks in the job
  int rank = 0;       // this rank
  int device = -1;    // this rank's GPU (c_comm_init's device_id); -1 on CPU
  std::string group;  // c_comm_init's group: which ranks meet ("": the whole job; a data-parallel
                      // group of a hybrid job: fleet::Topology::DpGroupName)
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  virtual void Apply(Program& main, Program& startup) const = 0;
};

}  // namespace transpiler
}  // namespace keel
