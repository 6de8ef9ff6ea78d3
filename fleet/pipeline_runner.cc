#include "fleet/pipeline_runner.h"

#include <algorithm>
#include <map>
#include <type_traits>

#include "fleet/transpile.h"
#include "framework/error.h"

namespace keel {
namespace fleet {

namespace {

int RoleOf(const OpDesc& op) { return op.HasAttr(kOpRoleAttr) ? op.Attr<int>(kOpRoleAttr) : 0; }
constexpr int kBackward = static_cast<int>(OpRole::kBackward);
constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);

// The ops of [begin, end) of `program`'s block 0, as a program of their own (every var kept).
std::unique_ptr<Program> Section(const Program& program, size_t begin, size_t end) {
  std::unique_ptr<Program> p = program.Clone();
  Block& b = p->global_block();
  b.RemoveOps(end, b.num_ops());
  b.RemoveOps(0, begin);
  return p;
}

std::set<std::string> Reads(const Program& p) {
  std::set<std::string> r;
  for (const auto& op : p.global_block().ops())
    for (const std::string& v : op->InputArgumentNames()) r.insert(v);
  return r;
}

std::set<std::string> Writes(const Program& p) {
  std::set<std::string> w;
  for (const auto& op : p.global_block().ops())
    for (const std::string& v : op->OutputArgumentNames())
      if (v != kEmptyVarName) w.insert(v);
  return w;
}

// The element-wise mean of equally shaped float tensors (a fetch over the micro-batches).
Tensor MeanOf(const std::vector<const Tensor*>& parts, const std::string& name) {
  Tensor mean = parts[0]->Clone(CPUPlace());
  KEEL_ENFORCE(mean.dtype() == DType::kFloat32 || mean.dtype() == DType::kFloat64,
               "PipelineRunner: fetch '", name, "' is ", DTypeName(mean.dtype()),
               "; the mean over micro-batches is built for float32 and float64");
  auto average = [&](auto* acc) {
    using T = std::remove_pointer_t<decltype(acc)>;
    for (size_t m = 1; m < parts.size(); ++m)
      for (int64_t i = 0; i < mean.numel(); ++i) acc[i] += parts[m]->data<T>()[i];
    for (int64_t i = 0; i < mean.numel(); ++i) acc[i] /= static_cast<T>(parts.size());
  };
  if (mean.dtype() == DType::kFloat32) {
    average(mean.data<float>());
  } else {
    average(mean.data<double>());
  }
  return mean;
}

}  // namespace

PipelineRunOptions PipelineRunOptionsFor(const DistributedStrategy& strategy, const Role& role) {
  KEEL_ENFORCE(strategy.pipeline, "PipelineRunOptionsFor: DistributedStrategy.pipeline is false");
  const transpiler::PipelineOptions p = PipelineOptionsFor(strategy, role);
  PipelineRunOptions o;
  o.stages = p.degree;
  o.stage = p.stage;
  o.micro_batches = p.micro_batches;
  o.micro_batch_size = p.micro_batch_size;
  o.one_f_one_b = strategy.pipeline_configs.schedule_mode == "1F1B";
  return o;
}

struct PipelineRunner::MicroBatch {
  FeedMap data;   // this micro-batch's rows of the data vars
  FeedMap stash;  // what its backward reads of its forward
};

PipelineRunner::PipelineRunner(Executor& exe, const Program& stage_program,
                               PipelineRunOptions options)
    : exe_(exe), o_(options) {
  KEEL_ENFORCE(o_.stages >= 1 && o_.stage >= 0 && o_.stage < o_.stages, "PipelineRunner: stage ",
               o_.stage, " of ", o_.stages);
  KEEL_ENFORCE(o_.micro_batches >= 1, "PipelineRunner: micro_batches ", o_.micro_batches,
               " must be >= 1");
  const Block& b = stage_program.global_block();
  KEEL_ENFORCE(stage_program.num_blocks() == 1, "PipelineRunner: the stage program has ",
               stage_program.num_blocks(), " blocks; sections of one block only are built");
  const size_t n = b.num_ops();
  size_t first_bwd = n, first_opt = n;
  for (size_t i = 0; i < n; ++i) {
    const int role = RoleOf(*b.op(i));
    if ((role & kBackward) && first_bwd == n) first_bwd = i;
    if ((role & kOptimize) && first_opt == n) first_opt = i;
  }
  first_bwd = std::min(first_bwd, first_opt);
  for (size_t i = 0; i < n; ++i) {
    const int role = RoleOf(*b.op(i));
    const int section = i < first_bwd ? 0 : i < first_opt ? 1 : 2;
    const int want = role & kOptimize ? 2 : role & kBackward ? 1 : 0;
    // Collectives and transfers take their section from where the passes put them.
    KEEL_ENFORCE(want >= section || want == 0, "PipelineRunner: op ", b.op(i)->type(), " (#", i,
                 ") has op_role ", role, " but sits after the ",
                 section == 2 ? "optimizer" : "backward",
                 " section began: a stage program runs forward, backward, optimizer in order");
  }
  fwd_ = Section(stage_program, 0, first_bwd);
  bwd_ = Section(stage_program, first_bwd, first_opt);
  opt_ = Section(stage_program, first_opt, n);
  fwd_written_ = Writes(*fwd_);
  const std::set<std::string> bwd_reads = Reads(*bwd_);
  for (const std::string& v : bwd_reads) {
    const VarDesc* d = b.FindVar(v);
    if (d == nullptr || d->persistable()) continue;
    if (d->is_data()) {
      bwd_data_.insert(v);
    } else if (fwd_written_.count(v)) {
      stash_.push_back(v);
    }
  }
  for (const VarDesc* v : b.AllVars())
    if (v->persistable()) persistables_.insert(v->name());
  for (const std::string& v : Reads(*fwd_)) {
    const VarDesc* d = b.FindVar(v);
    if (d != nullptr && d->is_data() && !d->persistable()) fwd_data_.insert(v);
  }
  test_ = fwd_->clone_for_test();
  for (const std::string& v : Reads(*test_))
    if (fwd_data_.count(v)) test_data_.insert(v);
}

void PipelineRunner::Forward(MicroBatch& mb, const std::vector<std::string>& fetch) {
  FeedMap feed;
  for (const std::string& v : fwd_data_) feed[v] = mb.data.at(v);
  // What the backward reads stays where it lies, taken out of the scope (no copy); the fetches
  // (the loss: small) are copied to the CPU, from the taken tensor when the backward reads it too.
  std::vector<std::string> names = stash_;
  for (const std::string& f : fetch)
    if (std::find(stash_.begin(), stash_.end(), f) == stash_.end()) names.push_back(f);
  std::vector<Tensor> out = exe_.Run(*fwd_, feed, names, Executor::FetchMode::kTake);
  for (size_t i = 0; i < stash_.size(); ++i) mb.stash[stash_[i]] = out[i];
  for (size_t i = stash_.size(); i < names.size(); ++i)
    mb.stash["@FETCH@" + names[i]] = out[i].Clone(CPUPlace());
  for (const std::string& f : fetch)
    if (!mb.stash.count("@FETCH@" + f)) mb.stash["@FETCH@" + f] = mb.stash.at(f).Clone(CPUPlace());
  peak_ = std::max(peak_, ++in_flight_);
}

void PipelineRunner::Backward(MicroBatch& mb) {
  FeedMap feed;
  for (const std::string& v : bwd_data_) feed[v] = mb.data.at(v);
  for (const std::string& v : stash_) feed[v] = std::move(mb.stash.at(v));
  for (const std::string& v : stash_) mb.stash.erase(v);
  exe_.Run(*bwd_, feed);
  --in_flight_;
}

std::vector<Tensor> PipelineRunner::Step(const FeedMap& feed,
                                         const std::vector<std::string>& fetch) {
  const int M = o_.micro_batches;
  // Persistables (the learning rate) are read after the step; the others are the forward
  // section's, averaged over the micro-batches.
  std::vector<std::string> fwd_fetch;
  for (const std::string& f : fetch) {
    if (persistables_.count(f)) continue;
    KEEL_ENFORCE(fwd_written_.count(f), "PipelineRunner: fetch '", f,
                 "' is not computed by the forward section of stage ", o_.stage, " of ", o_.stages,
                 " (the loss lives on the last stage)");
    fwd_fetch.push_back(f);
  }
  std::vector<MicroBatch> mbs(M);
  std::set<std::string> data = fwd_data_;
  data.insert(bwd_data_.begin(), bwd_data_.end());
  for (const std::string& v : data) {
    auto it = feed.find(v);
    KEEL_ENFORCE(it != feed.end(), "PipelineRunner: stage ", o_.stage, " reads data var '", v,
                 "', which the feed does not hold");
    const Tensor& t = it->second;
    KEEL_ENFORCE(t.dims().size() >= 1, "PipelineRunner: feed '", v, "' has no rows to split");
    const int64_t rows = t.dims()[0];
    KEEL_ENFORCE(rows % M == 0, "PipelineRunner: feed '", v, "' has ", rows,
                 " rows, which do not split into DistributedStrategy.pipeline_configs."
                 "accumulate_steps=",
                 M, " equal micro-batches");
    KEEL_ENFORCE(
        o_.micro_batch_size == 0 || rows == int64_t{o_.micro_batch_size} * M,
        "PipelineRunner: feed '", v, "' has ", rows,
        " rows, but DistributedStrategy.pipeline_configs.micro_batch_size=", o_.micro_batch_size,
        " x accumulate_steps=", M, " = ", int64_t{o_.micro_batch_size} * M);
    const int64_t per = rows / M;
    for (int m = 0; m < M; ++m) mbs[m].data[v] = t.Slice(m * per, (m + 1) * per);
  }
  in_flight_ = peak_ = 0;
  if (o_.one_f_one_b) {
    const int warmup = std::min(o_.stages - o_.stage - 1, M);
    int f = 0, bw = 0;
    for (; f < warmup; ++f) Forward(mbs[f], fwd_fetch);
    for (; f < M; ++f, ++bw) {
      Forward(mbs[f], fwd_fetch);
      Backward(mbs[bw]);
    }
    for (; bw < M; ++bw) Backward(mbs[bw]);
  } else {
    for (int m = 0; m < M; ++m) Forward(mbs[m], fwd_fetch);
    for (int m = 0; m < M; ++m) Backward(mbs[m]);
  }
  exe_.Run(*opt_);

  std::vector<Tensor> results;
  for (const std::string& f : fetch) {
    if (persistables_.count(f)) {
      const Variable* v = exe_.scope().FindVar(f);
      KEEL_ENFORCE(v != nullptr && v->tensor().initialized(), "PipelineRunner: fetch '", f,
                   "' holds no data on stage ", o_.stage);
      results.push_back(v->tensor().Clone(CPUPlace()));
      continue;
    }
    std::vector<const Tensor*> parts;
    for (int m = 0; m < M; ++m) parts.push_back(&mbs[m].stash.at("@FETCH@" + f));
    results.push_back(MeanOf(parts, f));
  }
  return results;
}

std::vector<Tensor> PipelineRunner::Evaluate(const FeedMap& feed,
                                             const std::vector<std::string>& fetch) {
  for (const std::string& f : fetch)
    KEEL_ENFORCE(Writes(*test_).count(f), "PipelineRunner::Evaluate: fetch '", f,
                 "' is not computed by the forward section of stage ", o_.stage, " of ", o_.stages);
  int64_t rows = -1;
  for (const std::string& v : test_data_) {
    auto it = feed.find(v);
    KEEL_ENFORCE(it != feed.end() && it->second.dims().size() >= 1, "PipelineRunner: stage ",
                 o_.stage, " evaluates on data var '", v,
                 "', which the feed does not hold (with rows)");
    KEEL_ENFORCE(rows < 0 || rows == it->second.dims()[0], "PipelineRunner::Evaluate: feed '", v,
                 "' has ", it->second.dims()[0], " rows, another data var ", rows);
    rows = it->second.dims()[0];
  }
  // Every stage sees the same batch, so every stage splits it alike.
  const int M = rows > 0 && rows % o_.micro_batches == 0 ? o_.micro_batches : 1;
  const int64_t per = rows > 0 ? rows / M : 0;
  KEEL_ENFORCE(o_.micro_batch_size == 0 || per == o_.micro_batch_size,
               "PipelineRunner::Evaluate: a batch of ", rows,
               " rows, but DistributedStrategy.pipeline_configs.micro_batch_size=",
               o_.micro_batch_size, " fixes the rows a stage receives");
  std::vector<std::vector<Tensor>> outs;
  for (int m = 0; m < M; ++m) {
    FeedMap mb;
    for (const std::string& v : test_data_) mb[v] = feed.at(v).Slice(m * per, (m + 1) * per);
    outs.push_back(exe_.Run(*test_, mb, fetch));
  }
  std::vector<Tensor> results;
  for (size_t i = 0; i < fetch.size(); ++i) {
    std::vector<const Tensor*> parts;
    for (const auto& out : outs) parts.push_back(&out[i]);
    results.push_back(MeanOf(parts, fetch[i]));
  }
  return results;
}

}  // namespace fleet
}  // namespace keel
