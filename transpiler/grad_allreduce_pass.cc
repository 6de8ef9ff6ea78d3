#include "transpiler/grad_allreduce_pass.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "framework/op/op_registry.h"
#include "transpiler/amp_pass.h"
#include "transpiler/flat_buffer.h"
#include "transpiler/gradient_merge_pass.h"
#include "transpiler/pipeline_pass.h"

namespace keel {
namespace transpiler {

namespace {

int Role(const OpDesc& op) { return op.HasAttr(kOpRoleAttr) ? op.Attr<int>(kOpRoleAttr) : 0; }

constexpr int kBackward = static_cast<int>(OpRole::kBackward);
constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);
constexpr int kLoss = static_cast<int>(OpRole::kLoss);

// Inserts a collective op X -> Out at `index` and runs its shape inference.
OpDesc* InsertCollective(Block& block, size_t index, const std::string& type, const std::string& x,
                         const std::string& out, int ring, int role,
                         std::map<std::string, Attribute> attrs = {}) {
  OpDesc* op = block.InsertOp(index, type);
  op->SetInput("X", {x});
  op->SetOutput("Out", {out});
  op->SetAttr("ring_id", ring);
  op->SetAttr(kOpRoleAttr, role);
  for (auto& kv : attrs) op->SetAttr(kv.first, kv.second);
  InferShapeAtBuild(op, &block);
  return op;
}

// The same on `var` in place (X = Out = var).
OpDesc* InsertInPlace(Block& block, size_t index, const std::string& type, const std::string& var,
                      int ring, int role, std::map<std::string, Attribute> attrs = {}) {
  return InsertCollective(block, index, type, var, var, ring, role, std::move(attrs));
}

// Whether the gradients are divided by the ranks after their all-reduce (float16's: a gradient
// divided first may fall below float16's smallest normal, 6e-5, and lose bits) rather than
// through the loss gradient (float32's and bfloat16's, which has float32's range: dividing by a
// power of two first gives the same bits, and saves a pass over every gradient).
bool ScalesAfterAllReduce(DType comm) { return comm == DType::kFloat16; }

// The all-reduce of float32 `var` on `ring` at `index`: c_sync_calc_stream then c_allreduce_sum
// in place; with a 16-bit `comm` (fp16_allreduce) a cast to "<var>.cast_<comm>" first, the
// copy all-reduced, then a cast back into `var`, and for float16 its scale by 1/nranks in float32
// (the loss gradient is not scaled then). A bfloat16 `var` under a bfloat16 `comm` (a gradient
// made in 16 bits where it is computed, transpiler/narrow_grads_pass.h) is all-reduced in place
// as it is. Returns the number of ops inserted.
size_t InsertAllReduce(Block& mb, size_t index, const std::string& var, int ring, DType comm,
                       int nranks, int role = kBackward) {
  const VarDesc* v = mb.MustFindVar(var);
  if (comm == DType::kFloat32 || (v->dtype() == comm && !ScalesAfterAllReduce(comm))) {
    InsertInPlace(mb, index, "c_sync_calc_stream", var, ring, role);
    InsertInPlace(mb, index + 1, "c_allreduce_sum", var, ring, role);
    return 2;
  }
  KEEL_ENFORCE(v->dtype() == DType::kFloat32, "fp16_allreduce: gradient '", var, "' is ",
               DTypeName(v->dtype()), "; fp16_allreduce casts float32 gradients only",
               v->dtype() == comm ? " (and all-reduces bfloat16 ones as they are; a float16 one "
                                    "would need its 1/nranks scale in float16)"
                                  : "");
  const std::string low = var + ".cast_" + AmpDTypeSuffix(comm);
  KEEL_ENFORCE(mb.FindVar(low) == nullptr, "fp16_allreduce: the program already has a var named '",
               low, "' (transpiled twice?)");
  VarDesc* lv = mb.Var(low);
  lv->set_dtype(comm);
  lv->set_shape(v->shape());
  lv->set_stop_gradient(true);
  auto cast = [&](size_t at, const std::string& x, const std::string& out, DType from, DType to) {
    OpDesc* op = mb.InsertOp(at, "cast");
    op->SetInput("X", {x});
    op->SetOutput("Out", {out});
    op->SetAttr("in_dtype", static_cast<int>(from));
    op->SetAttr("out_dtype", static_cast<int>(to));
    op->SetAttr(kOpRoleAttr, role);
    InferShapeAtBuild(op, &mb);
  };
  cast(index, var, low, DType::kFloat32, comm);
  InsertInPlace(mb, index + 1, "c_sync_calc_stream", low, ring, role);
  InsertInPlace(mb, index + 2, "c_allreduce_sum", low, ring, role);
  cast(index + 3, low, var, comm, DType::kFloat32);
  if (!ScalesAfterAllReduce(comm)) return 4;
  OpDesc* s = mb.InsertOp(index + 4, "scale");
  s->SetInput("X", {var});
  s->SetOutput("Out", {var});
  s->SetAttr("scale", 1.0f / static_cast<float>(nranks));
  s->SetAttr(kOpRoleAttr, role);
  InferShapeAtBuild(s, &mb);
  return 5;
}

// Hierarchical all-reduce: rings nrings + r (inside a node of k ranks) and 2 * nrings + r (across
// nodes, among ranks of one local index) for flat ring r.
struct Hierarchy {
  bool on = false;
  int k = 1;  // ranks per node
};

// A parameter gradient and the op that last writes it, in the order backward produces them.
struct Grad {
  std::string param, name;
  size_t writer;
};

// One fused all-reduce: its gradients (slices of one buffer, in this order).
struct Group {
  std::vector<std::string> names;
  std::vector<int64_t> numels;
  DType dtype = DType::kFloat32;
  double bytes = 0;
  size_t last_writer = 0;
};

const VarDesc& KnownGrad(const Block& mb, const std::string& name) {
  const VarDesc* v = mb.MustFindVar(name);
  KEEL_ENFORCE(v->dims().known(), "fuse_all_reduce_ops: gradient '", name, "' has shape ",
               v->dims().str(), "; only gradients of known shape can be fused");
  return *v;
}

void AddToGroup(const Block& mb, const Grad& g, Group* grp) {
  const VarDesc& v = KnownGrad(mb, g.name);
  grp->dtype = v.dtype();
  grp->names.push_back(g.name);
  grp->numels.push_back(v.dims().numel());
  grp->bytes += static_cast<double>(v.dims().numel()) * SizeOf(v.dtype());
  grp->last_writer = std::max(grp->last_writer, g.writer);
}

// keel's grouping (fuse_grad_size_in_MB / _num): each dtype's gradients, in order, in groups of up
// to `limit_bytes` and `limit_num` tensors (a gradient of another dtype between two does not close
// a group); a gradient bigger than the size limit is a group alone.
std::vector<Group> GroupBySize(const Block& mb, const std::vector<Grad>& grads, double limit_bytes,
                               size_t limit_num) {
  std::vector<Group> groups;
  std::map<DType, size_t> open;  // the group each dtype fills
  for (const Grad& g : grads) {
    const VarDesc& v = KnownGrad(mb, g.name);
    const double bytes = static_cast<double>(v.dims().numel()) * SizeOf(v.dtype());
    auto it = open.find(v.dtype());
    if (it == open.end() || groups[it->second].names.size() >= limit_num ||
        groups[it->second].bytes + bytes > limit_bytes) {
      it = open.insert_or_assign(v.dtype(), groups.size()).first;
      groups.emplace_back();
    }
    AddToGroup(mb, g, &groups[it->second]);
  }
  return groups;
}

// Grouping from the ring's cost model: each dtype's gradients, in order, until the group holds
// `enough_bytes` (where the all-reduce's fixed cost stops mattering), never past `limit_bytes` and
// `limit_num` tensors. Small gradients share an all-reduce; a large one leaves on its own as soon
// as backward writes it.
std::vector<Group> GroupUntil(const Block& mb, const std::vector<Grad>& grads, double enough_bytes,
                              double limit_bytes, size_t limit_num) {
  std::vector<Group> groups;
  std::map<DType, size_t> open;  // the group each dtype fills, while not enough
  for (const Grad& g : grads) {
    const VarDesc& v = KnownGrad(mb, g.name);
    const double bytes = static_cast<double>(v.dims().numel()) * SizeOf(v.dtype());
    auto it = open.find(v.dtype());
    if (it == open.end() || groups[it->second].names.size() >= limit_num ||
        groups[it->second].bytes + bytes > limit_bytes) {
      it = open.insert_or_assign(v.dtype(), groups.size()).first;
      groups.emplace_back();
    }
    Group& grp = groups[it->second];
    AddToGroup(mb, g, &grp);
    if (grp.bytes >= enough_bytes) open.erase(it);
  }
  return groups;
}

// Paddle's grouping (FLAGS_fuse_parameter_memory_size / _groups_size, after its
// coalesce_grad_tensor_pass): a layer's gradients (parameter names up to the first '.') form one
// group in the order layers first appear; memory 0 puts every gradient in one group; memory > 0
// merges consecutive layers until a group reaches `memory_mb` or (groups_size > 1) holds more
// than groups_size gradients. Each group then splits by dtype.
std::vector<Group> GroupLikePaddle(const Block& mb, const std::vector<Grad>& grads,
                                   double memory_mb, int groups_size) {
  std::vector<std::vector<const Grad*>> layers;
  if (memory_mb == 0) {
    layers.emplace_back();
    for (const Grad& g : grads) layers.back().push_back(&g);
  } else {
    std::map<std::string, size_t> layer_of;
    for (const Grad& g : grads) {
      const std::string key = g.param.substr(0, g.param.find('.'));
      auto it = layer_of.emplace(key, layers.size()).first;
      if (it->second == layers.size()) layers.emplace_back();
      layers[it->second].push_back(&g);
    }
  }
  if (memory_mb > 0) {
    std::vector<std::vector<const Grad*>> merged;
    for (size_t j = 0; j < layers.size();) {
      merged.emplace_back();
      double bytes = 0;
      while (j < layers.size()) {
        for (const Grad* g : layers[j]) {
          const VarDesc& v = KnownGrad(mb, g->name);
          bytes += static_cast<double>(v.dims().numel()) * SizeOf(v.dtype());
          merged.back().push_back(g);
        }
        ++j;
        if (groups_size > 1 && merged.back().size() > static_cast<size_t>(groups_size)) break;
        if (bytes / (1024.0 * 1024.0) >= memory_mb) break;
      }
    }
    layers = std::move(merged);
  }
  std::vector<Group> groups;
  for (const auto& layer : layers) {
    std::map<DType, size_t> by_dtype;  // group index per dtype, in order of first appearance
    for (const Grad* g : layer) {
      DType t = KnownGrad(mb, g->name).dtype();
      auto it = by_dtype.emplace(t, groups.size()).first;
      if (it->second == groups.size()) groups.emplace_back();
      AddToGroup(mb, *g, &groups[it->second]);
    }
  }
  return groups;
}

// A cast that AMP put after backward's 16-bit gradient of a parameter, out of the block until
// that gradient's all-reduce is placed.
struct DeferredCast {
  std::unique_ptr<OpDesc> op;
  std::string low;  // the 16-bit gradient it reads
};

bool IsSixteenBit(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// AMP (Paddle's update_role_var_grad): each gradient in `grads` whose last writer is a cast (cast
// or cast_grad) to float32 of a 16-bit var that no other op reads becomes that 16-bit var, written
// by the op that last wrote it (which takes over the op_role_var pair). The casts leave the block
// and are returned, to go back after the all-reduces. `grads` stays in writer order.
std::vector<DeferredCast> AllReduceSixteenBitSources(Block& mb, std::vector<Grad>* grads) {
  std::vector<DeferredCast> deferred;
  for (Grad& g : *grads) {
    const OpDesc& cast = *mb.op(g.writer);
    if (cast.type() != "cast" && cast.type() != "cast_grad") continue;
    const std::vector<std::string> in = cast.InputArgumentNames();
    const std::vector<std::string> out = cast.OutputArgumentNames();
    if (in.size() != 1 || out.size() != 1 || out[0] != g.name) continue;
    const VarDesc* lv = mb.FindVar(in[0]);
    const VarDesc* gv = mb.FindVar(g.name);
    if (lv == nullptr || gv == nullptr || !IsSixteenBit(lv->dtype()) ||
        gv->dtype() != DType::kFloat32)
      continue;
    std::optional<size_t> source;  // the op that last writes the 16-bit gradient before the cast
    bool read_elsewhere = false;
    for (size_t i = 0; i < mb.num_ops(); ++i) {
      if (i == g.writer) continue;
      const OpDesc& op = *mb.op(i);
      for (const std::string& a : op.InputArgumentNames()) read_elsewhere |= a == in[0];
      if (i < g.writer)
        for (const std::string& a : op.OutputArgumentNames())
          if (a == in[0]) source = i;
    }
    if (read_elsewhere || !source) continue;
    OpDesc& src = *mb.op(*source);
    std::vector<std::string> pairs;
    if (src.HasAttr(kOpRoleVarAttr)) pairs = src.Attr<std::vector<std::string>>(kOpRoleVarAttr);
    pairs.push_back(g.param);
    pairs.push_back(in[0]);
    src.SetAttr(kOpRoleVarAttr, pairs);
    DeferredCast d{std::make_unique<OpDesc>(cast), in[0]};
    // Named as derived from the 16-bit gradient, as weight decay's ops are
    // (merge_optimizer_pass.h).
    d.op->SetAttr(kOpRoleVarAttr, std::vector<std::string>{g.param, in[0]});
    const size_t removed = g.writer;
    mb.RemoveOp(removed);
    for (Grad& other : *grads)
      if (other.writer > removed) --other.writer;
    g.name = d.low;
    g.writer = *source;
    deferred.push_back(std::move(d));
  }
  std::stable_sort(grads->begin(), grads->end(),
                   [](const Grad& a, const Grad& b) { return a.writer < b.writer; });
  return deferred;
}

// Puts each deferred cast back right after the last collective that writes its 16-bit gradient
// or the fused buffer that holds it (its all-reduce, or a hierarchical all-gather).
void PlaceDeferredCasts(Block& mb, std::vector<DeferredCast> deferred) {
  std::map<std::string, std::string> buffer_of;  // a fused gradient -> its buffer
  for (size_t i = 0; i < mb.num_ops(); ++i) {
    const OpDesc& op = *mb.op(i);
    if (op.type() != "coalesce_tensor") continue;
    for (const std::string& a : op.Output("Output")) buffer_of[a] = op.Output("FusedOutput")[0];
  }
  // From the last, each right after its collective: casts of one collective keep their order.
  for (size_t d = deferred.size(); d-- > 0;) {
    auto it = buffer_of.find(deferred[d].low);
    const std::string& target = it == buffer_of.end() ? deferred[d].low : it->second;
    std::optional<size_t> at;
    for (size_t i = 0; i < mb.num_ops(); ++i) {
      const OpDesc& op = *mb.op(i);
      if (!op.HasAttr("ring_id") || op.type() == "c_sync_calc_stream" ||
          op.type() == "c_sync_comm_stream")
        continue;
      for (const std::string& a : op.OutputArgumentNames())
        if (a == target) at = i + 1;
    }
    CHECK(at.has_value()) << "no collective writes " << target;
    mb.InsertOp(*at, std::move(deferred[d].op));
  }
}

// Splits each backward op that writes parameter gradients (op_role_var) and other outputs too,
// when its type computes its outputs apart (OpTraits::outputs_apart) and collectives were placed
// right after it (an all-reduce of its gradients, or of the group they close): the op keeps the
// parameter gradients and op_role_var, and a copy of its type after those collectives writes the
// other outputs. The all-reduce then overlaps that copy: a weight gradient leaves before the input
// gradient that the rest of backward needs is computed. Ops with no collective after them stay
// whole (nothing would overlap).
void SplitParamGradWriters(Block& mb) {
  for (size_t i = 0; i + 1 < mb.num_ops(); ++i) {
    OpDesc& op = *mb.op(i);
    if (Role(op) != kBackward || !op.HasAttr(kOpRoleVarAttr) ||
        !OpRegistry::Traits(op.type()).outputs_apart)
      continue;
    const auto pairs = op.Attr<std::vector<std::string>>(kOpRoleVarAttr);
    std::set<std::string> param_grads;
    for (size_t k = 1; k < pairs.size(); k += 2) param_grads.insert(pairs[k]);
    // Slots of parameter gradients only, and slots of other real outputs; a slot mixing both
    // cannot be split.
    std::vector<std::string> mine, rest;
    bool mixed = false;
    for (const auto& [slot, args] : op.outputs()) {
      size_t grads = 0, real = 0;
      for (const std::string& a : args) {
        if (a == kEmptyVarName) continue;
        ++real;
        grads += param_grads.count(a);
      }
      if (real == 0) continue;
      if (grads == real) {
        mine.push_back(slot);
      } else if (grads == 0) {
        rest.push_back(slot);
      } else {
        mixed = true;
      }
    }
    if (mixed || mine.empty() || rest.empty()) continue;
    // The collectives right after the op that do not read its other outputs (the all-reduces of
    // its gradients); a collective that reads them (a tensor-parallel op's backward) ends the run.
    std::set<std::string> others;
    for (const std::string& slot : rest)
      for (const std::string& a : op.Output(slot)) others.insert(a);
    // (fp16_allreduce's casts and scales around them count with them.)
    size_t at = i + 1;
    auto around = [&](const OpDesc& o) {
      return o.HasAttr("ring_id") ||
             (Role(o) == kBackward && (o.type() == "cast" || o.type() == "scale"));
    };
    while (at < mb.num_ops() && around(*mb.op(at))) {
      bool reads = false;
      for (const std::string& a : mb.op(at)->InputArgumentNames()) reads |= others.count(a) > 0;
      if (reads) break;
      ++at;
    }
    if (at == i + 1) continue;  // nothing would overlap the other outputs
    auto second = std::make_unique<OpDesc>(op);
    second->RemoveAttr(kOpRoleVarAttr);
    for (const std::string& slot : mine)
      second->SetOutput(slot, std::vector<std::string>(op.Output(slot).size(), kEmptyVarName));
    for (const std::string& slot : rest)
      op.SetOutput(slot, std::vector<std::string>(op.Output(slot).size(), kEmptyVarName));
    mb.InsertOp(at, std::move(second));
    i = at;
  }
}

// Each group gets a coalesce_tensor before the first backward op, making its gradients slices of
// "@FUSED_GRAD@k", and one c_allreduce_sum of that buffer on ring k % nrings right after the
// group's last gradient is written (with hierarchy: reduce-scatter, all-reduce, all-gather).
// The groups the options ask for: one per gradient without fusion, else Paddle's, the ring
// model's or keel's size grouping.
std::vector<Group> GroupsFor(const Block& mb, const GradAllReduceOptions& options,
                             const std::vector<Grad>& grads) {
  if (!options.fuse) return GroupBySize(mb, grads, 1e300, 1);
  if (options.paddle_fuse)
    return GroupLikePaddle(mb, grads, options.paddle_fuse_memory_size_mb,
                           options.paddle_fuse_groups_size);
  if (options.group_bytes > 0)
    return GroupUntil(mb, grads, options.group_bytes, options.fuse_mb * 1024.0 * 1024.0,
                      static_cast<size_t>(options.fuse_num));
  return GroupBySize(mb, grads, options.fuse_mb * 1024.0 * 1024.0,
                     static_cast<size_t>(options.fuse_num));
}

// A pipeline stage's accumulators, all-reduced at `at` (the optimizer section's head, role
// Optimize) in the groups the options ask for: a group of one in place; a larger one flattened
// ("<acc>@FLAT"), concatenated into "@PP_FUSED_GRAD@k", all-reduced (fp16_allreduce's casts
// around it) and split back. The accumulators are persistable and summed into every
// micro-batch, so they are copied rather than made slices of a buffer. Returns the index after.
size_t AllReduceAccumulators(Block& mb, size_t at, const GradAllReduceOptions& options,
                             const std::vector<std::string>& accs, std::set<int>* rings_used) {
  std::vector<Grad> grads;
  for (const std::string& a : accs) grads.push_back({a, a, 0});
  const std::vector<Group> groups = GroupsFor(mb, options, grads);
  const int nrings = options.rings.nrings, nranks = options.rings.nranks;
  for (size_t k = 0; k < groups.size(); ++k) {
    const Group& g = groups[k];
    const int ring = static_cast<int>(k) % nrings;
    rings_used->insert(ring);
    if (g.names.size() == 1) {
      at += InsertAllReduce(mb, at, g.names[0], ring, options.comm_dtype, nranks, kOptimize);
      continue;
    }
    const std::string fused = "@PP_FUSED_GRAD@" + std::to_string(k);
    KEEL_ENFORCE(mb.FindVar(fused) == nullptr,
                 "grad_allreduce: the program already has a var named '", fused,
                 "' (transpiled twice?)");
    std::vector<std::string> flats;
    std::vector<int> sizes;
    for (size_t i = 0; i < g.names.size(); ++i) {
      at = InsertFlatten(mb, at, g.names[i], kOptimize);
      flats.push_back(FlatName(g.names[i]));
      sizes.push_back(static_cast<int>(g.numels[i]));
    }
    at = InsertConcatFlat(mb, at, flats, fused, kOptimize);
    at += InsertAllReduce(mb, at, fused, ring, options.comm_dtype, nranks, kOptimize);
    at = InsertSplitFlat(mb, at, fused, flats, sizes, kOptimize);
    for (const std::string& name : g.names) at = InsertUnflatten(mb, at, name, kOptimize);
  }
  return at;
}

void FuseGradients(Block& mb, const GradAllReduceOptions& options, std::set<int>* rings_used,
                   const std::vector<Grad>& grads, const Hierarchy& hier) {
  const int nrings = options.rings.nrings;
  // Hierarchical without fusion: a group per gradient (still a padded buffer to scatter).
  const std::vector<Group> groups = GroupsFor(mb, options, grads);
  // The fused buffers, declared.
  std::vector<std::string> fused(groups.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    fused[k] = "@FUSED_GRAD@" + std::to_string(k);
    KEEL_ENFORCE(mb.FindVar(fused[k]) == nullptr,
                 "fuse_all_reduce_ops: the program already has a "
                 "var named '",
                 fused[k], "' (transpiled twice?)");
    VarDesc* v = mb.Var(fused[k]);
    v->set_dtype(groups[k].dtype);
    int64_t total = 0;
    for (int64_t n : groups[k].numels) total += n;
    total = (total + hier.k - 1) / hier.k * hier.k;  // scattered over a node's k ranks
    v->set_shape({total});
    if (hier.on) {
      VarDesc* part = mb.Var(fused[k] + "@PART");
      part->set_dtype(groups[k].dtype);
      part->set_shape({total / hier.k});
    }
  }
  // One all-reduce per group after its last writer, from the back so indices stay valid (groups
  // sharing a last writer keep their order).
  std::vector<size_t> order(groups.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return groups[a].last_writer < groups[b].last_writer;
  });
  for (size_t o = order.size(); o-- > 0;) {
    const size_t k = order[o];
    const int ring = static_cast<int>(k) % nrings;
    const size_t at = groups[k].last_writer + 1;
    if (!hier.on) {
      rings_used->insert(ring);
      InsertAllReduce(mb, at, fused[k], ring, options.comm_dtype, options.rings.nranks);
      continue;
    }
    // Reduce-scatter inside the node, all-reduce the part across nodes, all-gather inside.
    const int intra = nrings + ring, inter = 2 * nrings + ring;
    rings_used->insert(intra);
    rings_used->insert(inter);
    const std::string part = fused[k] + "@PART";
    InsertInPlace(mb, at, "c_sync_calc_stream", fused[k], intra, kBackward);
    InsertCollective(mb, at + 1, "c_reducescatter", fused[k], part, intra, kBackward,
                     {{"nranks", hier.k}});
    InsertInPlace(mb, at + 2, "c_allreduce_sum", part, inter, kBackward);
    InsertCollective(mb, at + 3, "c_allgather", part, fused[k], intra, kBackward,
                     {{"nranks", hier.k}});
  }
  // The coalesce ops, before the first backward op (the loss-gradient fill).
  size_t first = 0;
  while (first < mb.num_ops() && !(Role(*mb.op(first)) & kBackward)) ++first;
  for (size_t k = 0; k < groups.size(); ++k) {
    OpDesc* op = mb.InsertOp(first + k, "coalesce_tensor");
    op->SetInput("Input", groups[k].names);
    op->SetOutput("Output", groups[k].names);
    op->SetOutput("FusedOutput", {fused[k]});
    op->SetAttr("numels", groups[k].numels);
    op->SetAttr("dtype", static_cast<int>(groups[k].dtype));
    op->SetAttr("copy_data", false);
    if (hier.k > 1) op->SetAttr("pad_to_multiple", hier.k);
    op->SetAttr(kOpRoleAttr, kBackward);
    InferShapeAtBuild(op, &mb);
  }
}

}  // namespace

void AppendRingsAndParamBroadcast(const Program& main, Program& startup, const RingOptions& rings) {
  // ---- startup: rings, then every parameter from rank 0.
  Block& sb = startup.global_block();
  for (int r = 0; r < rings.nrings; ++r) {
    OpDesc* init = sb.AppendOp("c_comm_init");
    init->SetAttr("ring_id", r);
    init->SetAttr("nranks", rings.nranks);
    init->SetAttr("rank", rings.rank);
    init->SetAttr("device_id", rings.device);
    if (!rings.group.empty()) init->SetAttr("group", rings.group);
    init->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward));
    InferShapeAtBuild(init, &sb);
  }
  std::string last_param;
  for (VarDesc* v : main.global_block().AllVars()) {
    if (!v->is_parameter()) continue;
    KEEL_ENFORCE(sb.FindVar(v->name()) != nullptr, "grad_allreduce: parameter '", v->name(),
                 "' is not initialized by the startup program");
    // AMP O2: the float32 master first (the parameter is rank 0's master rounded).
    const std::string master = AmpMasterName(v->name());
    if (main.global_block().FindVar(master) != nullptr && sb.FindVar(master) != nullptr)
      InsertInPlace(sb, sb.num_ops(), "c_broadcast", master, 0, static_cast<int>(OpRole::kForward),
                    {{"root", 0}});
    InsertInPlace(sb, sb.num_ops(), "c_broadcast", v->name(), 0, static_cast<int>(OpRole::kForward),
                  {{"root", 0}});
    last_param = v->name();
  }
  if (!last_param.empty())
    InsertInPlace(sb, sb.num_ops(), "c_sync_comm_stream", last_param, 0,
                  static_cast<int>(OpRole::kForward));
}

void GradAllReducePass::Apply(Program& main, Program& startup) const {
  const RingOptions& ro = options_.rings;
  const int nrings = ro.nrings;
  const int nranks = ro.nranks;
  KEEL_ENFORCE(nrings >= 1, "grad_allreduce: nccl_comm_num must be >= 1, got ", nrings);
  AppendRingsAndParamBroadcast(main, startup, ro);
  // Hierarchy needs two nodes or more; on one node it would only add rings, and (like Paddle) the
  // flat ring is used instead.
  bool hierarchical = options_.hierarchical;
  if (hierarchical && options_.ranks_per_node >= nranks) {
    LOG(WARNING) << "use_hierarchical_allreduce: all " << nranks << " ranks are on one node ("
                 << options_.ranks_per_node << " ranks per node); using the flat ring instead";
    hierarchical = false;
  }
  if (hierarchical) {
    // Per flat ring r: ring nrings + r inside this node, ring 2 * nrings + r across nodes.
    const int k = options_.ranks_per_node;
    KEEL_ENFORCE(k >= 1 && nranks % k == 0, "grad_allreduce: ", k,
                 " ranks per node (hierarchical_allreduce_inter_nranks) do not divide ", nranks,
                 " ranks");
    const int node = ro.rank / k, local = ro.rank % k;
    const int device = ro.device;
    Block& sb = startup.global_block();
    for (int r = 0; r < nrings; ++r) {
      for (int inter = 0; inter < 2; ++inter) {
        OpDesc* init = sb.AppendOp("c_comm_init");
        init->SetAttr("ring_id", (inter ? 2 * nrings : nrings) + r);
        init->SetAttr("nranks", inter ? nranks / k : k);
        init->SetAttr("rank", inter ? node : local);
        init->SetAttr("device_id", device);
        init->SetAttr("group",
                      inter ? "local" + std::to_string(local) : "node" + std::to_string(node));
        init->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward));
        InferShapeAtBuild(init, &sb);
      }
    }
  }

  // ---- main.
  Block& mb = main.global_block();
  const bool low = options_.comm_dtype != DType::kFloat32;
  KEEL_ENFORCE(
      !low || options_.comm_dtype == DType::kFloat16 || options_.comm_dtype == DType::kBFloat16,
      "fp16_allreduce: the all-reduce dtype must be float16 or bfloat16, got ",
      DTypeName(options_.comm_dtype));
  KEEL_ENFORCE(!low || !hierarchical,
               "grad_allreduce: fp16_allreduce and use_hierarchical_allreduce are both set: the "
               "two-level all-reduce in 16 bits is not built");
  // Scale the loss gradient by 1/nranks where it is filled (fp16_allreduce in float16: each
  // gradient after its all-reduce instead, in float32).
  bool scaled = false;
  for (size_t i = 0; i < mb.num_ops() && !scaled; ++i) {
    const OpDesc& op = *mb.op(i);
    if (Role(op) != (kBackward | kLoss)) continue;
    scaled = true;
    if (low && ScalesAfterAllReduce(options_.comm_dtype)) break;
    const std::string& g = op.Output("Out")[0];
    OpDesc* s = mb.InsertOp(i + 1, "scale");
    s->SetInput("X", {g});
    s->SetOutput("Out", {g});
    s->SetAttr("scale", 1.0f / static_cast<float>(nranks));
    s->SetAttr(kOpRoleAttr, kBackward | kLoss);
    InferShapeAtBuild(s, &mb);
  }
  KEEL_ENFORCE(scaled || !options_.has_loss,
               "grad_allreduce: the main program has no loss-gradient op; call "
               "minimize (append_backward) before transpiling");

  // After GradientMergePass: the merged buffers, all-reduced once per merge step, first thing in
  // its sub-block (before the avg scale, the overflow check and the updates). Nothing per run.
  if (std::optional<GradientMergeInfo> gm = FindGradientMerge(main)) {
    KEEL_ENFORCE(!low,
                 "grad_allreduce: fp16_allreduce and gradient merge are both set: the merged "
                 "buffers are all-reduced in float32 (16 bits there is not built)");
    KEEL_ENFORCE(!options_.fuse && !hierarchical,
                 "grad_allreduce: the program merges gradients (gradient merge) and ",
                 options_.fuse ? "fuse_all_reduce_ops" : "use_hierarchical_allreduce",
                 " is set: the merged buffers are all-reduced one by one (fused or hierarchical "
                 "all-reduce of merged gradients is not built)");
    Block& sub = main.block(gm->block);
    std::set<int> used;
    size_t at = 0;
    for (size_t i = 0; i < gm->merged.size(); ++i) {
      const int ring = static_cast<int>(i) % nrings;
      used.insert(ring);
      const std::string& buf = gm->merged[i].second;
      InsertInPlace(sub, at++, "c_sync_calc_stream", buf, ring, kOptimize);
      InsertInPlace(sub, at++, "c_allreduce_sum", buf, ring, kOptimize);
    }
    for (int ring : used)
      InsertInPlace(sub, at++, "c_sync_comm_stream", gm->merged.back().second, ring, kOptimize);
    return;
  }

  // After PipelinePass: nothing per micro-batch; each gradient's accumulator, once per
  // mini-batch, first thing in the optimizer section (before the overflow check, the clip and the
  // updates).
  if (const std::vector<std::string> accs = PipelineAccumulators(mb); !accs.empty()) {
    KEEL_ENFORCE(!hierarchical,
                 "grad_allreduce: the program is a pipeline stage and use_hierarchical_allreduce "
                 "is set: hierarchical all-reduce of a stage's gradient accumulators is not built");
    size_t at = 0;
    while (at < mb.num_ops() && !(Role(*mb.op(at)) & kOptimize)) ++at;
    std::set<int> used;
    at = AllReduceAccumulators(mb, at, options_, accs, &used);
    for (int ring : used)
      InsertInPlace(mb, at++, "c_sync_comm_stream", accs.back(), ring, kOptimize);
    return;
  }

  // Parameter gradients in the order backward produces them, with the op that last writes each.
  std::vector<Grad> grads;
  for (size_t i = 0; i < mb.num_ops(); ++i) {
    const OpDesc& op = *mb.op(i);
    if (Role(op) != kBackward || !op.HasAttr(kOpRoleVarAttr)) continue;
    const auto pairs = op.Attr<std::vector<std::string>>(kOpRoleVarAttr);
    KEEL_ENFORCE(pairs.size() % 2 == 0, "grad_allreduce: op ", op.type(),
                 " has an odd op_role_var list");
    for (size_t k = 0; k < pairs.size(); k += 2) grads.push_back({pairs[k], pairs[k + 1], i});
  }

  std::vector<DeferredCast> deferred;
  if (options_.amp_low_precision_grads && !low) deferred = AllReduceSixteenBitSources(mb, &grads);

  std::set<int> rings_used;
  if (!options_.fuse && !hierarchical) {
    // All-reduce each gradient right after its last writer (from the back, so that the writer
    // indices stay valid).
    for (size_t k = grads.size(); k-- > 0;) {
      const int ring = static_cast<int>(k) % nrings;
      rings_used.insert(ring);
      // Right after the writer: a later gradient of the same writer was placed there already
      // and moves down behind this one.
      const size_t at = grads[k].writer + 1;
      InsertAllReduce(mb, at, grads[k].name, ring, options_.comm_dtype, nranks);
    }
  } else {
    Hierarchy hier;
    if (hierarchical) {
      hier.on = true;
      hier.k = options_.ranks_per_node;
    }
    FuseGradients(mb, options_, &rings_used, grads, hier);
  }

  SplitParamGradWriters(mb);
  PlaceDeferredCasts(mb, std::move(deferred));

  // Wait for the rings before the first optimizer op.
  for (size_t i = 0; i < mb.num_ops(); ++i) {
    if (Role(*mb.op(i)) != kOptimize) continue;
    const auto& grad = mb.op(i)->Input("Grad");
    const std::string var = grad.empty() ? mb.op(i)->InputArgumentNames().front() : grad[0];
    for (int ring : rings_used) InsertInPlace(mb, i++, "c_sync_comm_stream", var, ring, kBackward);
    break;
  }
}

}  // namespace transpiler
}  // namespace keel
