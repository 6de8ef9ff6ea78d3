// keel's CPU kernels against oneDNN's primitives, op by op, on the built-in models' shapes: what
// decided which kernels keel keeps (docs/performance.md). Each side runs on one thread (median of
// 200 runs after 20 warm-up runs, interleaved); keel's side is a one-op program run by the
// Executor, oneDNN's a primitive created once on plain NCHW memory (keel's layout).
//   cmake --build build --target op_kernels_bench && build/tests/op_kernels_bench
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "framework/init.h"
#include "framework/runtime/cpu_threads.h"
#include "tests/util/grad_checker.h"

namespace keel {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DT = memory::data_type;

// Median microseconds of fn; -1 when oneDNN refuses to run it.
double MedianUs(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const dnnl::error& e) {
    std::printf("  (oneDNN: %s)\n", e.what());
    return -1;
  }
  for (int i = 0; i < 20; ++i) fn();
  std::vector<double> us;
  for (int i = 0; i < 200; ++i) {
    auto t = std::chrono::steady_clock::now();
    fn();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// A one-op program over data variables of the given shapes; Run() runs it on feeds of random
// values.
struct OneOp {
  Program prog;
  Executor exe;
  FeedMap feed;
  OneOp(const std::string& type, const std::map<std::string, DDim>& inputs,
        const OpDesc::VarMap& in_slots, const OpDesc::VarMap& out_slots,
        const std::map<std::string, Attribute>& attrs) {
    Block& b = prog.global_block();
    uint64_t seed = 1;
    for (const auto& [name, dims] : inputs) {
      VarDesc* v = b.Var(name);
      v->set_shape(dims.vec());
      v->set_is_data(true);
      feed[name] = testing::RandomTensor(dims, DType::kFloat32, 0.1, 1, seed++);
    }
    AppendOp(b, type, in_slots, out_slots, attrs);
  }
  void Run() { exe.Run(prog, feed); }
};

const dnnl::engine& Eng() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

memory Mem(const memory::desc& md) {
  memory m(md, Eng());
  float* p = static_cast<float*>(m.get_data_handle());
  for (size_t i = 0; i < md.get_size() / sizeof(float); ++i) p[i] = 0.1f + 0.001f * (i % 97);
  return m;
}

memory::dims Dims(const DDim& d) {
  const std::vector<int64_t> v = d.vec();
  return memory::dims(v.begin(), v.end());
}

void Row(const std::string& op, const DDim& shape, double keel_us, double onednn_us) {
  std::printf("%-22s %-18s keel %9.1f us   oneDNN %9.1f us   keel/oneDNN %.2f\n", op.c_str(),
              shape.str().c_str(), keel_us, onednn_us, keel_us / onednn_us);
}

void BatchNorm(const DDim& x) {
  const DDim c{x[1]};
  OneOp fwd("batch_norm", {{"x", x}, {"s", c}, {"b", c}, {"m", c}, {"v", c}},
            {{"X", {"x"}}, {"Scale", {"s"}}, {"Bias", {"b"}}, {"Mean", {"m"}}, {"Variance", {"v"}}},
            {{"Y", {"y"}},
             {"MeanOut", {"m"}},
             {"VarianceOut", {"v"}},
             {"SavedMean", {"sm"}},
             {"SavedVariance", {"sv"}}},
            {});
  OneOp bwd(
      "batch_norm_grad",
      {{"x", x}, {"s", c}, {"b", c}, {"m", c}, {"v", c}, {"sm", c}, {"sv", c}, {"y", x}, {"dy", x}},
      {{"X", {"x"}},
       {"Scale", {"s"}},
       {"Bias", {"b"}},
       {"Mean", {"m"}},
       {"Variance", {"v"}},
       {"SavedMean", {"sm"}},
       {"SavedVariance", {"sv"}},
       {"Y", {"y"}},
       {"Y@GRAD", {"dy"}}},
      {{"X@GRAD", {"dx"}}, {"Scale@GRAD", {"ds"}}, {"Bias@GRAD", {"db"}}}, {});
  const memory::desc md(Dims(x), DT::f32, Tag::nchw);
  const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  dnnl::batch_normalization_forward::primitive_desc fpd(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, md, 1e-5f, flags),
      Eng());
  dnnl::batch_normalization_backward::primitive_desc bpd(
      dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, md, md, 1e-5f, flags),
      Eng(), fpd);
  std::printf("  (oneDNN implementations: %s / %s)\n", fpd.impl_info_str(), bpd.impl_info_str());
  memory src = Mem(md), dst = Mem(md), mean = Mem(fpd.mean_desc()), var = Mem(fpd.variance_desc());
  memory scale = Mem(fpd.weights_desc()), shift = Mem(fpd.weights_desc());
  memory dsrc = Mem(md), ddst = Mem(md), dscale = Mem(fpd.weights_desc()),
         dshift = Mem(fpd.weights_desc());
  dnnl::stream st(Eng());
  dnnl::batch_normalization_forward f(fpd);
  dnnl::batch_normalization_backward b(bpd);
  Row("batch_norm", x, MedianUs([&] { fwd.Run(); }), MedianUs([&] {
        f.execute(st, {{DNNL_ARG_SRC, src},
                       {DNNL_ARG_DST, dst},
                       {DNNL_ARG_MEAN, mean},
                       {DNNL_ARG_VARIANCE, var},
                       {DNNL_ARG_SCALE, scale},
                       {DNNL_ARG_SHIFT, shift}});
      }));
  Row("batch_norm_grad", x, MedianUs([&] { bwd.Run(); }), MedianUs([&] {
        b.execute(st, {{DNNL_ARG_SRC, src},
                       {DNNL_ARG_DIFF_DST, ddst},
                       {DNNL_ARG_MEAN, mean},
                       {DNNL_ARG_VARIANCE, var},
                       {DNNL_ARG_SCALE, scale},
                       {DNNL_ARG_SHIFT, shift},
                       {DNNL_ARG_DIFF_SRC, dsrc},
                       {DNNL_ARG_DIFF_SCALE, dscale},
                       {DNNL_ARG_DIFF_SHIFT, dshift}});
      }));
}

void Relu(const DDim& x) {
  OneOp fwd("relu", {{"x", x}}, {{"X", {"x"}}}, {{"Out", {"y"}}}, {});
  OneOp bwd("relu_grad", {{"y", x}, {"dy", x}}, {{"Out", {"y"}}, {"Out@GRAD", {"dy"}}},
            {{"X@GRAD", {"dx"}}}, {});
  const memory::desc md(Dims(x), DT::f32, Tag::nchw);
  dnnl::eltwise_forward::primitive_desc fpd(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training,
                                  dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md, 0.f),
      Eng());
  dnnl::eltwise_backward::primitive_desc bpd(
      dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, md, md, 0.f),
      Eng(), fpd);
  memory src = Mem(md), dst = Mem(md), ddst = Mem(md), dsrc = Mem(md);
  dnnl::stream st(Eng());
  dnnl::eltwise_forward f(fpd);
  dnnl::eltwise_backward b(bpd);
  Row("relu", x, MedianUs([&] { fwd.Run(); }), MedianUs([&] {
        f.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
      }));
  Row("relu_grad", x, MedianUs([&] { bwd.Run(); }), MedianUs([&] {
        b.execute(st, {{DNNL_ARG_DST, dst}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_SRC, dsrc}});
      }));
}

void Add(const DDim& x) {
  OneOp fwd("elementwise_add", {{"x", x}, {"y", x}}, {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"z"}}},
            {});
  const memory::desc md(Dims(x), DT::f32, Tag::nchw);
  dnnl::binary::primitive_desc pd(dnnl::binary::desc(dnnl::algorithm::binary_add, md, md, md),
                                  Eng());
  memory a = Mem(md), b = Mem(md), c = Mem(md);
  dnnl::stream st(Eng());
  dnnl::binary p(pd);
  Row("elementwise_add", x, MedianUs([&] { fwd.Run(); }), MedianUs([&] {
        p.execute(st, {{DNNL_ARG_SRC_0, a}, {DNNL_ARG_SRC_1, b}, {DNNL_ARG_DST, c}});
      }));
}

void MaxPool(const DDim& x) {
  const DDim y{x[0], x[1], x[2] / 2, x[3] / 2};
  const std::map<std::string, Attribute> attrs = {{"pooling_type", std::string("max")},
                                                  {"ksize", std::vector<int>{2, 2}},
                                                  {"strides", std::vector<int>{2, 2}}};
  OneOp fwd("pool2d", {{"x", x}}, {{"X", {"x"}}}, {{"Out", {"y"}}}, attrs);
  OneOp bwd("pool2d_grad", {{"x", x}, {"y", y}, {"dy", y}},
            {{"X", {"x"}}, {"Out", {"y"}}, {"Out@GRAD", {"dy"}}}, {{"X@GRAD", {"dx"}}}, attrs);
  const memory::desc xmd(Dims(x), DT::f32, Tag::nchw), ymd(Dims(y), DT::f32, Tag::nchw);
  dnnl::pooling_forward::primitive_desc fpd(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max,
                                  xmd, ymd, {2, 2}, {2, 2}, {0, 0}, {0, 0}),
      Eng());
  dnnl::pooling_backward::primitive_desc bpd(
      dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, xmd, ymd, {2, 2}, {2, 2}, {0, 0},
                                   {0, 0}),
      Eng(), fpd);
  memory src = Mem(xmd), dst = Mem(ymd), ws = Mem(fpd.workspace_desc()), ddst = Mem(ymd),
         dsrc = Mem(xmd);
  dnnl::stream st(Eng());
  dnnl::pooling_forward f(fpd);
  dnnl::pooling_backward b(bpd);
  Row("pool2d max 2x2", x, MedianUs([&] { fwd.Run(); }), MedianUs([&] {
        f.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}, {DNNL_ARG_WORKSPACE, ws}});
      }));
  Row("pool2d_grad max 2x2", x, MedianUs([&] { bwd.Run(); }), MedianUs([&] {
        b.execute(st,
                  {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_SRC, dsrc}, {DNNL_ARG_WORKSPACE, ws}});
      }));
}

void Softmax(const DDim& x) {
  OneOp fwd("softmax", {{"x", x}}, {{"X", {"x"}}}, {{"Out", {"y"}}}, {});
  const memory::desc md(Dims(x), DT::f32, x.size() == 2 ? Tag::ab : Tag::abcd);
  dnnl::softmax_forward::primitive_desc pd(
      dnnl::softmax_forward::desc(dnnl::prop_kind::forward_training, md, x.size() - 1), Eng());
  memory src = Mem(md), dst = Mem(md);
  dnnl::stream st(Eng());
  dnnl::softmax_forward p(pd);
  Row("softmax", x, MedianUs([&] { fwd.Run(); }), MedianUs([&] {
        p.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
      }));
}

}  // namespace
}  // namespace keel

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  keel::cpu_threads::SetBudget(1);
  omp_set_num_threads(1);
  using keel::DDim;
  std::printf("# ResNet-20, batch 32\n");
  for (DDim x : {DDim{32, 16, 32, 32}, DDim{32, 32, 16, 16}, DDim{32, 64, 8, 8}}) {
    keel::BatchNorm(x);
    keel::Relu(x);
    keel::Add(x);
  }
  std::printf("# LeNet, batch 64\n");
  keel::MaxPool(DDim{64, 6, 24, 24});
  keel::MaxPool(DDim{64, 16, 8, 8});
  keel::Relu(DDim{64, 6, 24, 24});
  std::printf("# Transformer attention scores (batch 64, 4 heads, 16 tokens), MLP logits\n");
  keel::Softmax(DDim{64, 4, 16, 16});
  keel::Softmax(DDim{128, 10});
  return 0;
}
