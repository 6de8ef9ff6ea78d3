// Tensor parallelism with real processes on loopback (tests/workers/tp_worker.cc): TP=2 trains to
// the parameters and losses of one process (TP=1), on a model using every tensor-parallel op, on
// the built-in transformer and on a ResNet; TP=2 x DP=2 (4 processes) equals one process at the
// same global batch; replicated parameters stay bit-identical across a tensor-parallel group;
// forgetting the backward all-reduce of c_identity breaks the equality. The largest differences are
// printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "tests/util/model_train.h"
#include "tests/util/named_tensors.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

struct TpRun {
  std::string output;                // every worker's stdout
  std::vector<NamedTensors> params;  // per rank
};

TpRun Train(int nproc, int tp, const std::string& args, const std::string& dir) {
  RunCommand("mkdir -p " + dir);
  const std::string worker =
      BinPath("tp_worker") + " --tp=" + std::to_string(tp) + " --out=" + dir + " " + args;
  const std::string cmd = nproc == 1 ? worker
                                     : "FLAGS_cpu_math_threads=1 " + BinPath("keel") +
                                           " launch --nproc_per_node=" + std::to_string(nproc) +
                                           " --log_dir=" + dir + "/log " + worker + " > " + dir +
                                           "/launch.out 2>&1; rc=$?; cat " + dir + "/launch.out " +
                                           dir + "/log/workerlog.*; exit $rc";
  auto r = RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  TpRun run;
  run.output = r.output;
  for (int k = 0; k < nproc; ++k)
    run.params.push_back(LoadSafetensors(dir + "/rank" + std::to_string(k) + ".safetensors"));
  return run;
}

// The value after " KEY " on each of rank R's "rank R step S ..." lines (loss, accuracy).
std::vector<double> Values(const std::string& output, int rank, const std::string& key) {
  std::vector<double> values;
  std::istringstream in(output);
  std::string line;
  const std::string prefix = "rank " + std::to_string(rank) + " step ";
  const std::string tag = " " + key + " ";
  while (std::getline(in, line)) {
    // rank 0's lines also reach keel launch's console: count each step once.
    if (line.rfind(prefix, 0) != 0 || line.find(tag) == std::string::npos) continue;
    if (static_cast<int>(values.size()) != std::stoi(line.substr(prefix.size()))) continue;
    values.push_back(std::stod(line.substr(line.find(tag) + tag.size())));
  }
  return values;
}

std::vector<double> Losses(const std::string& output, int rank) {
  return Values(output, rank, "loss");
}

// The full parameter `name` from the ranks of one tensor-parallel group (ranks first..first+tp-1):
// a replicated one must be the same bits on every rank of the group (with check_replicas: the
// Megatron pattern makes every replicated parameter's inputs and output gradients identical on the
// group's ranks, the all-reduces giving every rank the same sums); a sharded one is the ranks'
// parts joined along the dim where they are narrower than `full`.
Tensor Assemble(const TpRun& run, int first, int tp, const std::string& name, const DDim& full,
                bool check_replicas) {
  std::vector<const Tensor*> parts;
  for (int k = 0; k < tp; ++k) {
    const Tensor* t = FindTensor(run.params[first + k], name);
    EXPECT_NE(t, nullptr) << name << " missing on rank " << first + k;
    if (t == nullptr) return Tensor();
    parts.push_back(t);
  }
  const DDim d = parts[0]->dims();
  if (d == full) {
    for (int k = 1; check_replicas && k < tp; ++k)
      EXPECT_EQ(std::memcmp(parts[k]->raw_data(), parts[0]->raw_data(), parts[0]->nbytes()), 0)
          << "replicated parameter " << name << " differs between tensor-parallel ranks " << first
          << " and " << first + k;
    return *parts[0];
  }
  int axis = -1;
  for (int i = 0; i < d.size(); ++i)
    if (d[i] * tp == full[i]) axis = i;
  EXPECT_GE(axis, 0) << name << ": shard " << d.str() << " of " << full.str();
  if (axis < 0) return Tensor();
  Tensor out(DType::kFloat32, full);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= d[i];
  for (int i = axis; i < d.size(); ++i) inner *= d[i];  // one part's row
  float* o = out.data<float>();
  for (int64_t r = 0; r < outer; ++r)
    for (int k = 0; k < tp; ++k)
      std::memcpy(o + (r * tp + k) * inner, parts[k]->data<float>() + r * inner,
                  sizeof(float) * static_cast<size_t>(inner));
  return out;
}

// Largest |a - b| over the reference's parameters, with `got` assembled from each group.
double MaxParamDiff(const NamedTensors& ref, const TpRun& run, int first, int tp,
                    bool check_replicas = true) {
  double worst = 0;
  for (const auto& kv : ref) {
    const Tensor t = Assemble(run, first, tp, kv.first, kv.second.dims(), check_replicas);
    if (!t.initialized()) return 1e30;
    EXPECT_EQ(t.dims(), kv.second.dims()) << kv.first;
    double here = 0;
    for (int64_t i = 0; i < t.numel(); ++i)
      here = std::max(
          here, static_cast<double>(std::abs(t.data<float>()[i] - kv.second.data<float>()[i])));
    if (here > 1e-5) std::printf("  %s: max |diff| %.3g\n", kv.first.c_str(), here);
    worst = std::max(worst, here);
  }
  return worst;
}

double MaxDiff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = a.size() == b.size() && !a.empty() ? 0 : 1e30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// with_accuracy: the workers print an accuracy (the transformer's vocabulary-parallel top-1),
// which must be the same number on both ranks and as TP=1's.
void ExpectTp2EqualsTp1(const std::string& args, const std::string& what,
                        bool with_accuracy = false) {
  const std::string dir = MakeTempDir();
  const TpRun one = Train(1, 1, args, dir + "/tp1");
  const TpRun two = Train(2, 2, args, dir + "/tp2");
  ASSERT_EQ(Losses(one.output, 0).size(), 6u) << one.output;
  const double loss_diff = MaxDiff(Losses(two.output, 0), Losses(one.output, 0));
  EXPECT_EQ(Losses(two.output, 0), Losses(two.output, 1)) << "the ranks' losses differ";
  if (with_accuracy) {
    const std::vector<double> acc = Values(one.output, 0, "accuracy");
    ASSERT_EQ(acc.size(), 6u) << one.output;
    EXPECT_EQ(Values(two.output, 0, "accuracy"), acc) << two.output;
    EXPECT_EQ(Values(two.output, 1, "accuracy"), acc) << two.output;
    std::printf("%s: accuracy of each step (TP=1 and TP=2 alike):", what.c_str());
    for (double a : acc) std::printf(" %.4g", a);
    std::printf("\n");
  }
  const double param_diff = MaxParamDiff(one.params[0], two, 0, 2);
  std::printf("%s: TP=2 vs TP=1 after 6 steps: max |loss diff| %.3g, max |param diff| %.3g\n",
              what.c_str(), loss_diff, param_diff);
  EXPECT_LT(loss_diff, 1e-5);
  EXPECT_LT(param_diff, 1e-5);
  RunCommand("rm -rf " + dir);
}

TEST(TensorParallel, Tp2EqualsTp1OnAModelUsingEveryTensorParallelOp) {
  ExpectTp2EqualsTp1("--model=mlp --opt=sgd", "mlp, SGD");
}

TEST(TensorParallel, Tp2EqualsTp1OnAModelUsingEveryTensorParallelOpWithAdam) {
  ExpectTp2EqualsTp1("--model=mlp --opt=adam", "mlp, Adam");
}

// SGD: the attention's key biases have an exactly-zero gradient (softmax ignores a shift common to
// a row of scores), so Adam would turn either run's rounding noise there into steps of +-lr, and
// the runs would differ by lr-sized amounts in those biases alone, for a reason that is not tensor
// parallelism (seen: 4e-3 in fc_7.b_0, every other parameter within 1e-5).
TEST(TensorParallel, Tp2EqualsTp1OnTheTransformer) {
  ExpectTp2EqualsTp1("--model=transformer --opt=sgd", "transformer, SGD", true);
}

// ResNet (depth 8): each block's first convolution splits its output channels, with its batch
// norm's scale, bias and moving statistics, the second its input channels; the batch norms'
// statistics end where TP=1's end too (compared with the parameters).
TEST(TensorParallel, Tp2EqualsTp1OnResnet) {
  ExpectTp2EqualsTp1("--model=resnet --opt=sgd", "resnet, SGD", true);
}

// A TP=2 x DP=2 run's global loss per step: the mean of the two replicas' (equal shares of the
// batch), printed by ranks 0 and 2.
std::vector<double> GlobalLosses(const TpRun& run) {
  const std::vector<double> a = Losses(run.output, 0), b = Losses(run.output, 2);
  EXPECT_EQ(a.size(), b.size());
  std::vector<double> global;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) global.push_back((a[i] + b[i]) / 2);
  return global;
}

// Mixed precision under tensor parallelism: the AMP rewrite runs on each rank's sharded program;
// the tensor-parallel collectives are gray (they carry what their producer makes: a row-parallel
// product is summed in 16 bits). Column-parallel products are the one process's products, but a
// row-parallel sum rounds each rank's partial product to 16 bits before adding them, so TP=2
// equals TP=1 within bfloat16's rounding, not to the bit: the losses and parameters are compared
// to a bound of a few bfloat16 ulps of their size, and the ranks' losses and replicated
// parameters must still be identical.
TEST(TensorParallel, Tp2InBfloat16MatchesTp1WithinItsRounding) {
  const std::string dir = MakeTempDir();
  for (const std::string model : {"mlp", "transformer"}) {
    const std::string args = "--model=" + model + " --opt=sgd --amp=bf16";
    const TpRun one = Train(1, 1, args, dir + "/one_" + model);
    const TpRun two = Train(2, 2, args, dir + "/two_" + model);
    ASSERT_EQ(Losses(one.output, 0).size(), 6u) << one.output;
    EXPECT_EQ(Losses(two.output, 0), Losses(two.output, 1)) << "the ranks' losses differ";
    const double loss_diff = MaxDiff(Losses(two.output, 0), Losses(one.output, 0));
    const double param_diff = MaxParamDiff(one.params[0], two, 0, 2);
    std::printf(
        "%s in bfloat16: TP=2 vs TP=1 after 6 steps: max |loss diff| %.3g, max |param "
        "diff| %.3g\n",
        model.c_str(), loss_diff, param_diff);
    EXPECT_LT(loss_diff, 5e-3) << model;
    EXPECT_LT(param_diff, 5e-3) << model;
  }
  // O2: 16-bit parameters with float32 masters; each rank's sharded masters are its own (a
  // broadcast from rank 0 would give rank 1 rank 0's shards and change step 0's loss).
  const std::string o2 = "--model=transformer --opt=sgd --amp=bf16 --amp_level=O2";
  const TpRun one = Train(1, 1, o2, dir + "/one_o2");
  const TpRun two = Train(2, 2, o2, dir + "/two_o2");
  ASSERT_EQ(Losses(one.output, 0).size(), 6u) << one.output;
  EXPECT_EQ(Losses(two.output, 0), Losses(two.output, 1)) << "the ranks' losses differ";
  const double o2_diff = MaxDiff(Losses(two.output, 0), Losses(one.output, 0));
  std::printf("transformer in bfloat16 O2: TP=2 vs TP=1 over 6 steps: max |loss diff| %.3g\n",
              o2_diff);
  EXPECT_LT(o2_diff, 5e-3);
  RunCommand("rm -rf " + dir);
}

// Float16 loss scaling under tensor parallelism: the ranks of a group check different shards of
// the sharded parameters' gradients, so the overflow flag is all-reduced (max) over the group. On
// the transformer from a scale of 2e5, step 0 overflows in rank 1's shards only: with the flag's
// all-reduce every rank skips it and halves its scale, as one process (TP=1) does, and the
// parameters follow TP=1's within float16's rounding; with the all-reduce removed
// (--local_overflow_flag) rank 0 steps on with twice rank 1's scale, so this test fails without
// the reduction.
TEST(TensorParallel, Float16LossScalingSkipsTheSameStepsOnEveryRankOfTheGroup) {
  const std::string dir = MakeTempDir();
  const std::string args = "--model=transformer --opt=sgd --amp=fp16 --loss_scale=2e5";
  const TpRun one = Train(1, 1, args, dir + "/one");
  const TpRun two = Train(2, 2, args, dir + "/two");
  const std::vector<double> scale = Values(one.output, 0, "loss_scale");
  ASSERT_EQ(scale.size(), 6u) << one.output;
  EXPECT_EQ(scale[0], 1e5) << "step 0 overflows in one process";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(Values(two.output, r, "loss_scale"), scale) << "rank " << r;
    EXPECT_EQ(Values(two.output, r, "skipped"), Values(one.output, 0, "skipped")) << "rank " << r;
  }
  const double param_diff = MaxParamDiff(one.params[0], two, 0, 2);
  const double loss_diff = MaxDiff(Losses(two.output, 0), Losses(one.output, 0));
  std::printf(
      "transformer in float16 from scale 2e5: TP=2 vs TP=1 after 6 steps: max |loss diff| "
      "%.3g, max |param diff| %.3g\n",
      loss_diff, param_diff);
  EXPECT_LT(loss_diff, 1e-3);
  EXPECT_LT(param_diff, 1e-3);
  const TpRun local = Train(2, 2, args + " --local_overflow_flag", dir + "/local");
  EXPECT_NE(Values(local.output, 0, "loss_scale"), Values(local.output, 1, "loss_scale"))
      << local.output;
  RunCommand("rm -rf " + dir);
}

// 4 processes: tensor-parallel groups {0,1} and {2,3}, data-parallel groups {0,2} and {1,3}, each
// replica on half the global batch, against one process on all of it.
TEST(TensorParallel, Tp2TimesDp2EqualsOneProcessAtTheSameGlobalBatch) {
  const std::string dir = MakeTempDir();
  const std::string args = "--model=transformer --opt=sgd --global_batch=8";
  const TpRun one = Train(1, 1, args, dir + "/one");
  const TpRun four = Train(4, 2, args, dir + "/four");
  const double loss_diff = MaxDiff(GlobalLosses(four), Losses(one.output, 0));
  const double p0 = MaxParamDiff(one.params[0], four, 0, 2);
  const double p1 = MaxParamDiff(one.params[0], four, 2, 2);
  std::printf(
      "transformer, SGD: TP=2 x DP=2 vs one process: max |loss diff| %.3g, max |param "
      "diff| %.3g (group 0), %.3g (group 1)\n",
      loss_diff, p0, p1);
  EXPECT_LT(loss_diff, 1e-5);
  EXPECT_LT(p0, 1e-5);
  EXPECT_LT(p1, 1e-5);
  // The two data-parallel replicas of each shard hold the same bits.
  for (int r : {0, 1})
    for (const auto& kv : four.params[r]) {
      const Tensor* other = FindTensor(four.params[r + 2], kv.first);
      ASSERT_NE(other, nullptr) << kv.first;
      EXPECT_EQ(std::memcmp(other->raw_data(), kv.second.raw_data(), kv.second.nbytes()), 0)
          << kv.first << " differs between data-parallel ranks " << r << " and " << r + 2;
    }
  RunCommand("rm -rf " + dir);
}

// ResNet with sync batch norm on TP=2 x DP=2 (4 processes): each batch norm, its channels sharded
// with its convolution's, takes its statistics over both replicas' halves of the batch through the
// data-parallel ring of its tensor-parallel coordinate, so the job equals one process normalizing
// the whole batch: parameters and moving statistics to float rounding. Without the sync each
// replica normalizes its own half, which the test checks differs, so it cannot pass vacuously.
TEST(TensorParallel, Tp2TimesDp2WithSyncBatchNormEqualsOneProcessOnResnet) {
  const std::string dir = MakeTempDir();
  const std::string args = "--model=resnet --opt=sgd --global_batch=8 --steps=4";
  // One process's sync batch norm: the same unbiased running variance (plain batch norm keeps
  // Paddle's biased one).
  const TpRun one = Train(1, 1, args + " --sync_bn", dir + "/one");
  const TpRun synced = Train(4, 2, args + " --sync_bn", dir + "/synced");
  const TpRun unsynced = Train(4, 2, args, dir + "/unsynced");
  const double loss_diff = MaxDiff(GlobalLosses(synced), Losses(one.output, 0));
  const double p0 = MaxParamDiff(one.params[0], synced, 0, 2);
  const double p1 = MaxParamDiff(one.params[0], synced, 2, 2);
  const double apart = MaxParamDiff(one.params[0], unsynced, 0, 2);
  std::printf(
      "resnet, SGD, sync batch norm: TP=2 x DP=2 vs one process: max |loss diff| %.3g, max "
      "|param or statistic diff| %.3g (replica 0), %.3g (replica 1); without the sync %.3g\n",
      loss_diff, p0, p1, apart);
  EXPECT_LT(loss_diff, 1e-5);
  EXPECT_LT(p0, 1e-5);
  EXPECT_LT(p1, 1e-5);
  EXPECT_GT(apart, 1e-3);
  RunCommand("rm -rf " + dir);
}

// "rank R step S loss L" of one step (a resumed run starts past step 0); NaN when absent.
double LossAt(const std::string& output, int rank, int step) {
  std::istringstream in(output);
  const std::string prefix =
      "rank " + std::to_string(rank) + " step " + std::to_string(step) + " loss ";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(prefix.size()));
  return std::nan("");
}

// ZeRO-1 beside tensor parallelism (TP=2 x DP=2, Adam, the transformer): the optimizer state of
// each tensor-parallel coordinate's shards is sharded over its two data-parallel replicas, on
// their own ring. Bit for bit the plain TP x DP job's parameters; each coordinate's state bytes
// split between its replicas; a checkpoint is complete (each owner broadcasts its state to the
// group's first replica, which the tensor-parallel gather reads), equal bit for bit to the plain
// job's, and resuming from it under sharding continues exactly.
TEST(TensorParallel, ZeroOneShardingBesideTp2EqualsPlainDataParallelAndCheckpointsCompletely) {
  const std::string dir = MakeTempDir();
  const std::string args = " --model=transformer --opt=adam --global_batch=8";
  const TpRun plain = Train(4, 2, "--steps=4" + args, dir + "/plain");
  const TpRun zero = Train(4, 2, "--steps=4 --sharding" + args, dir + "/zero");
  auto same = [](const TpRun& a, const TpRun& b, const char* what) {
    for (int r = 0; r < 4; ++r)
      for (const auto& [name, want] : a.params[r]) {
        const Tensor* got = FindTensor(b.params[r], name);
        ASSERT_NE(got, nullptr) << name;
        EXPECT_EQ(0, std::memcmp(got->raw_data(), want.raw_data(), want.nbytes()))
            << name << " on rank " << r << " (" << what << ")";
      }
  };
  same(plain, zero, "sharded");
  auto bytes = [](const TpRun& run, int rank) {
    const std::string key = "rank " + std::to_string(rank) + " state_bytes ";
    const size_t at = run.output.find(key);
    EXPECT_NE(at, std::string::npos) << key;
    return at == std::string::npos ? 0.0 : std::stod(run.output.substr(at + key.size()));
  };
  for (int t = 0; t < 2; ++t) {
    std::printf("tensor-parallel rank %d: optimizer state bytes %.0f + %.0f sharded, %.0f plain\n",
                t, bytes(zero, t), bytes(zero, 2 + t), bytes(plain, t));
    EXPECT_EQ(bytes(zero, t) + bytes(zero, 2 + t), bytes(plain, t));
    EXPECT_LE(bytes(zero, t), bytes(plain, t) * 0.55);
    EXPECT_LE(bytes(zero, 2 + t), bytes(plain, t) * 0.55);
  }
  Train(4, 2, "--steps=2 --sharding --save_dir=" + dir + "/ck_zero" + args, dir + "/half_zero");
  Train(4, 2, "--steps=2 --save_dir=" + dir + "/ck_plain" + args, dir + "/half_plain");
  const NamedTensors a = LoadSafetensors(dir + "/ck_zero/" + kPersistablesFile),
                     b = LoadSafetensors(dir + "/ck_plain/" + kPersistablesFile);
  ASSERT_EQ(a.size(), b.size());
  ExpectHoldsBitForBit(a, b, "the sharded job's checkpoint");
  same(zero,
       Train(4, 2, "--steps=4 --first_step=2 --sharding --load_dir=" + dir + "/ck_zero" + args,
             dir + "/resumed"),
       "resumed");
  RunCommand("rm -rf " + dir);
}

// fleet::save_persistables of a tensor-parallel program (every rank calls it) joins the shards
// (parameters and Adam's moments) along their split axes into one checkpoint of whole tensors;
// each rank loads its part back. 2k steps equal k, save, resume, k more, bit for bit, on TP=2
// and TP=2 x DP=2. One process (TP=1) loads the checkpoint: it holds the joined shards exactly,
// gives the job's loss, and trains on to the job's parameters; and the job loads one process's
// checkpoint, each rank keeping exactly its shards.
TEST(TensorParallel, ACheckpointJoinsTheShardsAndResumesExactly) {
  const std::string dir = MakeTempDir();
  for (const int nproc : {2, 4}) {
    const std::string d = dir + "/n" + std::to_string(nproc);
    const std::string args = " --model=mlp --opt=adam";
    const TpRun full = Train(nproc, 2, "--steps=4" + args, d + "/full");
    const TpRun half = Train(nproc, 2, "--steps=2 --save_dir=" + d + "/ckpt" + args, d + "/half");
    const TpRun resumed = Train(
        nproc, 2, "--steps=4 --first_step=2 --load_dir=" + d + "/ckpt" + args, d + "/resumed");
    size_t compared = 0;
    for (int k = 0; k < nproc; ++k)
      for (const auto& kv : full.params[k]) {
        const Tensor* got = FindTensor(resumed.params[k], kv.first);
        ASSERT_NE(got, nullptr) << kv.first;
        ASSERT_EQ(got->dims(), kv.second.dims()) << kv.first;
        EXPECT_EQ(std::memcmp(got->raw_data(), kv.second.raw_data(), kv.second.nbytes()), 0)
            << kv.first << " on rank " << k << " differs after the resume (" << nproc << " ranks)";
        ++compared;
      }
    EXPECT_GT(compared, 0u);
    for (int step : {2, 3}) {
      EXPECT_EQ(LossAt(full.output, 0, step), LossAt(resumed.output, 0, step)) << step;
      EXPECT_TRUE(std::isnan(LossAt(resumed.output, 0, step - 2))) << resumed.output;
    }
    const TpRun loaded =
        Train(1, 1, "--steps=3 --first_step=2 --load_dir=" + d + "/ckpt" + args, d + "/one_loaded");
    const TpRun on =
        Train(1, 1, "--steps=4 --first_step=2 --load_dir=" + d + "/ckpt" + args, d + "/one_on");
    // `loaded` trained one step past the checkpoint; its loss of step 2 is the loaded model's.
    // The job's loss: the mean of its replicas' (each prints its half of the global batch's).
    const double job_loss = nproc == 2
                                ? LossAt(resumed.output, 0, 2)
                                : (LossAt(resumed.output, 0, 2) + LossAt(resumed.output, 2, 2)) / 2;
    const double loss_diff = std::abs(LossAt(loaded.output, 0, 2) - job_loss);
    const double on_diff = MaxParamDiff(on.params[0], full, 0, 2);
    std::printf(
        "%d ranks (TP=2%s): resumed == uninterrupted bit for bit over %zu tensors; one process "
        "from the checkpoint: |loss - job's| %.3g at step 2, max |param - job's| %.3g after 2 "
        "steps\n",
        nproc, nproc == 4 ? " x DP=2" : "", compared, loss_diff, on_diff);
    EXPECT_LT(loss_diff, 1e-6);
    EXPECT_LT(on_diff, 1e-5);
    // The joined shards are exactly the job's: one process that loads and does not train.
    const TpRun as_saved = Train(1, 1, "--steps=2 --first_step=2 --load_dir=" + d + "/ckpt" + args,
                                 d + "/one_as_saved");
    EXPECT_EQ(MaxParamDiff(as_saved.params[0], half, 0, 2), 0.0);
    // The other way: the job loads one process's checkpoint, each rank cutting its shards.
    const TpRun one_saved =
        Train(1, 1, "--steps=2 --save_dir=" + d + "/one_ckpt" + args, d + "/one_saved");
    const TpRun from_one = Train(
        nproc, 2, "--steps=2 --first_step=2 --load_dir=" + d + "/one_ckpt" + args, d + "/from_one");
    EXPECT_EQ(MaxParamDiff(one_saved.params[0], from_one, 0, 2), 0.0);
    if (nproc == 4) {
      EXPECT_EQ(MaxParamDiff(one_saved.params[0], from_one, 2, 2), 0.0);
    }
  }
  RunCommand("rm -rf " + dir);
}

// Negative: without the all-reduce of c_identity's gradient (the worker rewrites it into a copy),
// each rank's input gradient holds only its own columns' part, and training departs from TP=1.
TEST(TensorParallel, DroppingTheBackwardAllReduceOfCIdentityBreaksTheEquality) {
  const std::string dir = MakeTempDir();
  const std::string args = "--model=mlp --opt=sgd";
  const TpRun one = Train(1, 1, args, dir + "/tp1");
  const TpRun bad = Train(2, 2, args + " --drop_identity_allreduce", dir + "/bad");
  EXPECT_NE(bad.output.find("rank 0 dropped 1 all-reduces"), std::string::npos) << bad.output;
  const double loss_diff = MaxDiff(Losses(bad.output, 0), Losses(one.output, 0));
  const double param_diff = MaxParamDiff(one.params[0], bad, 0, 2, /*check_replicas=*/false);
  std::printf(
      "without c_identity's backward all-reduce: max |loss diff| %.3g, max |param diff| "
      "%.3g\n",
      loss_diff, param_diff);
  EXPECT_GT(loss_diff, 1e-3);
  EXPECT_GT(param_diff, 1e-3);
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
