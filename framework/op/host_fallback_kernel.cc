#include "framework/op/host_fallback_kernel.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <mutex>
#include <set>
#include <unordered_map>

#include "framework/op/execution_context.h"

DEFINE_bool(cuda_host_fallback, true,
            "On a CUDA place, run an op that has no CUDA kernel through its CPU kernel on host "
            "copies (synchronises the device); false: such an op is an error.");

namespace keel {

namespace {

class HostFallbackKernel : public OpKernel {
 public:
  HostFallbackKernel(std::unique_ptr<OpKernel> cpu) : cpu_(std::move(cpu)) {}

  void Compute(ExecutionContext& ctx) override {
    std::unordered_map<Variable*, std::unique_ptr<Variable>> shadows;
    // The host twin of a device variable: one per variable, so an in-place op (ParamOut is
    // Param) reads and writes one host tensor.
    auto shadow = [&](Variable* v) -> Variable* {
      if (v == nullptr) return nullptr;
      auto& s = shadows[v];
      if (!s) {
        s = std::make_unique<Variable>();
        const Tensor& t = v->tensor();
        Tensor* h = s->mutable_tensor();
        if (t.initialized() && t.dims().known()) {
          *h = t.Clone(CPUPlace());
        } else {
          h->Resize(t.dims());
          h->set_dtype(t.dtype());
        }
      }
      return s.get();
    };
    ExecutionContext host(&ctx.op(), CPUPlace());
    host.set_seed(ctx.seed());
    auto map = [&](const std::vector<Variable*>& vars) {
      std::vector<Variable*> r;
      for (Variable* v : vars) r.push_back(shadow(v));
      return r;
    };
    for (auto& s : ctx.input_slots()) host.AddInput(s.name, map(s.vars));
    for (auto& s : ctx.output_slots()) host.AddOutput(s.name, map(s.vars), s.dtypes);
    cpu_->Compute(host);
    // Outputs back into their device tensors (their own allocation when it fits).
    for (auto& s : ctx.output_slots()) {
      for (Variable* v : s.vars) {
        if (v == nullptr) continue;
        const Tensor& h = shadows.at(v)->tensor();
        if (!h.initialized()) continue;
        Tensor* d = v->mutable_tensor();
        d->Resize(h.dims());
        void* dst = d->mutable_data(h.dtype(), ctx.place());
        MemCopy(ctx.place(), dst, CPUPlace(), h.raw_data(), h.nbytes());
      }
    }
  }

 private:
  std::unique_ptr<OpKernel> cpu_;
};

}  // namespace

bool CudaHostFallbackAllowed() { return FLAGS_cuda_host_fallback; }

std::unique_ptr<OpKernel> MakeHostFallbackKernel(std::unique_ptr<OpKernel> cpu_kernel,
                                                 const std::string& op_type) {
  static std::mutex mu;
  static std::set<std::string> logged;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (logged.insert(op_type).second)
      VLOG(1) << "op " << op_type << " has no CUDA kernel: it runs its CPU kernel on host copies";
  }
  return std::make_unique<HostFallbackKernel>(std::move(cpu_kernel));
}

}  // namespace keel
