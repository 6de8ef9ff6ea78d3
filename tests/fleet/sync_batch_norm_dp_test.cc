// Synchronized batch norm with real processes under keel launch (tests/workers/sync_bn_worker.cc):
// 2 ranks with batches of 3 and 5 rows equal one process with 8 (Y, dX, the summed dScale and
// dBias, the moving mean and variance), where Paddle's averaging of the per-rank means would be
// far off; 2 ranks with equal batches trained through DistributedStrategy::sync_batch_norm or the
// DSL's flag equal one process at the global batch, and without it they do not; keel train and
// keel inspect --strategy take --sync_batch_norm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

std::map<std::string, std::vector<double>> Load(const std::string& path) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : LoadSafetensors(path)) {
    std::vector<double>& v = out[name];
    for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.data<float>()[i]);
  }
  return out;
}

std::vector<double> Concat(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> c = a;
  c.insert(c.end(), b.begin(), b.end());
  return c;
}

std::vector<double> Sum(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> c = a;
  for (size_t i = 0; i < c.size(); ++i) c[i] += b[i];
  return c;
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

std::string Launch(int n, const std::string& dir, const std::string& cmd) {
  return "FLAGS_cpu_math_threads=1 " + Keel() + " launch --nproc_per_node=" + std::to_string(n) +
         " --log_dir=" + dir + "/log " + cmd + "; rc=$?; cat " + dir + "/log/workerlog.*; exit $rc";
}

constexpr int64_t kC = 3, kPerRow = 3 * 2 * 2;  // the worker's X: [rows, 3, 2, 2]

// Per channel, the mean of rows [r0, r1) of x.
std::vector<double> ChannelMeans(const std::vector<double>& x, int64_t r0, int64_t r1) {
  std::vector<double> m(kC, 0.0);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t i = 0; i < kPerRow; ++i) m[i / 4] += x[r * kPerRow + i];
  for (double& v : m) v /= static_cast<double>((r1 - r0) * 4);
  return m;
}

TEST(SyncBatchNormDataParallel, UnequalBatchesOfThreeAndFiveEqualOneProcessOnEight) {
  const std::string dir = MakeTempDir();
  const std::string worker = BinPath("sync_bn_worker") + " --mode=op";
  auto ref =
      RunCommand("mkdir -p " + dir + "/ref && " + worker + " --batches=8 --out=" + dir + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  auto two = RunCommand("mkdir -p " + dir + "/two && " +
                        Launch(2, dir, worker + " --batches=3,5 --out=" + dir + "/two"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  auto r = Load(dir + "/ref/rank0.safetensors");
  auto a = Load(dir + "/two/rank0.safetensors"), b = Load(dir + "/two/rank1.safetensors");
  ASSERT_EQ(a.at("x").size(), 3u * kPerRow);
  ASSERT_EQ(b.at("x").size(), 5u * kPerRow);
  EXPECT_EQ(Concat(a.at("x"), b.at("x")), r.at("x")) << "the ranks split one batch";

  struct Row {
    const char* what;
    std::vector<double> got;
    const std::vector<double>& want;
  };
  const std::vector<Row> rows = {
      {"Y (rows of both ranks)", Concat(a.at("y"), b.at("y")), r.at("y")},
      {"dX (rows of both ranks)", Concat(a.at("dx"), b.at("dx")), r.at("dx")},
      {"dScale (summed over ranks)", Sum(a.at("dscale"), b.at("dscale")), r.at("dscale")},
      {"dBias (summed over ranks)", Sum(a.at("dbias"), b.at("dbias")), r.at("dbias")},
      {"moving mean, rank 0", a.at("mean"), r.at("mean")},
      {"moving mean, rank 1", b.at("mean"), r.at("mean")},
      {"moving variance, rank 0", a.at("var"), r.at("var")},
      {"moving variance, rank 1", b.at("var"), r.at("var")},
  };
  for (const Row& row : rows) {
    const double d = MaxAbsDiff(row.got, row.want);
    std::printf("sync_batch_norm, 2 ranks of 3 + 5 rows vs 1 process of 8: %s max abs diff %.3g\n",
                row.what, d);
    EXPECT_LT(d, 2e-5) << row.what;  // float rounding: the sums add up in another order
  }

  // Paddle's kernel averages the per-rank means: (mean of rank 0's 3 rows + mean of rank 1's 5) / 2
  // instead of the mean of all 8. Y would move by its slope per channel times the difference.
  const std::vector<double> global = ChannelMeans(r.at("x"), 0, 8);
  const std::vector<double> m0 = ChannelMeans(r.at("x"), 0, 3), m1 = ChannelMeans(r.at("x"), 3, 8);
  double worst_mean = 0, worst_y = 0;
  for (int64_t c = 0; c < kC; ++c) {
    const double averaged = (m0[c] + m1[c]) / 2, off = std::abs(averaged - global[c]);
    // dY/dX in channel c: (y1 - y0) / (x1 - x0) over two of its values (rows 0 and 7).
    const size_t i0 = c * 4, i1 = 7 * kPerRow + c * 4;
    const double slope = (r.at("y")[i1] - r.at("y")[i0]) / (r.at("x")[i1] - r.at("x")[i0]);
    worst_mean = std::max(worst_mean, off);
    worst_y = std::max(worst_y, std::abs(slope) * off);
  }
  std::printf(
      "averaging the per-rank means (Paddle) would be off by up to %.3g in the mean and %.3g in "
      "Y\n",
      worst_mean, worst_y);
  EXPECT_GT(worst_mean, 0.1);
  EXPECT_GT(worst_y, 1e-2) << "the comparison above (2e-5) tells the two apart";

  // Several ranks but no ring ring_id: refused naming the op and the ring, not normalized alone.
  auto no_ring = RunCommand(
      "mkdir -p " + dir + "/none && " +
      Launch(2, dir + "/none", worker + " --no_ring --batches=3,5 --out=" + dir + "/none"));
  EXPECT_NE(no_ring.exit_code, 0);
  EXPECT_NE(no_ring.output.find("sync_batch_norm: ring_id 0 has no ring in this job of 2 ranks"),
            std::string::npos)
      << no_ring.output;
  RunCommand("rm -rf " + dir);
}

// The largest |a - b| / max(|a|, |b|, 1e-3) over the float tensors of `ref` whose names pass
// `keep`, found by name in `got`.
double MaxRelDiff(const NamedTensors& got, const NamedTensors& ref,
                  const std::function<bool(const std::string&)>& keep) {
  double worst = 0;
  int compared = 0;
  for (const auto& [name, t] : ref) {
    if (t.dtype() != DType::kFloat32 || !keep(name)) continue;
    const Tensor* g = nullptr;
    for (const auto& kv : got)
      if (kv.first == name) g = &kv.second;
    EXPECT_NE(g, nullptr) << name;
    if (g == nullptr) continue;
    EXPECT_EQ(g->dims(), t.dims()) << name;
    ++compared;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = t.data<float>()[i], y = g->data<float>()[i];
      worst = std::max(worst, std::abs(x - y) / std::max({std::abs(x), std::abs(y), 1e-3}));
    }
  }
  EXPECT_GT(compared, 0);
  return worst;
}

TEST(SyncBatchNormDataParallel, StrategySwitchTrainsTwoRanksAsOneProcess) {
  const std::string dir = MakeTempDir();
  const std::string worker = BinPath("sync_bn_worker") + " --mode=model --rows=8 --steps=4";
  auto train = [&](int n, const std::string& name, const std::string& flags) {
    const std::string cmd = worker + flags + " --out=" + dir + "/" + name;
    auto r = RunCommand(n == 1 ? cmd : Launch(n, dir + "/" + name + "_log", cmd));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    NamedTensors saved;
    if (r.exit_code == 0) saved = LoadSafetensors(dir + "/" + name + "/" + kPersistablesFile);
    return std::make_pair(saved, r.output);
  };
  auto all = [](const std::string&) { return true; };
  auto params = [](const std::string& n) {
    return n.find(".b_0") != n.npos || n.find(".w_0") != n.npos;
  };
  const auto ref = train(1, "ref", " --strategy_sync");
  ASSERT_FALSE(ref.first.empty());
  EXPECT_NE(ref.second.find("rank 0 sync_batch_norm ops 1"), std::string::npos) << ref.second;
  // The DSL's flag alone (no ring): the same program, the same training.
  const auto ref_dsl = train(1, "ref_dsl", " --dsl_sync");
  ASSERT_FALSE(ref_dsl.first.empty());
  EXPECT_EQ(MaxRelDiff(ref_dsl.first, ref.first, all), 0.0);
  for (const char* flags : {" --strategy_sync", " --dsl_sync"}) {
    SCOPED_TRACE(flags);
    const auto two = train(2, std::string("two") + (flags + 2), flags);
    ASSERT_FALSE(two.first.empty());
    EXPECT_NE(two.second.find("rank 1 sync_batch_norm ops 1"), std::string::npos) << two.second;
    const double rel = MaxRelDiff(two.first, ref.first, all);
    std::printf(
        "2 ranks x 4 rows with%s vs 1 process x 8 rows, 4 SGD steps: parameters and moving stats "
        "max relative difference %.3g\n",
        flags, rel);
    EXPECT_LT(rel, 1e-4);
  }
  // Without it each rank normalizes with its own 4 rows' statistics: the parameters move apart.
  const auto plain = train(2, "plain", "");
  ASSERT_FALSE(plain.first.empty());
  const double rel = MaxRelDiff(plain.first, ref.first, params);
  std::printf(
      "2 ranks x 4 rows with per-rank batch norm: parameters max relative difference %.3g\n", rel);
  EXPECT_GT(rel, 1e-3);
  RunCommand("rm -rf " + dir);
}

TEST(SyncBatchNormDataParallel, KeelTrainFlagRewritesResnetsBatchNorms) {
  auto inspect =
      RunCommand(Keel() + " inspect --strategy --model=resnet --nranks=2 --sync_batch_norm");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("sync_batch_norm("), std::string::npos);
  EXPECT_NE(inspect.output.find("sync_batch_norm_grad("), std::string::npos);
  EXPECT_EQ(inspect.output.find("\n  batch_norm("), std::string::npos) << "all rewritten";
  auto plain = RunCommand(Keel() + " inspect --strategy --model=resnet --nranks=2");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("sync_batch_norm=false"), std::string::npos);
  EXPECT_EQ(plain.output.find("sync_batch_norm("), std::string::npos);
  EXPECT_NE(plain.output.find("\n  batch_norm("), std::string::npos);

  const std::string dir = MakeTempDir();
  const std::string train =
      Keel() + " train --model=resnet --batch_size=4 --steps=2 --seed=1 --sync_batch_norm";
  auto two = RunCommand(Launch(2, dir, train));
  EXPECT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("sync_batch_norm=true"), std::string::npos) << two.output;
  auto one = RunCommand(train);  // alone: batch_norm's result, no ring
  EXPECT_EQ(one.exit_code, 0) << one.output;
  auto local = RunCommand(Launch(2, dir, train + " --local_sgd_steps=2"));
  EXPECT_NE(local.exit_code, 0);
  EXPECT_NE(local.output.find("sync_batch_norm=true does not combine with"), std::string::npos)
      << local.output;
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
