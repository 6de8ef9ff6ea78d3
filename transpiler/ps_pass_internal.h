// Helpers the parameter-server pass's files share (transpiler/ps_pass.cc, transpiler/ps_tables.cc:
// distributed embedding tables). Not an interface of its own.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "transpiler/ps_pass.h"

namespace keel {
namespace transpiler {
namespace ps_internal {

// An op's input and output arguments.
std::vector<std::string> Args(const OpDesc& op);
// Declares `name` in `b` as a copy of `like` with dims `shape` (and `persistable`).
VarDesc* Declare(Block& b, const std::string& name, const VarDesc& like,
                 const std::vector<int64_t>& shape, bool persistable);
// Appends an op of role Optimize (completed with its schema's defaults).
OpDesc* Append(Block& b, const std::string& type, const OpDesc::VarMap& ins,
               const OpDesc::VarMap& outs, const std::map<std::string, Attribute>& attrs);
OpDesc* AppendCopy(Block& b, const OpDesc& op);

// Whether parameter `p` (of main block `b`) is an is_distributed embedding table: every
// lookup_table of it says so (a mix is a keel::Error), and there is one.
bool IsDistributedTable(const Block& b, const PsPlan::Param& p);

// Trainer: table p's lookup_table becomes distributed_lookup_table, its lookup_table_grad
// distributed_lookup_table_grad, in place.
void ReplaceDistributedLookup(Block& b, const PsPlan::Param& p, int nservers, int mode);

// What a server's listen_and_serv lists of the distributed tables it holds a shard of.
struct ServerTables {
  std::vector<std::string> names, state, ids, grads;
  std::vector<int> slots, blocks, state_counts, dists;
  std::vector<int64_t> heights, widths, seeds;
  std::vector<float> state_values, as, bs;
};
// Server: distributed table p's shard, its optimize block, into `t` (ps_tables.cc says how).
void AddServerTable(const PsPlan::Param& p, const Block& om, Program& main, Program& startup,
                    int ntrainers, bool async, ServerTables* t);

}  // namespace ps_internal
}  // namespace transpiler
}  // namespace keel
