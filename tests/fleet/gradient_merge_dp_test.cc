// Gradient merge with data parallelism, in real processes under keel launch: 2 ranks x k runs of b
// rows train as 1 rank on 2kb rows (SGD, Momentum, Adam with clipping and a schedule, float16
// loss scaling, two rings), with the all-reduce count of the profile k times smaller than plain
// data parallelism's; keel train --gradient_merge_k trains, and a checkpoint taken between two
// merge steps is refused on resume under several workers (each rank's buffers are its own).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "tests/util/subprocess.h"
#include "tests/util/worker_run.h"

namespace keel::testing {
namespace {

Trained Train(int nranks, const std::string& dir, const std::string& flags) {
  return TrainWorker("gradient_merge_worker", nranks, dir, flags);
}

// "rank R allreduces A runs N" -> A, for rank 0 (-1 when absent).
int AllReduces(const std::string& output, int rank, int* runs) {
  std::istringstream in(output);
  std::string line;
  const std::string head = "rank " + std::to_string(rank) + " allreduces ";
  while (std::getline(in, line))
    if (line.rfind(head, 0) == 0) {
      int a = -1;
      std::sscanf(line.c_str() + head.size(), "%d runs %d", &a, runs);
      return a;
    }
  return -1;
}

std::set<std::string> ParamLines(const std::string& output) {
  std::set<std::string> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("rank ", 0) == 0 && line.find(" params ") != std::string::npos)
      lines.insert(line.substr(line.find(" params ")));
  return lines;
}

// The largest |a - b| / max(|a|, |b|) (elements above 1e-3) over every tensor of `ref` (the
// parameters and the optimizer's state), found by name in `got`.
double MaxRelDiff(const NamedTensors& got, const NamedTensors& ref) {
  double worst = 0;
  for (const auto& [name, r] : ref) {
    const Tensor* g = nullptr;
    for (const auto& kv : got)
      if (kv.first == name) g = &kv.second;
    EXPECT_NE(g, nullptr) << name;
    if (g == nullptr || r.dtype() != DType::kFloat32) continue;
    EXPECT_EQ(g->dims(), r.dims()) << name;
    for (int64_t i = 0; i < r.numel(); ++i) {
      const double x = r.data<float>()[i], y = g->data<float>()[i];
      const double m = std::max(std::abs(x), std::abs(y));
      if (m > 1e-3) worst = std::max(worst, std::abs(x - y) / m);
    }
  }
  return worst;
}

TEST(GradientMergeDataParallel, TwoRanksTimesKRunsEqualOneRankOnTheWholeBatch) {
  const std::string dir = MakeTempDir();
  constexpr int k = 3, steps = 6, grads = 6;  // 3 fc layers: 6 gradients
  int c = 0;
  for (const char* flags : {" --opt=sgd", " --opt=momentum --rings=2",
                            " --opt=adam --clip_norm=0.05 --lr_decay", " --opt=momentum --amp"}) {
    SCOPED_TRACE(flags);
    const std::string d = dir + "/c" + std::to_string(c++);
    const std::string common = std::string(flags) + " --rows=24 --steps=" + std::to_string(steps);
    Trained ref = Train(1, d + "/ref", common);
    Trained merged = Train(2, d + "/gm", common + " --k=" + std::to_string(k));
    ASSERT_FALSE(ref.saved.empty());
    ASSERT_FALSE(merged.saved.empty());
    const double rel = MaxRelDiff(merged.saved, ref.saved);
    std::printf(
        "2 ranks x k=%d runs of 4 rows vs 1 rank on 24 rows, %d steps,%s: max relative "
        "difference %.3g\n",
        k, steps, flags, rel);
    EXPECT_LT(rel, 1e-4);  // float rounding: the ranks and runs sum in another order
    EXPECT_EQ(ParamLines(merged.output).size(), 1u) << merged.output;  // every rank agrees

    // The profile: one all-reduce per gradient and merge step, none on the other runs.
    for (int rank : {0, 1}) {
      int runs = 0;
      EXPECT_EQ(AllReduces(merged.output, rank, &runs), grads * steps) << merged.output;
      EXPECT_EQ(runs, k * steps);
    }
  }
  // Plain data parallelism over as many runs all-reduces every gradient every run: k times more.
  Trained plain = Train(2, dir + "/plain", " --rows=24 --steps=" + std::to_string(k * steps));
  int runs = 0;
  const int all = AllReduces(plain.output, 0, &runs);
  std::printf("all-reduces per run: plain data parallel %.3g, with gradient merge k=%d %.3g\n",
              static_cast<double>(all) / runs, k, static_cast<double>(grads) / k);
  EXPECT_EQ(all, grads * k * steps) << plain.output;
  RunCommand("rm -rf " + dir);
}

// keel train --gradient_merge_k under keel launch: a checkpoint on a merge step resumes; one taken
// between two merge steps holds rank 0's partial sums and is refused naming gradient merge; one
// worker resumes from such a checkpoint exactly.
TEST(GradientMergeDataParallel, KeelTrainResumesOnMergeStepsAndRefusesBetweenThem) {
  const std::string dir = MakeTempDir();
  const std::string keel = Keel();
  const std::string train = keel +
                            " train --model=mlp --mlp_hidden=16 --batch_size=8 --seed=3 "
                            "--optimizer=sgd --gradient_merge_k=2";
  const std::string launch = "FLAGS_cpu_math_threads=1 " + keel +
                             " launch --nproc_per_node=2 --log_dir=" + dir + "/log " + train;
  auto on_step = RunCommand(launch + " --steps=4 --save_dir=" + dir + "/even");
  ASSERT_EQ(on_step.exit_code, 0) << on_step.output;
  auto resumed = RunCommand(launch + " --steps=6 --load_dir=" + dir + "/even");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;

  auto between = RunCommand(launch + " --steps=3 --save_dir=" + dir + "/odd");
  ASSERT_EQ(between.exit_code, 0) << between.output;
  auto refused = RunCommand(launch + " --steps=5 --load_dir=" + dir + "/odd");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  const std::string logs = refused.output + RunCommand("cat " + dir + "/log/*").output;
  EXPECT_NE(logs.find("gradient merge"), std::string::npos) << logs;
  EXPECT_NE(logs.find("1 run(s) into an accumulation"), std::string::npos) << logs;

  // One worker: its checkpoint between merge steps resumes to the uninterrupted run's bits.
  auto whole = RunCommand(train + " --steps=5 --save_dir=" + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  auto part = RunCommand(train + " --steps=3 --save_dir=" + dir + "/part");
  ASSERT_EQ(part.exit_code, 0) << part.output;
  auto rest =
      RunCommand(train + " --steps=5 --load_dir=" + dir + "/part --save_dir=" + dir + "/part");
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  const auto a = CheckpointTensorBytes(dir + "/whole"), b = CheckpointTensorBytes(dir + "/part");
  EXPECT_TRUE(a.count("@GRADIENT_MERGE_STEP@")) << "the counter is checkpointed";
  EXPECT_EQ(a, b);
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
