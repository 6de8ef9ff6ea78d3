// The invariant: N ranks each on B/N rows train to the same parameters as one rank on B rows,
// for 2, 3 and 4 ranks, 1 or 2 rings, over shared memory and over Gloo, with and without gradient
// fusion; only rank 0 writes the checkpoint, and it loads back.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>

#include "framework/io/io.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

NamedTensors Train(int nranks, int rings, const std::string& dir,
                   const std::string& backend = "auto", int fuse_num = 0) {
  std::string worker = BinPath("mlp_dp_worker") + " --global_batch=24 --steps=20 --rings=" +
                       std::to_string(rings) + " --out=" + dir + "/rank${RANK:-0}" +
                       (fuse_num > 0 ? " --fuse --fuse_num=" + std::to_string(fuse_num) : "");
  std::string cmd = nranks == 1 ? worker
                                : "FLAGS_cpu_math_threads=1 FLAGS_cpu_comm_backend=" + backend +
                                      " " + BinPath("keel") +
                                      " launch --nproc_per_node=" + std::to_string(nranks) +
                                      " --log_dir=" + dir + "/log sh -c '" + worker + "'";
  auto r = RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
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
      SCOPED_TRACE(std::to_string(n) + " ranks, " + std::to_string(rings) + " rings, " +
                   c.backend + ", fuse_num " + std::to_string(c.fuse_num));
      std::string d = dir + "/n" + std::to_string(n) + "r" + std::to_string(rings) + c.backend +
                      "f" + std::to_string(c.fuse_num);
      NamedTensors got = Train(n, rings, d, c.backend, c.fuse_num);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t k = 0; k < ref.size(); ++k) {
        ASSERT_EQ(got[k].first, ref[k].first);
        const Tensor& a = ref[k].second;
        const Tensor& b = got[k].second;
        ASSERT_EQ(a.dims(), b.dims());
        for (int64_t i = 0; i < a.numel(); ++i) {
          float x = a.data<float>()[i], y = b.data<float>()[i];
          ASSERT_NEAR(y, x, 1e-5f * std::abs(x) + 1e-6f) << ref[k].first << "[" << i << "]";
        }
      }
      // Only rank 0 wrote.
      struct stat st;
      for (int r = 1; r < n; ++r)
        EXPECT_NE(::stat((d + "/rank" + std::to_string(r)).c_str(), &st), 0) << "rank " << r;
    }
  }
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
