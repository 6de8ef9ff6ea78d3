// The invariant: N ranks each on B/N rows train to the same parameters as one rank on B rows,
// for 2, 3 and 4 ranks, 1 or 2 rings, over shared memory and over Gloo; only rank 0 writes the
// checkpoint, and it loads back.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>

#include "framework/io/io.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

NamedTensors Train(int nranks, int rings, const std::string& dir,
                   const std::string& backend = "auto") {
  std::string worker = BinPath("mlp_dp_worker") + " --global_batch=24 --steps=20 --rings=" +
                       std::to_string(rings) + " --out=" + dir + "/rank${RANK:-0}";
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
  };
  for (Config c : {Config{"shm", 1}, Config{"shm", 2}, Config{"gloo", 1}}) {
    const int rings = c.rings;
    for (int n : {2, 3, 4}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + std::to_string(rings) + " rings, " +
                   c.backend);
      std::string d = dir + "/n" + std::to_string(n) + "r" + std::to_string(rings) + c.backend;
      NamedTensors got = Train(n, rings, d, c.backend);
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
