#include "tests/util/grad_checker.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/program_guard.h"

namespace keel::testing {

namespace {

bool IsFloat(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

double GetAsDouble(const Tensor& t, int64_t i) {
  return VisitDType(t.dtype(), [&](auto v) -> double {
    using V = decltype(v);
    return static_cast<double>(t.data<V>()[i]);
  });
}

void SetFromDouble(Tensor* t, int64_t i, double x) {
  if (t->dtype() == DType::kFloat64)
    t->data<double>()[i] = x;
  else
    t->data<float>()[i] = static_cast<float>(x);
}

// The built program: one op whose inputs are data vars "<slot>_<i>" and outputs "<slot>_out_<i>".
struct Built {
  Program prog;
  std::map<std::string, std::vector<std::string>> in_names, out_names;
  FeedMap feed;
};

void Build(const OpCase& c, Built* b) {
  Block& block = b->prog.global_block();
  OpDesc::VarMap ins, outs;
  for (auto& [slot, tensors] : c.inputs) {
    std::vector<std::string> names;
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::string n = slot + "_" + std::to_string(i);
      VarDesc* v = block.Var(n);
      v->set_dtype(tensors[i].dtype());
      v->set_dims(tensors[i].dims());
      v->set_is_data(true);
      bool no_grad = std::find(c.no_grad_inputs.begin(), c.no_grad_inputs.end(), slot) !=
                     c.no_grad_inputs.end();
      v->set_stop_gradient(no_grad || !IsFloat(tensors[i].dtype()));
      b->feed[n] = tensors[i];
      names.push_back(n);
    }
    b->in_names[slot] = names;
    ins.emplace_back(slot, names);
  }
  for (auto& [slot, count] : c.outputs) {
    std::vector<std::string> names;
    for (int i = 0; i < count; ++i) names.push_back(slot + "_out_" + std::to_string(i));
    b->out_names[slot] = names;
    outs.emplace_back(slot, names);
  }
  AppendOp(block, c.type, ins, outs, c.attrs);
}

std::string Describe(const OpCase& c) {
  std::ostringstream os;
  os << "case '" << c.name << "' op " << c.type << " inputs:";
  for (auto& [slot, ts] : c.inputs)
    for (auto& t : ts) os << " " << slot << "=" << DTypeName(t.dtype()) << t.dims().str();
  for (auto& [k, v] : c.attrs) os << " " << k << "=" << AttrToString(v);
  return os.str();
}

}  // namespace

Tensor RandomTensor(const DDim& dims, DType dtype, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Tensor t(dtype, dims);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double x = u(rng);
    VisitDType(dtype, [&](auto v) {
      using V = decltype(v);
      t.data<V>()[i] = static_cast<V>(x);
    });
  }
  return t;
}

std::map<std::string, std::vector<Tensor>> RunForward(const OpCase& c, const Place& place) {
  Built b;
  Build(c, &b);
  std::vector<std::string> fetch;
  for (auto& [slot, names] : b.out_names) fetch.insert(fetch.end(), names.begin(), names.end());
  Executor exe(place);
  auto res = exe.Run(b.prog, b.feed, fetch);
  std::map<std::string, std::vector<Tensor>> out;
  size_t k = 0;
  for (auto& [slot, names] : b.out_names)
    for (size_t i = 0; i < names.size(); ++i) out[slot].push_back(res[k++]);
  return out;
}

namespace {
// What AppendLossAndBackward built.
struct LossAndGrads {
  bool has_loss = false;                                     // some float output to sum
  std::vector<std::pair<std::string, std::string>> checked;  // (input var, grad var)
  std::vector<std::string> missing;  // slots of float inputs that got no gradient
};

// Appends loss = sum_k reduce_sum(out_k * w_k) (w_k fed as fixed random data, over the outputs in
// loss_outputs, default all) and its backward, named "loss".
LossAndGrads AppendLossAndBackward(const OpCase& c, const std::vector<std::string>& loss_outputs,
                                   Built* bp) {
  Built& b = *bp;
  Block& block = b.prog.global_block();
  LossAndGrads r;
  std::vector<std::string> terms;
  uint64_t seed = 7;
  for (auto& [slot, names] : b.out_names) {
    if (!loss_outputs.empty() &&
        std::find(loss_outputs.begin(), loss_outputs.end(), slot) == loss_outputs.end())
      continue;
    for (auto& n : names) {
      VarDesc* out = block.FindVar(n);
      if (!IsFloat(out->dtype())) continue;
      std::string w = n + "_w", prod = n + "_prod", s = n + "_sum";
      KEEL_ENFORCE(out->dims().known(), "output ", n, " has unknown shape ", out->dims().str());
      b.feed[w] = RandomTensor(out->dims(), out->dtype(), 0.5, 1.5, seed++);
      VarDesc* wv = block.Var(w);
      wv->set_dtype(out->dtype());
      wv->set_shape(out->shape());
      wv->set_is_data(true);
      wv->set_stop_gradient(true);
      AppendOp(block, "elementwise_mul", {{"X", {n}}, {"Y", {w}}}, {{"Out", {prod}}});
      AppendOp(block, "reduce_sum", {{"X", {prod}}}, {{"Out", {s}}}, {{"reduce_all", true}});
      terms.push_back(s);
    }
  }
  if (terms.empty()) return r;
  r.has_loss = true;
  AppendOp(block, "sum", {{"X", terms}}, {{"Out", {"loss"}}});
  append_backward(b.prog, "loss");
  for (auto& [slot, names] : b.in_names) {
    if (std::find(c.no_grad_inputs.begin(), c.no_grad_inputs.end(), slot) != c.no_grad_inputs.end())
      continue;
    for (auto& n : names) {
      if (!IsFloat(block.FindVar(n)->dtype())) continue;
      std::string g = GradVarName(n);
      if (block.FindVar(g) != nullptr)
        r.checked.emplace_back(n, g);
      else
        r.missing.push_back(slot);
    }
  }
  return r;
}
}  // namespace

std::map<std::string, Tensor> RunGrads(const OpCase& c, const Place& place) {
  Built b;
  Build(c, &b);
  const auto checked = AppendLossAndBackward(c, {}, &b).checked;
  std::vector<std::string> fetch;
  for (auto& kv : checked) fetch.push_back(kv.second);
  std::map<std::string, Tensor> r;
  if (fetch.empty()) return r;
  Executor exe(place);
  auto grads = exe.Run(b.prog, b.feed, fetch);
  for (size_t k = 0; k < checked.size(); ++k) r[checked[k].first] = grads[k];
  return r;
}

void CheckGrad(const OpCase& c, double eps, double rtol, double atol,
               std::vector<std::string> loss_outputs) {
  SCOPED_TRACE(Describe(c));
  Built b;
  Build(c, &b);
  const LossAndGrads lg = AppendLossAndBackward(c, loss_outputs, &b);
  ASSERT_TRUE(lg.has_loss) << "no float output to build a loss from";
  ASSERT_TRUE(lg.missing.empty()) << "no gradient was produced for input " << lg.missing[0];
  const std::string loss = "loss";
  const auto& checked = lg.checked;

  // Analytic gradients.
  std::vector<std::string> grad_fetch;
  for (const auto& kv : checked) grad_fetch.push_back(kv.second);
  ASSERT_FALSE(checked.empty()) << "no input to check";
  Executor exe;
  auto grads = exe.Run(b.prog, b.feed, grad_fetch);

  // Numeric gradients by central differences on the same program.
  for (size_t k = 0; k < checked.size(); ++k) {
    const std::string& in = checked[k].first;
    Tensor x = b.feed[in].Clone();
    FeedMap feed = b.feed;
    ASSERT_EQ(grads[k].numel(), x.numel()) << "gradient of " << in << " has shape "
                                           << grads[k].dims().str() << ", input " << x.dims().str();
    for (int64_t i = 0; i < x.numel(); ++i) {
      double orig = GetAsDouble(x, i);
      SetFromDouble(&x, i, orig + eps);
      feed[in] = x.Clone();
      double lp = exe.Run(b.prog, feed, {loss})[0].item<double>();
      SetFromDouble(&x, i, orig - eps);
      feed[in] = x.Clone();
      double lm = exe.Run(b.prog, feed, {loss})[0].item<double>();
      SetFromDouble(&x, i, orig);
      double numeric = (lp - lm) / (2 * eps);
      double analytic = GetAsDouble(grads[k], i);
      ASSERT_NEAR(analytic, numeric, atol + rtol * std::abs(numeric))
          << "d loss / d " << in << "[" << i << "]: analytic " << analytic << ", numeric "
          << numeric;
    }
  }
}

}  // namespace keel::testing
