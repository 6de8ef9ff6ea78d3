// The invariant: N ranks each on B/N rows train to the same parameters as one rank on B rows,
// for 2, 3 and 4 ranks, 1 or 2 rings, over shared memory and over Gloo, with and without gradient
// fusion; only rank 0 writes the checkpoint, and it loads back.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "tests/util/model_train.h"
#include "tests/util/named_tensors.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

NamedTensors Train(int nranks, int rings, const std::string& dir,
                   const std::string& backend = "auto", int fuse_num = 0,
                   const std::string& extra = "", std::string* output = nullptr) {
  std::string worker =
      BinPath("mlp_dp_worker") + " --global_batch=24 --steps=20 --rings=" + std::to_string(rings) +
      " --out=" + dir + "/rank${RANK:-0}" +
      (fuse_num > 0 ? " --fuse --fuse_num=" + std::to_string(fuse_num) : "") + extra;
  std::string cmd = nranks == 1 ? worker
                                : "FLAGS_cpu_math_threads=1 FLAGS_cpu_comm_backend=" + backend +
                                      " " + BinPath("keel") +
                                      " launch --nproc_per_node=" + std::to_string(nranks) +
                                      " --log_dir=" + dir + "/log sh -c '" + worker + "'";
  auto r = RunCommand(cmd + (nranks == 1 ? "" : "; cat " + dir + "/log/workerlog.*"));
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  if (output) *output = r.output;
  return LoadSafetensors(dir + "/rank0/" + kPersistablesFile);
}

TEST(DataParallel, NRanksOnBOverNRowsMatchOneRankOnB) {
  std::string dir = MakeTempDir();
  NamedTensors ref = Train(1, 1, dir + "/single");
  ASSERT_FALSE(ref.empty());
  struct Config {
    const char* backend;
    int rings;
    int fuse_num;  // 0: no fusion; else fuse_all_reduce_ops with this many tensors per group
  };
  for (Config c : {Config{"shm", 1, 0}, Config{"shm", 2, 0}, Config{"gloo", 1, 0},
                   Config{"shm", 1, 8}, Config{"shm", 2, 2}, Config{"gloo", 2, 4}}) {
    const int rings = c.rings;
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + std::to_string(rings) + " rings, " + c.backend +
                   ", fuse_num " + std::to_string(c.fuse_num));
      std::string d = dir + "/n" + std::to_string(n) + "r" + std::to_string(rings) + c.backend +
                      "f" + std::to_string(c.fuse_num);
      NamedTensors got = Train(n, rings, d, c.backend, c.fuse_num);
      ASSERT_NO_FATAL_FAILURE(ExpectSameParameters(got, ref));
      // Only rank 0 wrote.
      struct stat st;
      for (int r = 1; r < n; ++r)
        EXPECT_NE(::stat((d + "/rank" + std::to_string(r)).c_str(), &st), 0) << "rank " << r;
    }
  }
  RunCommand("rm -rf " + dir);
}

// On shared-memory rings the fused gradients live in memory the peers map, and their all-reduces
// run without copies (--shm_zero_copy_mb): every step's all-reduce of every group does, on 1 and 2
// rings, and the parameters come out bit for bit as with the copying path.
TEST(DataParallel, FusedGradientsAllReduceWithoutCopiesToTheSameBits) {
  std::string dir = MakeTempDir();
  for (int rings : {1, 2}) {
    SCOPED_TRACE(std::to_string(rings) + " rings");
    const std::string d = dir + "/r" + std::to_string(rings);
    std::string with, without;
    NamedTensors a = Train(2, rings, d + "/on", "shm", 2, "", &with);
    NamedTensors b = Train(2, rings, d + "/off", "shm", 2, " --shm_zero_copy_mb=0", &without);
    // 20 steps, each all-reducing every fused group once.
    const size_t at = with.find("rank 0 fused_groups ");
    ASSERT_NE(at, std::string::npos) << with;
    const int groups = std::stoi(with.substr(at + 20));
    EXPECT_GE(groups, 2);
    EXPECT_NE(with.find("rank 0 zero_copy_allreduces " + std::to_string(20 * groups)),
              std::string::npos)
        << with;
    EXPECT_NE(with.find("rank 1 zero_copy_allreduces " + std::to_string(20 * groups)),
              std::string::npos)
        << with;
    EXPECT_NE(without.find("rank 0 zero_copy_allreduces 0"), std::string::npos) << without;
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    for (size_t k = 0; k < a.size(); ++k) {
      ASSERT_EQ(a[k].first, b[k].first);
      ASSERT_EQ(a[k].second.nbytes(), b[k].second.nbytes()) << a[k].first;
      EXPECT_EQ(std::memcmp(a[k].second.raw_data(), b[k].second.raw_data(), a[k].second.nbytes()),
                0)
          << a[k].first;
    }
  }
  RunCommand("rm -rf " + dir);
}

// Every tensor of `ref` is in `got` (which may hold more: LocalSGD's snapshots and counters).
void ExpectNear(const NamedTensors& got, const NamedTensors& ref) {
  for (size_t k = 0; k < ref.size(); ++k) {
    const Tensor* found = FindTensor(got, ref[k].first);
    ASSERT_NE(found, nullptr) << ref[k].first;
    const Tensor& a = ref[k].second;
    const Tensor& b = *found;
    ASSERT_EQ(a.dims(), b.dims());
    for (int64_t i = 0; i < a.numel(); ++i) {
      float x = a.data<float>()[i], y = b.data<float>()[i];
      ASSERT_NEAR(y, x, 1e-5f * std::abs(x) + 1e-6f) << ref[k].first << "[" << i << "]";
    }
  }
}

// The "rank R params S W" lines of every rank, which must all be equal.
std::set<std::string> ParamLines(const std::string& output) {
  std::set<std::string> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("rank ", 0) == 0 && line.find(" params ") != std::string::npos)
      lines.insert(line.substr(line.find(" params ")));
  return lines;
}

// The invariant beyond plain SGD: Momentum, Adam, global-norm clipping (which must see the
// all-reduced gradients), a learning-rate schedule, and fusion limited by MB (several groups).
TEST(DataParallel, OptimizersClippingScheduleAndFusionByMbMatchOneRank) {
  std::string dir = MakeTempDir();
  struct Config {
    const char* flags;
    int n;
  };
  int k = 0;
  for (Config c :
       {Config{" --opt=momentum", 2}, Config{" --opt=adam", 3}, Config{" --clip_norm=0.05", 2},
        Config{" --lr_decay", 2}, Config{" --fuse_mb=0.0005", 3},
        Config{" --opt=adam --lr_decay --clip_norm=0.05 --fuse_mb=0.001", 2}}) {
    SCOPED_TRACE(std::string(c.flags) + ", " + std::to_string(c.n) + " ranks");
    const std::string d = dir + "/c" + std::to_string(k++);
    NamedTensors ref = Train(1, 1, d + "/single", "auto", 0, c.flags);
    ASSERT_FALSE(ref.empty());
    std::string out;
    NamedTensors got = Train(c.n, 1, d + "/n", "auto", 0, c.flags, &out);
    ExpectNear(got, ref);
    EXPECT_EQ(ParamLines(out).size(), 1u) << out;
    if (std::string(c.flags).find("fuse_mb=0.0005") != std::string::npos) {
      // 0.0005 MB (524 bytes) splits the MLP's 6 gradients (about 2 KB) into 4 groups.
      EXPECT_NE(out.find("rank 0 fused_groups 4"), std::string::npos) << out;
    }
  }
  RunCommand("rm -rf " + dir);
}

// Hierarchical all-reduce (reduce-scatter in the node, all-reduce across nodes, all-gather in the
// node), with nodes of k ranks simulated on this host: the same parameters as one rank.
TEST(DataParallel, HierarchicalAllReduceMatchesOneRank) {
  std::string dir = MakeTempDir();
  NamedTensors ref = Train(1, 1, dir + "/single");
  ASSERT_FALSE(ref.empty());
  struct Config {
    int n, k, rings, fuse_num;
    const char* backend;
  };
  for (Config c : {Config{4, 2, 2, 8, "auto"}, Config{4, 2, 1, 0, "auto"},
                   Config{2, 1, 1, 8, "auto"}, Config{3, 3, 1, 2, "gloo"}}) {
    SCOPED_TRACE(std::to_string(c.n) + " ranks, " + std::to_string(c.k) + " per node, " +
                 std::to_string(c.rings) + " rings, fuse_num " + std::to_string(c.fuse_num) + ", " +
                 c.backend);
    NamedTensors got = Train(c.n, c.rings,
                             dir + "/h" + std::to_string(c.n) + std::to_string(c.k) +
                                 std::to_string(c.rings) + std::to_string(c.fuse_num),
                             c.backend, c.fuse_num, " --hier=" + std::to_string(c.k));
    ExpectNear(got, ref);
  }
  RunCommand("rm -rf " + dir);
}

// LocalSGD with plain SGD and K = 1 averages, every step, the ranks' steps from equal parameters:
// that is synchronous SGD on the whole batch. With K = 3 after 2 warm-up steps the ranks drift
// apart between averages and agree again after each; 20 steps end on an average.
TEST(DataParallel, LocalSgdWithKOneIsSynchronousAndRanksAgreeAfterEachAverage) {
  std::string dir = MakeTempDir();
  NamedTensors ref = Train(1, 1, dir + "/single");
  ASSERT_FALSE(ref.empty());
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    std::string out;
    NamedTensors k1 =
        Train(n, 2, dir + "/k1n" + std::to_string(n), "auto", 0, " --local_sgd_steps=1", &out);
    ExpectNear(k1, ref);
    EXPECT_EQ(ParamLines(out).size(), 1u) << out;

    NamedTensors k3 = Train(n, 1, dir + "/k3n" + std::to_string(n), "auto", 0,
                            " --local_sgd_steps=3 --local_sgd_warmup=2", &out);
    auto lines = ParamLines(out);
    EXPECT_EQ(lines.size(), 1u) << out;  // every rank printed the same parameters
    // Local steps change the result: not the synchronous one.
    double diff = 0;
    for (size_t k = 0; k < ref.size(); ++k)
      for (int64_t i = 0; i < ref[k].second.numel(); ++i)
        diff = std::max<double>(diff, std::abs(ref[k].second.data<float>()[i] -
                                               FindTensor(k3, ref[k].first)->data<float>()[i]));
    EXPECT_GT(diff, 1e-4);
  }
  RunCommand("rm -rf " + dir);
}

// A synchronous checkpoint resumes into LocalSGD: checkpoints hold the user's variables only (no
// @LOCAL_SGD_ snapshots or counters), and on load the snapshots are rebuilt as the loaded
// parameters. With K = 1 LocalSGD is synchronous SGD, so the resumed LocalSGD run must equal the
// resumed synchronous run; a snapshot left at the startup's initialization would pull the
// parameters back towards it.
TEST(DataParallel, SyncCheckpointResumesIntoLocalSgd) {
  std::string dir = MakeTempDir();
  const std::string keel = BinPath("keel");
  const std::string launch = "FLAGS_cpu_math_threads=1 " + keel +
                             " launch --nproc_per_node=2 --log_dir=" + dir + "/log " + keel +
                             " train --mlp_hidden=16 --batch_size=8 --seed=3 --optimizer=sgd";
  auto sync = RunCommand(launch + " --steps=4 --save_dir=" + dir + "/sync");
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  auto local = RunCommand(launch + " --steps=3 --local_sgd_steps=1 --load_dir=" + dir +
                          "/sync --save_dir=" + dir + "/local");
  ASSERT_EQ(local.exit_code, 0) << local.output << RunCommand("cat " + dir + "/log/*").output;
  auto again =
      RunCommand(launch + " --steps=3 --load_dir=" + dir + "/sync --save_dir=" + dir + "/again");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  NamedTensors a = LoadSafetensors(dir + "/local/" + kPersistablesFile);
  NamedTensors b = LoadSafetensors(dir + "/again/" + kPersistablesFile);
  for (const auto& kv : a)
    EXPECT_EQ(kv.first.find("@LOCAL_SGD"), std::string::npos) << kv.first << " was saved";
  ASSERT_EQ(a.size(), b.size());
  ExpectNear(a, b);
  // A LocalSGD checkpoint resumes into synchronous training too.
  auto back = RunCommand(launch + " --steps=1 --load_dir=" + dir + "/local");
  EXPECT_EQ(back.exit_code, 0) << back.output;

  // The snapshots right after loading are the loaded parameters (averaging by deltas hides a
  // stale snapshot from the parameters themselves, so look at it directly).
  std::string out;
  Train(2, 1, dir + "/w_sync", "auto", 0, "", &out);
  Train(2, 1, dir + "/w_local", "auto", 0,
        " --steps=0 --local_sgd_steps=2 --load_dir=" + dir + "/w_sync/rank0", &out);
  EXPECT_NE(out.find("rank 0 snapshot_gap 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 snapshot_gap 0\n"), std::string::npos) << out;
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
