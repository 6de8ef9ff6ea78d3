// What the parameter-server ops share (ops/ps_ops.cc, ops/ps_sparse_ops.cc).
#pragma once

#include "framework/ir/program.h"
#include "framework/ps/ps_transport.h"

namespace keel {

// The parameter-server transport, connected on first use (this process's global rank from the
// job's CommContext; `op`'s pserver_num, and its mode when it has one).
ps::Transport& PsConnected(const OpDesc& op);

}  // namespace keel
