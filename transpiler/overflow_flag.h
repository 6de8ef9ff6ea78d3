// The AMP overflow flag agreed by a group of ranks that check different gradients (ZeRO-1 owners,
// pipeline stages): check_finite_and_unscale's FoundInfinite is made the maximum over the ring,
// so that every rank of the group skips the same steps and moves the loss scale alike.
#pragma once

#include <cstddef>
#include <string>

#include "framework/ir/program.h"

namespace keel {
namespace transpiler {

// The int32 twin of the flag `found` that the reduction carries ("<found>@ALLREDUCE_INT").
std::string OverflowFlagIntName(const std::string& found);

// Inserts at `at`, with op_role `role`: cast(found -> int32 twin), c_sync_calc_stream,
// c_allreduce_max and c_sync_comm_stream of the twin on ring `ring_id`, cast(twin -> found,
// bool). The collectives carry no bool, hence the int32 twin. With `local_false` the rank has no
// gradient to check: the twin is filled with 0 instead of cast from `found` (which this rank
// then only writes). Returns the index after the last inserted op.
size_t InsertOverflowFlagMax(Block& b, size_t at, const std::string& found, int ring_id, int role,
                             bool local_false = false);

}  // namespace transpiler
}  // namespace keel
