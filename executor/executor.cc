#include "executor/executor.h"

#include <glog/logging.h>

#include <new>
#include <random>
#include <unordered_map>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/op/validate_program.h"
#include "framework/profiler/profiler.h"

namespace keel {

namespace {

// splitmix64: derives well-spread per-op seeds from (program seed, op index).
uint64_t MixSeed(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string SlotsText(const OpDesc::VarMap& m) {
  std::string s;
  for (auto& kv : m) {
    if (!s.empty()) s += ", ";
    s += kv.first + "=";
    for (size_t i = 0; i < kv.second.size(); ++i) s += (i ? "," : "") + kv.second[i];
  }
  return s;
}

}  // namespace

struct Executor::Plan {
  struct Op {
    const OpDesc* desc;
    const OpSchema* schema;
    std::unique_ptr<OpKernel> kernel;
    std::unique_ptr<ExecutionContext> ctx;
    std::string trace_detail;  // "#i -> first output", for the profiler
  };
  uint64_t version = 0;
  int block = 0;
  std::vector<Op> ops;
  std::unordered_map<std::string, std::pair<Variable*, const VarDesc*>> vars;
  std::vector<Variable*> temporaries;
  int64_t runs = 0;
};

Executor::Executor(const Place& place, ExecutionStrategy strategy)
    : place_(place), strategy_(strategy), scope_(std::make_unique<Scope>()) {
  local_scope_ = &scope_->NewScope();
  KEEL_ENFORCE(place.is_cpu() || CudaAvailable(), "Executor on ", place.str(),
               ": no CUDA device is available to this process");
}

Executor::~Executor() = default;

int64_t Executor::RunCount(const Program& program) const {
  auto it = plans_.find({program.id(), 0});
  return it == plans_.end() ? 0 : it->second->runs;
}

Executor::Plan& Executor::GetPlan(const Program& program, int block) {
  KEEL_ENFORCE(block >= 0 && block < program.num_blocks(), "block ", block,
               " is not a block of the program (it has ", program.num_blocks(), ")");
  auto& slot = plans_[{program.id(), block}];
  if (!slot || slot->version != program.version()) {
    // Once per program version, before any op of it runs: a hand-built or loaded program that
    // the registry cannot vouch for is an error here, not a crash in a kernel.
    if (block == 0) ValidateProgram(program, "program");
    int64_t runs = slot ? slot->runs : 0;
    slot = BuildPlan(program, block);
    slot->runs = runs;
  }
  return *slot;
}

std::unique_ptr<Executor::Plan> Executor::BuildPlan(const Program& program, int block_idx) {
  auto plan = std::make_unique<Plan>();
  plan->version = program.version();
  plan->block = block_idx;
  const Block& block = program.block(block_idx);
  // The block's vars and those of its ancestors (a sub-block reads and writes its parent's):
  // the nearest declaration of a name wins.
  for (int b = block_idx; b >= 0; b = program.block(b).parent_idx()) {
    for (VarDesc* v : program.block(b).AllVars()) {
      if (plan->vars.count(v->name())) continue;
      Variable* var = v->persistable() ? scope_->Var(v->name()) : local_scope_->Var(v->name());
      plan->vars[v->name()] = {var, v};
      if (!v->persistable() && b == block_idx) plan->temporaries.push_back(var);
    }
  }
  std::random_device rd;
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
    const Program* prog = &program;
    p.ctx->set_block_runner([this, prog](int idx) { RunOps(*prog, GetPlan(*prog, idx)); });
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
    for (auto& kv : op->inputs()) p.ctx->AddInput(kv.first, resolve(kv.second));
    for (auto& kv : op->outputs()) p.ctx->AddOutput(kv.first, resolve(kv.second));
    if (op->HasAttr("seed")) {
      int attr_seed = op->Attr<int>("seed");
      uint64_t seed = attr_seed != 0 ? static_cast<uint64_t>(attr_seed)
                      : program.random_seed() != 0
                          ? MixSeed(static_cast<uint64_t>(program.random_seed()) * 1000003u + i)
                          : (static_cast<uint64_t>(rd()) << 32) ^ rd();
      p.ctx->set_seed(seed);
    }
    plan->ops.push_back(std::move(p));
  }
  return plan;
}

std::vector<Tensor> Executor::Run(const Program& program, const FeedMap& feed,
                                  const std::vector<std::string>& fetch) {
  Plan& plan = GetPlan(program);

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
    KEEL_ENFORCE(ok, "feed '", kv.first, "' has shape ", t.dims().str(),
                 ", the program declares ", want.str(), " (-1 matches any size)");
    Tensor* dst = it->second.first->mutable_tensor();
    if (t.place() == place_) {
      dst->ShareDataWith(t);
    } else {
      *dst = t.Clone(place_);
    }
  }

  RunOps(program, plan);
  ++plan.runs;

  std::vector<Tensor> results;
  int freq = strategy_.fetch_frequency < 1 ? 1 : strategy_.fetch_frequency;
  if (!fetch.empty() && (plan.runs - 1) % freq == 0) {
    results.reserve(fetch.size());
    for (auto& name : fetch) {
      auto it = plan.vars.find(name);
      KEEL_ENFORCE(it != plan.vars.end(), "fetch '", name, "' is not a variable of the program");
      const Tensor& t = it->second.first->tensor();
      KEEL_ENFORCE(t.initialized(), "fetch '", name, "' holds no data after the run");
      results.push_back(t.Clone(CPUPlace()));
    }
  }

  int drop = strategy_.num_iteration_per_drop_scope;
  if (drop > 0 && plan.runs % drop == 0) {
    // This block's temporaries and those of the sub-blocks it ran.
    for (auto it = plans_.lower_bound({program.id(), 0});
         it != plans_.end() && it->first.first == program.id(); ++it)
      for (Variable* v : it->second->temporaries) v->mutable_tensor()->clear();
  }
  return results;
}

void Executor::RunOps(const Program& program, Plan& plan) {
  const std::string where =
      plan.block == 0 ? std::string() : StrCat("block ", plan.block, " ");
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    Plan::Op& op = plan.ops[i];
    profiler::RecordEvent span("op", op.desc->type(), op.trace_detail);
    try {
      if (op.schema->infer_shape()) {
        RuntimeInferShapeContext shape_ctx(*op.ctx);
        op.schema->infer_shape()(shape_ctx);
      }
      op.kernel->Compute(*op.ctx);
    } catch (const Error& e) {
      KEEL_THROW(where, "op #", i, " ", op.desc->type(), " (", SlotsText(op.desc->inputs()),
                 " -> ", SlotsText(op.desc->outputs()), "): ", e.what());
    } catch (const std::bad_alloc&) {
      KEEL_THROW(where, "op #", i, " ", op.desc->type(), " (", SlotsText(op.desc->inputs()), " -> ",
                 SlotsText(op.desc->outputs()), "): out of memory");
    }
  }
}

}  // namespace keel
