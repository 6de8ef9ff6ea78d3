#include "executor/executor.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "executor/eager_deletion.h"
#include "executor/event_plan.h"
#include "executor/graph_capture.h"
#include "executor/scheduler.h"
#include "executor/stream.h"
#include "framework/comm/communicator.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/op/validate_program.h"
#include "framework/profiler/profiler.h"
#include "framework/runtime/allocator.h"
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/cuda_backend.h"
#include "framework/runtime/cuda_graph.h"
#include "framework/runtime/device.h"
#include "framework/runtime/half_convert.h"
#include "framework/runtime/row_init.h"

DEFINE_bool(check_nan_inf, false,
            "Check every float output of every op for NaN and Inf after it runs, and stop at "
            "the first op that produces one, naming the op and the variable (Paddle's flag).");
DEFINE_double(eager_delete_tensor_gb, 0.0,
              "Eager deletion (Paddle's flag), CPU places: a temporary's memory goes back to the "
              "allocator as soon as the last op that touches it in a run has finished. 0: at "
              "once; > 0: in batches of at least this many GB (the rest at the end of the run); "
              "< 0: off, temporaries keep their memory until the scope drop (for code that reads "
              "them from the scope after a run instead of fetching them). CUDA places keep their "
              "temporaries until the scope drop and refuse a value given explicitly.");
DEFINE_bool(profile_sync_ops, false,
            "CUDA places: wait for the device after every op, so that a profile's op spans "
            "(--profile) hold each op's device time rather than its launch time (Paddle's "
            "FLAGS_benchmark). Slows training; for finding slow kernels. CPU ops are timed "
            "exactly without it.");
DEFINE_bool(comm_overlap, true,
            "Let collectives run on their ring's thread (and, on CUDA, the ring's stream) while "
            "compute goes on; false: every collective waits for all earlier ops and all later ops "
            "wait for it.");

namespace keel {

namespace {

std::string SlotsText(const OpDesc::VarMap& m) {
  std::string s;
  for (auto& kv : m) {
    if (!s.empty()) s += ", ";
    s += kv.first + "=";
    for (size_t i = 0; i < kv.second.size(); ++i) s += (i ? "," : "") + kv.second[i];
  }
  return s;
}

// One stream per ring, shared by every executor of the process so a ring's collectives keep one
// order. Never destroyed: a thread sleeping on an empty queue costs nothing at exit.
Stream* RingStream(int ring_id) {
  static std::mutex mu;
  static auto* streams = new std::map<int, Stream*>;
  std::lock_guard<std::mutex> lock(mu);
  Stream*& s = (*streams)[ring_id];
  if (!s) s = new CpuStream("keel-ring" + std::to_string(ring_id));
  return s;
}

std::mutex g_attached_mu;
std::map<uint64_t, ExecutionStrategy>& Attached() {
  static auto* m = new std::map<uint64_t, ExecutionStrategy>;
  return *m;
}

template <typename T>
int64_t FirstNonFinite(const Tensor& t) {
  const T* p = t.data<T>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return -1;
}

// A float16 / bfloat16 host tensor's values as float32 (exact).
Tensor WidenedOnHost(const Tensor& t) {
  Tensor wide(DType::kFloat32, t.dims());
  if (t.dtype() == DType::kBFloat16) {
    WidenN(t.data<bfloat16>(), wide.data<float>(), t.numel());
  } else {
    WidenN(t.data<float16>(), wide.data<float>(), t.numel());
  }
  return wide;
}

}  // namespace

void ValidateExecutionStrategy(const ExecutionStrategy& s, const std::string& where) {
  KEEL_ENFORCE(s.num_threads >= 0, where, "ExecutionStrategy::num_threads=", s.num_threads,
               " must be >= 0 (0: one worker per core of the budget)");
  KEEL_ENFORCE(s.num_iteration_per_drop_scope >= 1, where,
               "ExecutionStrategy::num_iteration_per_drop_scope=", s.num_iteration_per_drop_scope,
               " must be >= 1");
}

void AttachExecutionStrategy(const Program& program, const ExecutionStrategy& strategy) {
  ValidateExecutionStrategy(strategy, "");
  std::lock_guard<std::mutex> lock(g_attached_mu);
  Attached()[program.id()] = strategy;
}

const ExecutionStrategy* AttachedExecutionStrategy(const Program& program) {
  std::lock_guard<std::mutex> lock(g_attached_mu);
  auto it = Attached().find(program.id());
  return it == Attached().end() ? nullptr : &it->second;
}

namespace {

// Gives `t` memory of `bytes` that ring `ring`'s peers map, unless it has such memory already or
// the ring has none to give (then the op allocates as usual and the ring copies). The op's
// kernel keeps the memory: an output's allocation is kept when it is large enough.
void PlaceForRing(Tensor* t, int ring, size_t bytes, const std::string& op_type) {
  if (!RingRegistry::Get().Has(ring)) return;
  Communicator& comm = RingRegistry::Get().At(ring, op_type);
  if (t->holder() != nullptr && t->holder()->size() >= bytes &&
      comm.IsShared(t->holder()->ptr(), bytes))
    return;
  if (auto shared = comm.AllocateShared(bytes)) t->ResetHolder(std::move(shared));
}

}  // namespace

struct Executor::Plan {
  struct Op {
    const OpDesc* desc;
    const OpSchema* schema;
    std::unique_ptr<OpKernel> kernel;
    std::unique_ptr<ExecutionContext> ctx;
    std::string trace_detail;  // "#i -> first output", for the profiler
    bool on_stream = false;
    bool calc_stream = false;  // a collective with use_calc_stream: runs on a compute worker
    void* event = nullptr;     // CUDA: recorded after the op when the event plan says so
    // CUDA, calc_stream: the ring's stream waits for compute before the op (calc_in) and compute
    // for the ring after it (calc_out).
    void* calc_in = nullptr;
    void* calc_out = nullptr;
    // CPU: outputs that a ring then all-reduces in place, with that ring and their bytes (known
    // at build time): allocated where the ring's peers read them (PlaceForRing).
    struct RingOutput {
      Variable* var;
      int ring;
      size_t bytes;
    };
    std::vector<RingOutput> ring_outputs;
  };
  ~Plan() {
    captured.reset();  // waits for its last replay
    for (Op& op : ops)
      for (void* e : {op.event, op.calc_in, op.calc_out}) DeviceEventDestroy(place, e);
    DeviceEventDestroy(place, start_event);
  }
  Place place;
  uint64_t version = 0;
  int block = 0;
  std::vector<Op> ops;
  std::unordered_map<std::string, std::pair<Variable*, const VarDesc*>> vars;
  std::vector<Variable*> temporaries;
  EagerDeletionPlan collect;              // CPU places
  int64_t* runs = nullptr;                // the program's run count (runs_ in the executor)
  std::unique_ptr<DependencyGraph> deps;  // the ops' dependency graph
  Scheduler::StreamOf stream_of;          // empty when no op runs on a stream
  int width = 1;                          // deps->MaxWidth()
  // CUDA place with collectives: the cross-stream events (executor/event_plan.h), and an event
  // recorded on the compute stream when the run starts (after the feeds' copies), which every
  // collective's stream waits for before its op.
  bool device_events = false;
  EventPlan events;
  void* start_event = nullptr;
  // ExecutionStrategy::use_cuda_graph: the CUDA-graph side of the plan (executor/graph_capture.h),
  // made at the first graphed run.
  std::unique_ptr<CapturedStep> captured;
  // "block 1 op #3 mul (X=x, Y=w -> Out=y)": how errors name op i (block 0 is not named).
  std::string OpWhere(int i) const {
    const OpDesc& d = *ops[i].desc;
    return StrCat(block == 0 ? std::string() : StrCat("block ", block, " "), "op #", i, " ",
                  d.type(), " (", SlotsText(d.inputs()), " -> ", SlotsText(d.outputs()), ")");
  }
  void DropCapturedStep() {
    if (captured) captured->Drop();
  }
};

Executor::Executor(const Place& place, ExecutionStrategy strategy)
    : place_(place), strategy_(strategy), scope_(std::make_unique<Scope>()) {
  local_scope_ = &scope_->NewScope();
  if (place.is_cuda()) {
    CudaBackendFor(place);  // a keel::Error saying why when libkeel_cuda cannot be opened
    KEEL_ENFORCE(CudaAvailable(), "Executor on ", place.str(),
                 ": no CUDA device is available to this process");
  }
  ValidateExecutionStrategy(strategy_, "Executor: ");
}

Executor::~Executor() = default;

void Executor::set_strategy(const ExecutionStrategy& s) {
  ValidateExecutionStrategy(s, "Executor: ");
  strategy_ = s;
}

const ExecutionStrategy& Executor::StrategyFor(const Program& program) const {
  const ExecutionStrategy* attached = AttachedExecutionStrategy(program);
  return attached ? *attached : strategy_;
}

int64_t Executor::RunCount(const Program& program) const {
  auto it = runs_.find(program.id());
  return it == runs_.end() ? 0 : it->second;
}

void Executor::SetRunCount(const Program& program, int64_t runs) {
  KEEL_ENFORCE(runs >= 0, "Executor::SetRunCount: runs must be >= 0, got ", runs);
  runs_[program.id()] = runs;
}

int Executor::WorkersFor(const Program& program) {
  const int asked = StrategyFor(program).num_threads;
  if (place_.is_cuda()) {
    // One thread enqueues a CUDA place's ops, whatever num_threads allows (docs/gpu.md, "One
    // launching thread"): the kernels run asynchronously on the place's stream, so more host
    // threads could only share the enqueueing, and handing a chain of ops from thread to thread
    // made each op slower on an H200 (tests/bench/cuda_launch_bench.cu). Collectives still go
    // to their rings' threads.
    static std::atomic<bool> told{false};  // once per process
    if (asked > 1 && !told.exchange(true)) {
      LOG(INFO) << "ExecutionStrategy::num_threads=" << asked << " on " << place_.str()
                << ": one thread enqueues the ops of a CUDA place (they run asynchronously on "
                   "its stream; docs/gpu.md)";
    }
    return 1;
  }
  if (asked > 0) return asked;
  return std::max(1, std::min(cpu_threads::Budget(), GetPlan(program).width));
}

int64_t Executor::CudaGraphCaptures(const Program& program) {
  const Plan& plan = GetPlan(program);
  return plan.captured ? plan.captured->captures() : 0;
}

DependencyGraph& Executor::DependencyGraphForTesting(const Program& program, int block) {
  return *GetPlan(program, block).deps;
}

Executor::Plan& Executor::GetPlan(const Program& program, int block) {
  KEEL_ENFORCE(block >= 0 && block < program.num_blocks(), "block ", block,
               " is not a block of the program (it has ", program.num_blocks(), ")");
  auto& slot = plans_[{program.id(), block}];
  if (!slot || slot->version != program.version()) {
    // Once per program version, before any op of it runs: a hand-built or loaded program that
    // the registry cannot vouch for is an error here, not a crash in a kernel.
    if (block == 0) ValidateProgram(program, "program");
    slot = BuildPlan(program, block);
  }
  return *slot;
}

std::unique_ptr<Executor::Plan> Executor::BuildPlan(const Program& program, int block_idx) {
  auto plan = std::make_unique<Plan>();
  plan->place = place_;
  plan->version = program.version();
  plan->block = block_idx;
  plan->runs = &runs_[program.id()];
  const Block& block = program.block(block_idx);
  // The block's vars and those of its ancestors (a sub-block reads and writes its parent's):
  // the nearest declaration of a name wins.
  std::map<std::string, Variable*> owned;  // the temporaries by name
  for (int b = block_idx; b >= 0; b = program.block(b).parent_idx()) {
    for (VarDesc* v : program.block(b).AllVars()) {
      if (plan->vars.count(v->name())) continue;
      Variable* var = v->persistable() ? scope_->Var(v->name()) : local_scope_->Var(v->name());
      plan->vars[v->name()] = {var, v};
      if (!v->persistable() && b == block_idx) {
        plan->temporaries.push_back(var);
        owned[v->name()] = var;
      }
    }
  }
  // How many ops of the whole program write each var: an output may share its input's buffer
  // (OpTraits::may_share) only where each of the two has one writer.
  std::map<std::string, int> writers;
  for (int b = 0; b < program.num_blocks(); ++b)
    for (const auto& op : program.block(b).ops())
      for (const std::string& a : op->OutputArgumentNames()) ++writers[a];
  auto shareable = [&](const std::string& name) {
    auto it = plan->vars.find(name);
    return name != kEmptyVarName && it != plan->vars.end() && !it->second.second->persistable() &&
           !it->second.second->is_data() && writers[name] == 1;
  };
  std::random_device rd;
  std::vector<DependencyGraph::OpAccess> access(block.num_ops());
  std::map<std::string, std::string> slice_of;
  bool any_stream = false, any_calc_stream = false;
  for (size_t i = 0; i < block.num_ops(); ++i) {
    const OpDesc* op = block.op(i);
    Plan::Op p;
    p.desc = op;
    p.schema = &OpRegistry::Get(op->type());
    try {
      p.kernel = OpRegistry::CreateKernel(*op, place_, OpRegistry::KernelDType(*op, block));
    } catch (const Error& e) {
      KEEL_THROW("op #", i, " ", op->type(), " (", SlotsText(op->inputs()), "): ", e.what());
    }
    p.ctx = std::make_unique<ExecutionContext>(op, place_);
    p.ctx->set_run_index_source(plan->runs);
    const Program* prog = &program;
    // A sub-block runs on the worker that runs its op (the op is a barrier in the graph).
    p.ctx->set_block_runner([this, prog](int idx) { RunOps(*prog, GetPlan(*prog, idx), 1); });
    p.trace_detail = "#" + std::to_string(i);
    for (auto& kv : op->outputs())
      if (!kv.second.empty()) {
        p.trace_detail += " -> " + kv.second[0];
        break;
      }
    auto resolve = [&](const std::vector<std::string>& args) {
      std::vector<Variable*> vars;
      for (auto& a : args) {
        if (a == kEmptyVarName) {
          vars.push_back(nullptr);
          continue;
        }
        auto it = plan->vars.find(a);
        KEEL_ENFORCE(it != plan->vars.end(), "op #", i, " ", op->type(), ": variable '", a,
                     "' is not declared in the program");
        vars.push_back(it->second.first);
      }
      return vars;
    };
    DependencyGraph::OpAccess& acc = access[i];
    for (auto& kv : op->inputs()) {
      p.ctx->AddInput(kv.first, resolve(kv.second));
      for (auto& a : kv.second)
        if (a != kEmptyVarName) acc.reads.push_back(a);
    }
    for (auto& kv : op->outputs()) {
      std::vector<DType> dtypes;  // as declared: a narrowed output's (OpTraits::narrows_outputs)
      for (auto& a : kv.second) {
        auto it = plan->vars.find(a);
        dtypes.push_back(it != plan->vars.end() ? it->second.second->dtype() : DType::kFloat32);
      }
      p.ctx->AddOutput(kv.first, resolve(kv.second), std::move(dtypes));
      for (auto& a : kv.second)
        if (a != kEmptyVarName) acc.writes.push_back(a);
    }
    // Ops that run blocks touch variables the graph cannot see; a barrier trait orders an op
    // against all others (one that creates a ring later collectives use).
    const OpTraits& traits = OpRegistry::Traits(op->type());
    for (const auto& [out_slot, in_slot] : traits.may_share) {
      const auto& outs = op->Output(out_slot);
      const auto& ins = op->Input(in_slot);
      if (outs.size() == 1 && ins.size() == 1 && shareable(outs[0]) && shareable(ins[0]))
        p.ctx->AllowSharing(out_slot);
    }
    acc.hidden_accesses = op->HasAttr("sub_block");
    acc.barrier = acc.hidden_accesses || !traits.barrier.empty();
    if (!traits.fused_slot.empty() && !op->Output(traits.fused_slot).empty())
      for (auto& name : op->Output(traits.slices_slot))
        slice_of[name] = op->Output(traits.fused_slot)[0];
    if (traits.on_ring) {
      if (op->HasAttr("use_calc_stream") && op->Attr<bool>("use_calc_stream")) {
        // In order with compute, as if on its stream: after every earlier op, before every later
        // one (which also keeps the ring's program order against its stream's ops).
        acc.barrier = true;
        p.calc_stream = true;
        any_calc_stream = true;
      } else {
        p.on_stream = true;
        any_stream = true;
        if (!FLAGS_comm_overlap) acc.barrier = true;
      }
    }
    if (op->HasAttr("seed")) {
      int attr_seed = op->Attr<int>("seed");
      uint64_t seed = attr_seed != 0 ? static_cast<uint64_t>(attr_seed)
                      : program.random_seed() != 0
                          ? SplitMix64(static_cast<uint64_t>(program.random_seed()) * 1000003u + i)
                          : (static_cast<uint64_t>(rd()) << 32) ^ rd();
      p.ctx->set_seed(seed);
    }
    plan->ops.push_back(std::move(p));
  }
  // A tensor that a ring all-reduces in place (a fused buffer, a 16-bit copy of a gradient) is
  // allocated by the op that makes it where that ring reads and writes it without copies (the
  // first all-reduce of it decides), and is kept from step to step: freeing it would give its
  // shared pages back, to be faulted in again at the next step.
  std::set<std::string> ring_buffers;
  if (place_.is_cpu()) {
    std::map<std::string, int> ring_of;
    for (auto it = plan->ops.rbegin(); it != plan->ops.rend(); ++it) {
      const OpDesc& d = *it->desc;
      if (OpRegistry::Traits(d.type()).all_reduces_in_place && d.Input("X").size() == 1 &&
          d.HasAttr("ring_id"))
        ring_of[d.Input("X")[0]] = d.Attr<int>("ring_id");
    }
    for (size_t i = 0; i < plan->ops.size(); ++i) {
      Plan::Op& op = plan->ops[i];
      if (OpRegistry::Traits(op.desc->type()).on_ring) continue;
      const std::vector<std::string>& reads = access[i].reads;
      for (const std::string& name : access[i].writes) {
        auto ring = ring_of.find(name);
        auto var = plan->vars.find(name);
        if (ring == ring_of.end() || var == plan->vars.end() ||
            std::find(reads.begin(), reads.end(), name) != reads.end())
          continue;
        const VarDesc* vd = var->second.second;
        const DDim dims(vd->shape());
        if (!dims.known()) continue;
        op.ring_outputs.push_back({var->second.first, ring->second,
                                   static_cast<size_t>(dims.numel()) * SizeOf(vd->dtype())});
        ring_buffers.insert(name);
      }
    }
  }
  plan->deps = std::make_unique<DependencyGraph>(access, slice_of);
  plan->width = plan->deps->MaxWidth();
  if (place_.is_cpu()) {
    plan->collect = EagerDeletionPlan(access, owned, slice_of, ring_buffers);
  } else {
    KEEL_ENFORCE(gflags::GetCommandLineFlagInfoOrDie("eager_delete_tensor_gb").is_default ||
                     FLAGS_eager_delete_tensor_gb < 0,
                 "FLAGS_eager_delete_tensor_gb=", FLAGS_eager_delete_tensor_gb, ": ", place_.str(),
                 " keeps temporaries until the scope drop (eager deletion runs on "
                 "CPU places); leave the flag unset or set it to -1");
  }
  if (any_stream) {
    plan->stream_of.assign(plan->ops.size(), nullptr);
    for (size_t i = 0; i < plan->ops.size(); ++i)
      if (plan->ops[i].on_stream)
        plan->stream_of[i] = RingStream(plan->ops[i].desc->Attr<int>("ring_id"));
  }
  if (place_.is_cuda() && (any_stream || any_calc_stream)) {
    std::vector<int> lanes(plan->ops.size(), 0);
    for (size_t i = 0; i < plan->ops.size(); ++i)
      if (plan->ops[i].on_stream) lanes[i] = plan->ops[i].desc->Attr<int>("ring_id") + 1;
    plan->events = PlanEvents(*plan->deps, lanes);
    plan->device_events = true;
    plan->start_event = DeviceEventCreate(place_);
    for (size_t i = 0; i < plan->ops.size(); ++i) {
      Plan::Op& op = plan->ops[i];
      if (plan->events.record_after[i]) op.event = DeviceEventCreate(place_);
      if (op.calc_stream) {
        op.calc_in = DeviceEventCreate(place_);
        op.calc_out = DeviceEventCreate(place_);
      }
    }
  }
  return plan;
}

std::vector<Tensor> Executor::Run(const Program& program, const FeedMap& feed,
                                  const std::vector<std::string>& fetch, FetchMode mode) {
  Plan& plan = GetPlan(program);
  const ExecutionStrategy& strategy = StrategyFor(program);
  const bool graphed = strategy.use_cuda_graph;
  if (graphed && !plan.captured) {
    CheckGraphable(program);
    plan.captured = std::make_unique<CapturedStep>(place_);
  }
  if (!graphed) plan.DropCapturedStep();  // plain runs move the feeds' buffers

  for (auto& kv : feed) {
    auto it = plan.vars.find(kv.first);
    KEEL_ENFORCE(it != plan.vars.end(), "feed '", kv.first, "' is not a variable of the program");
    const VarDesc& desc = *it->second.second;
    const Tensor& t = kv.second;
    KEEL_ENFORCE(t.initialized(), "feed '", kv.first, "' holds no data");
    KEEL_ENFORCE(t.dtype() == desc.dtype(), "feed '", kv.first, "' has dtype ",
                 DTypeName(t.dtype()), ", the program declares ", DTypeName(desc.dtype()));
    const DDim want = desc.dims();
    bool ok = want.size() == t.dims().size();
    for (int d = 0; ok && d < want.size(); ++d) ok = want[d] < 0 || want[d] == t.dims()[d];
    KEEL_ENFORCE(ok, "feed '", kv.first, "' has shape ", t.dims().str(), ", the program declares ",
                 want.str(), " (-1 matches any size)");
    Tensor* dst = it->second.first->mutable_tensor();
    if (graphed) {
      // A graph copies into the buffer it captured: keep the var's buffer while the shape holds.
      if (!dst->initialized() || dst->dtype() != t.dtype() || dst->dims() != t.dims() ||
          dst->place() != place_) {
        dst->Resize(t.dims());
        dst->mutable_data(t.dtype(), place_);
      }
    } else if (t.place() == place_) {
      dst->ShareDataWith(t);
    } else {
      *dst = t.Clone(place_);
    }
  }
  // Checked before running, so a bad name costs no step.
  for (auto& name : fetch) {
    KEEL_ENFORCE(plan.vars.count(name), "fetch '", name, "' is not a variable of the program");
    KEEL_ENFORCE(mode == FetchMode::kCopy || !plan.vars.at(name).second->persistable(), "fetch '",
                 name, "' is persistable: a run takes only temporaries out of the scope (kTake)");
  }

  if (graphed) {
    RunGraphed(program, plan, feed);
  } else {
    std::set<const Variable*> keep;  // eager deletion frees no fetched variable
    for (auto& name : fetch) keep.insert(plan.vars.at(name).first);
    RunOps(program, plan, WorkersFor(program), keep);
  }
  ++*plan.runs;

  std::vector<Tensor> results;
  results.reserve(fetch.size());
  for (auto& name : fetch) {
    Tensor* t = plan.vars.at(name).first->mutable_tensor();
    KEEL_ENFORCE(t->initialized(), "fetch '", name, "' holds no data after the run");
    if (mode == FetchMode::kCopy) {
      results.push_back(t->Clone(CPUPlace()));
    } else {
      results.push_back(*t);  // shares the buffer, which the var then lets go
      t->clear();
    }
  }
  if (mode == FetchMode::kTake) {
    // A var sharing a taken buffer (OpTraits::may_share) lets it go too, so that the next run
    // writes none of them into what the caller now holds.
    std::set<const Allocation*> taken;
    for (const Tensor& r : results) taken.insert(r.holder().get());
    for (auto& kv : plan.vars) {
      Tensor* t = kv.second.first->mutable_tensor();
      if (!kv.second.second->persistable() && t->initialized() && taken.count(t->holder().get()))
        t->clear();
    }
  }

  const int drop = strategy.num_iteration_per_drop_scope;
  if (*plan.runs % drop == 0) {
    // The graph writes the temporaries' buffers on every replay: it goes first, and the steps
    // after the drop warm up and capture again. (Other programs' graphs notice on their own.)
    plan.DropCapturedStep();
    // This block's temporaries and those of the sub-blocks it ran.
    for (auto it = plans_.lower_bound({program.id(), 0});
         it != plans_.end() && it->first.first == program.id(); ++it)
      for (Variable* v : it->second->temporaries) v->mutable_tensor()->clear();
    // The CPU cache gives its free segments back, and glibc the heap memory it keeps (it also
    // raises its mmap threshold after big frees).
    if (place_.is_cpu()) {
      CpuAllocatorEmptyCache();
      malloc_trim(0);
    }
  }
  return results;
}

void Executor::CheckGraphable(const Program& program) {
  KEEL_ENFORCE(place_.is_cuda(),
               "ExecutionStrategy::use_cuda_graph (keel train --cuda_graph) "
               "needs a CUDA place; this executor runs on ",
               place_.str());
  KEEL_ENFORCE(!FLAGS_check_nan_inf,
               "ExecutionStrategy::use_cuda_graph: FLAGS_check_nan_inf "
               "reads every output on the host after its op, which a CUDA graph cannot do; turn "
               "one of them off");
  KEEL_ENFORCE(!FLAGS_profile_sync_ops,
               "ExecutionStrategy::use_cuda_graph: FLAGS_profile_sync_ops waits for the device "
               "after every op, which a captured CUDA graph cannot do; turn one of them off");
}

void Executor::RunGraphed(const Program& program, Plan& plan, const FeedMap& feed) {
  CapturedStep& captured = *plan.captured;
  if (!captured.rings_known()) {  // the rings exist once the startup program has run
    std::vector<Communicator*> rings;
    for (const Plan::Op& op : plan.ops) {
      if (!op.on_stream && !op.calc_stream) continue;
      // A ring op without its ring runs on the compute stream (RunOp): no ring to watch.
      const int ring_id = op.desc->Attr<int>("ring_id");
      if (!RingRegistry::Get().Has(ring_id)) continue;
      Communicator* ring = &RingRegistry::Get().At(ring_id, op.desc->type());
      if (std::find(rings.begin(), rings.end(), ring) == rings.end()) rings.push_back(ring);
    }
    captured.SetRings(std::move(rings));
  }
  const GraphCapturePolicy::Action action = captured.Decide(feed);
  // Device feeds are copied into the vars' buffers before the step, outside the graph.
  for (auto& kv : feed)
    if (!kv.second.place().is_cpu())
      plan.vars.at(kv.first).first->mutable_tensor()->CopyFrom(kv.second);
  if (action == GraphCapturePolicy::Action::kPlain) {
    for (auto& kv : feed)
      if (kv.second.place().is_cpu())
        plan.vars.at(kv.first).first->mutable_tensor()->CopyFrom(kv.second);
    RunOps(program, plan, WorkersFor(program));
    return;
  }
  CapturedStep::Step step;
  step.feed = &feed;
  step.var = [&plan](const std::string& name) { return plan.vars.at(name).first; };
  for (auto& kv : plan.vars) step.vars.push_back(kv.second.first);
  for (auto& op : plan.ops) step.contexts.push_back(op.ctx.get());
  step.run_ops = [&] { RunOps(program, plan, WorkersFor(program)); };
  step.run_index = *plan.runs;
  if (action == GraphCapturePolicy::Action::kCapture) {
    captured.Capture(program, step);
    return;
  }
  profiler::RecordEvent span("op", "cuda_graph_launch", "replay of the captured step");
  // What kernels reported in earlier replays (bad labels, ids), as Compute would check it.
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    try {
      plan.ops[i].kernel->Replayed(*plan.ops[i].ctx);
    } catch (const Error& e) {
      KEEL_THROW(plan.OpWhere(static_cast<int>(i)), ": ", e.what());
    }
  }
  captured.Replay(step);
}

void Executor::RunOps(const Program& program, Plan& plan, int workers,
                      const std::set<const Variable*>& keep) {
  if (plan.device_events) DeviceEventRecord(place_, plan.start_event, nullptr);
  std::optional<EagerDeletionRun> collect;
  if (!plan.collect.empty() && FLAGS_eager_delete_tensor_gb >= 0)
    collect.emplace(plan.collect, keep,
                    static_cast<int64_t>(FLAGS_eager_delete_tensor_gb * (1 << 30)));
  Scheduler::Run(*plan.deps, plan.stream_of, workers, [this, &plan, &collect](int i) {
    RunOp(plan, i);
    if (collect) collect->OpDone(i);
  });
  if (collect) collect->Finish();
  // The compute stream (fetches, the next run) comes after every ring's last collective.
  if (plan.device_events)
    for (int i : plan.events.final_waits) DeviceStreamWaitEvent(place_, nullptr, plan.ops[i].event);
}

void Executor::RunOp(Plan& plan, int i) {
  Plan::Op& op = plan.ops[i];
  profiler::RecordEvent span(op.on_stream ? "comm" : "op", op.desc->type(), op.trace_detail);
  try {
    // CUDA: the op's stream (the compute stream, or the ring's) waits for the events of the ops
    // on other streams it depends on.
    void* stream = nullptr;
    void* ring_stream = nullptr;
    // A ring op whose ring this process lacks runs on the compute stream; its kernel decides
    // whether that is an error (a collective names the ring; sync_batch_norm alone in its job
    // normalizes its own batch).
    const int ring_id = op.desc->HasAttr("ring_id") ? op.desc->Attr<int>("ring_id") : -1;
    if (plan.device_events && (op.on_stream || op.calc_stream) &&
        RingRegistry::Get().Has(ring_id)) {
      ring_stream = RingRegistry::Get().At(ring_id, op.desc->type()).device_stream();
      KEEL_ENFORCE(ring_stream != nullptr, "ring ", ring_id,
                   " serves CPU tensors (c_comm_init with device_id -1) but this executor runs on ",
                   place_.str());
    }
    if (plan.device_events) {
      if (op.on_stream) {
        stream = ring_stream;
        DeviceStreamWaitEvent(place_, stream, plan.start_event);
      }
      for (int p : plan.events.waits[i]) DeviceStreamWaitEvent(place_, stream, plan.ops[p].event);
    }
    if (op.schema->infer_shape()) {
      RuntimeInferShapeContext shape_ctx(*op.ctx);
      op.schema->infer_shape()(shape_ctx);
    }
    if (op.calc_in) {  // use_calc_stream: the ring's stream joins the compute stream's order
      DeviceEventRecord(place_, op.calc_in, nullptr);
      DeviceStreamWaitEvent(place_, ring_stream, op.calc_in);
    }
    for (const auto& out : op.ring_outputs)
      PlaceForRing(out.var->mutable_tensor(), out.ring, out.bytes, op.desc->type());
    op.kernel->Compute(*op.ctx);
    if (FLAGS_profile_sync_ops && place_.is_cuda()) DeviceSynchronize(place_);
    if (op.calc_out) {
      DeviceEventRecord(place_, op.calc_out, ring_stream);
      DeviceStreamWaitEvent(place_, nullptr, op.calc_out);
    }
    if (op.event) DeviceEventRecord(place_, op.event, stream);
    if (FLAGS_check_nan_inf) {
      for (const auto& slot : op.ctx->output_slots()) {
        const auto& names = op.desc->Output(slot.name);
        for (size_t k = 0; k < slot.vars.size(); ++k) {
          if (!slot.vars[k] || !slot.vars[k]->tensor().initialized()) continue;
          const Tensor& t = slot.vars[k]->tensor();
          const bool half = t.dtype() == DType::kBFloat16 || t.dtype() == DType::kFloat16;
          if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kFloat64 && !half) continue;
          Tensor host = t.place().is_cpu() ? t : t.Clone(CPUPlace());
          if (half) host = WidenedOnHost(host);  // a 16-bit output (AMP, a narrowed gradient)
          int64_t bad = host.dtype() == DType::kFloat32 ? FirstNonFinite<float>(host)
                                                        : FirstNonFinite<double>(host);
          if (bad < 0) continue;
          double v =
              host.dtype() == DType::kFloat32 ? host.data<float>()[bad] : host.data<double>()[bad];
          KEEL_THROW("FLAGS_check_nan_inf: output ", slot.name, " '", names[k], "' ",
                     t.dims().str(), " holds ", std::isnan(v) ? "NaN" : "Inf", " (element ", bad,
                     " is ", v, "), the first op to produce one");
        }
      }
    }
  } catch (const Error& e) {
    KEEL_THROW(plan.OpWhere(i), ": ", e.what());
  } catch (const std::bad_alloc&) {
    KEEL_THROW(plan.OpWhere(i), ": out of memory");
  }
}

}  // namespace keel
