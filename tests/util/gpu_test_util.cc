#include "tests/util/gpu_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <gflags/gflags.h>

#include "executor/executor.h"
#include "models/model_zoo.h"
#include "tests/util/op_test_util.h"
#include "tests/util/test_data.h"

DECLARE_bool(cudnn_deterministic);

namespace keel::testing {

double MaxRelErr(const Tensor& a, const Tensor& b) {
  std::vector<double> x = ToDouble(a), y = ToDouble(b);
  EXPECT_EQ(x.size(), y.size());
  double err = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (std::isnan(y[i]) && std::isnan(x[i])) continue;
    if (std::isnan(x[i]) || std::isnan(y[i])) return INFINITY;
    err = std::max(err, std::abs(x[i] - y[i]) / std::max(std::abs(y[i]), 1.0));
  }
  return err;
}

Tensor R(const DDim& d, double lo, double hi, uint64_t seed, DType dt) {
  return RandomTensor(d, dt, lo, hi, seed);
}

OpCase Op(std::string name, std::string type,
          std::vector<std::pair<std::string, std::vector<Tensor>>> inputs,
          std::vector<std::pair<std::string, int>> outputs,
          std::map<std::string, Attribute> attrs) {
  OpCase c;
  c.name = std::move(name);
  c.type = std::move(type);
  c.inputs = std::move(inputs);
  c.outputs = std::move(outputs);
  c.attrs = std::move(attrs);
  return c;
}

double NormRelErr(const Tensor& a, const Tensor& b) {
  std::vector<double> x = ToDouble(a), y = ToDouble(b);
  EXPECT_EQ(x.size(), y.size());
  double diff = 0, ref = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (std::isnan(x[i]) != std::isnan(y[i])) return INFINITY;
    if (std::isnan(x[i])) continue;
    diff += (x[i] - y[i]) * (x[i] - y[i]);
    ref += y[i] * y[i];
  }
  return ref == 0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

namespace {

models::TrainableModel BuildForTest(const std::string& model, int64_t batch, float lr) {
  models::ModelConfig cfg;
  cfg.name = model;
  cfg.seed = 5;
  cfg.batch_size = batch;
  cfg.lr = lr;
  if (model == "mlp") cfg.hidden = 256;
  if (model == "lenet") cfg.data = "mnist:" + MnistDir();
  return models::BuildModel(cfg);
}

// One step of m on the CPU and the GPU from the CPU's state: the losses and the state after it.
void ExpectStepsFromTheSameStateAgree(models::TrainableModel& m, int64_t batch, int steps,
                                      double state_tol) {
  Executor cpu(CPUPlace()), gpu(CUDAPlace(0));
  cpu.Run(*m.startup);
  gpu.Run(*m.startup);
  std::vector<std::string> state;
  for (VarDesc* v : m.main->global_block().AllVars())
    if (v->persistable()) state.push_back(v->name());
  ASSERT_FALSE(state.empty());
  double worst = 0;
  std::string worst_var;
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s) + " from the same state");
    for (const std::string& name : state) {
      const Variable* c = cpu.scope().FindVar(name);
      if (c == nullptr || !c->tensor().initialized()) continue;
      Tensor* g = gpu.scope().Var(name)->mutable_tensor();
      if (g->initialized() && g->dims() == c->tensor().dims() && g->dtype() == c->tensor().dtype())
        g->CopyFrom(c->tensor());
      else
        *g = c->tensor().Clone(CUDAPlace(0));
    }
    FeedMap feed;
    m.next_batch(batch, &feed);
    const double lc = cpu.Run(*m.main, feed, {m.loss})[0].item<double>();
    const double lg = gpu.Run(*m.main, feed, {m.loss})[0].item<double>();
    EXPECT_NEAR(lg, lc, 1e-4 * std::max(1.0, std::abs(lc))) << "loss";
    for (const std::string& name : state) {
      const Variable* c = cpu.scope().FindVar(name);
      const Variable* g = gpu.scope().FindVar(name);
      if (c == nullptr || !c->tensor().initialized()) continue;
      ASSERT_TRUE(g != nullptr && g->tensor().initialized()) << name;
      // Whole-tensor error, or element-wise for a tensor of rounding noise (a gradient that is
      // zero in exact arithmetic).
      const Tensor gt = g->tensor().Clone(CPUPlace());
      const double err = std::min(NormRelErr(gt, c->tensor()), MaxRelErr(gt, c->tensor()));
      EXPECT_LE(err, state_tol) << name;
      if (err > worst) worst = err, worst_var = name;
    }
  }
  std::printf("[ INFO     ] largest state error (norm-relative) over %d steps: %.3g (%s)\n", steps,
              worst, worst_var.c_str());
}

}  // namespace

std::vector<double> TrainLosses(const std::string& model, const Place& place, int steps,
                                int64_t batch, float lr) {
  models::TrainableModel m = BuildForTest(model, batch, lr);
  Executor exe(place);
  exe.Run(*m.startup);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    FeedMap feed;
    m.next_batch(batch, &feed);
    losses.push_back(exe.Run(*m.main, feed, {m.loss})[0].item<double>());
  }
  return losses;
}

void ExpectGpuTrainsLikeCpu(const std::string& model, int64_t batch, float lr,
                            double trajectory_tol, double state_tol) {
  SCOPED_TRACE(model);
  gflags::FlagSaver saver;
  FLAGS_cudnn_deterministic = true;
  {
    models::TrainableModel m = BuildForTest(model, batch, 0);
    ExpectStepsFromTheSameStateAgree(m, batch, 30, state_tol);
  }
  const std::vector<double> cpu = TrainLosses(model, CPUPlace(), 30, batch, lr);
  const std::vector<double> gpu = TrainLosses(model, CUDAPlace(0), 30, batch, lr);
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t s = 0; s < cpu.size(); ++s)
    EXPECT_NEAR(gpu[s], cpu[s], (s < 2 ? 1e-4 : trajectory_tol) * std::max(1.0, std::abs(cpu[s])))
        << "free-running step " << s;
}

}  // namespace keel::testing
