// RingModel: the α–β cost model of a ring's all-reduce, t(bytes) = alpha + beta * bytes,
// measured on the ring itself, and the fusion-group size it implies.
//
// fleet's minimize uses it to choose data-parallel fusion groups (transpiler/grad_allreduce_pass.h,
// group_bytes): a group closes once the all-reduce's fixed cost alpha is at most a tenth of its
// time, so small gradients share an all-reduce while large ones leave as soon as backward writes
// them. Rank 0 keeps the measured model in a per-host cache (RingModelCachePath), so later runs on
// the host choose the same groups (and resumed runs reduce in the same order) without measuring.
#pragma once

#include <optional>
#include <string>

namespace keel {

class Communicator;

struct RingModel {
  double alpha_s = 0;          // seconds per all-reduce, whatever its size
  double beta_s_per_byte = 0;  // seconds per byte of the buffer
};

// Times all-reduces of 1 KiB (alpha) and 4 MiB (beta) on `comm`, the best of a few each; every
// rank of the ring must call it together. Returns the model all ranks agree on (the largest alpha
// and beta any rank measured).
RingModel MeasureRingModel(Communicator& comm);

// The bytes at which a group's all-reduce spends at most a tenth of its time on alpha, rounded up
// to a power of two and kept within [64 KiB, 64 MiB]; the rounding keeps the choice stable across
// measurements that differ a little.
double GroupBytesFor(const RingModel& model);

// Where rank 0 caches the model of a ring of `backend` over `nranks` ranks on `nnodes` nodes:
// <dir>/ring-model-<backend>-<nranks>r<nnodes>n.txt, dir = --ring_model_cache, else
// $XDG_CACHE_HOME/keel, else $HOME/.cache/keel. Empty when --ring_model_cache=off or no directory
// can be named.
std::string RingModelCachePath(const std::string& backend, int nranks, int nnodes);

// The cached model, or nullopt when the file is absent or unreadable (a damaged file is logged
// and ignored: the ring is measured again).
std::optional<RingModel> LoadRingModel(const std::string& path);
// Writes the model (through a temporary file and rename); a failure is logged, never thrown.
void SaveRingModel(const std::string& path, const RingModel& model);

}  // namespace keel
