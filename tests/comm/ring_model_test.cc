// The ring's α–β model (framework/comm/ring_model.h): the group size it implies, its per-host
// cache, and a 2-worker job that measures it once, keeps it, and trains with the groups it gives.
#include "framework/comm/ring_model.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/util/subprocess.h"

DECLARE_string(ring_model_cache);

namespace keel::testing {
namespace {

TEST(RingModel, GroupBytesMakeAlphaATenthOfTheTime) {
  // 20 us and 5 GB/s: 9 * alpha / beta = 900 KB, rounded up to 1 MiB.
  const RingModel m{20e-6, 1.0 / 5e9};
  EXPECT_EQ(GroupBytesFor(m), 1024.0 * 1024);
  const double b = GroupBytesFor(m);
  EXPECT_LE(m.alpha_s, 0.1 * (m.alpha_s + m.beta_s_per_byte * b) + 1e-12);
  // Clamped to [64 KiB, 64 MiB]; nothing measured gives the floor.
  EXPECT_EQ(GroupBytesFor({1e-9, 1e-9}), 64.0 * 1024);
  EXPECT_EQ(GroupBytesFor({1.0, 1e-12}), 64.0 * 1024 * 1024);
  EXPECT_EQ(GroupBytesFor({}), 64.0 * 1024);
}

TEST(RingModel, CacheKeepsTheModelAndIgnoresADamagedFile) {
  const std::string dir = MakeTempDir();
  const std::string saved = FLAGS_ring_model_cache;
  FLAGS_ring_model_cache = dir + "/sub";
  const std::string path = RingModelCachePath("shm", 2, 1);
  EXPECT_EQ(path, dir + "/sub/ring-model-shm-2r1n.txt");
  EXPECT_FALSE(LoadRingModel(path).has_value());
  SaveRingModel(path, {3e-5, 2e-10});
  auto m = LoadRingModel(path);
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->alpha_s, 3e-5);
  EXPECT_DOUBLE_EQ(m->beta_s_per_byte, 2e-10);
  std::ofstream(path) << "fast\n";
  EXPECT_FALSE(LoadRingModel(path).has_value());
  std::ofstream(path) << "-1 2e-10\n";
  EXPECT_FALSE(LoadRingModel(path).has_value());
  // An unwritable place is logged, not thrown.
  FLAGS_ring_model_cache = "/proc/no/such/dir";
  EXPECT_NO_THROW(SaveRingModel(RingModelCachePath("shm", 2, 1), {3e-5, 2e-10}));
  FLAGS_ring_model_cache = "off";
  EXPECT_EQ(RingModelCachePath("shm", 2, 1), "");
  FLAGS_ring_model_cache = saved;
  RunCommand("rm -rf " + dir);
}

// keel train's default fusion on 2 workers: the first run measures the ring and rank 0 keeps the
// model; the second reads it. Either way the job trains.
TEST(RingModel, TwoWorkersMeasureOnceThenReadTheCache) {
  const std::string dir = MakeTempDir();
  auto run = [&](const std::string& log) {
    return RunCommand(Keel() + " launch --nproc_per_node=2 --log_dir=" + dir + "/" + log + " " +
                      Keel() + " train --model=mlp --steps=3 --ring_model_cache=" + dir +
                      "/cache 2>&1; rc=$?; cat " + dir + "/" + log + "/workerlog.*; exit $rc");
  };
  auto first = run("l1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("fleet: ring model (shm, measured)"), std::string::npos)
      << first.output;
  EXPECT_TRUE(std::ifstream(dir + "/cache/ring-model-shm-2r1n.txt").good()) << first.output;
  auto second = run("l2");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("fleet: ring model (shm, cached in " + dir +
                               "/cache/ring-model-shm-2r1n.txt)"),
            std::string::npos)
      << second.output;
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
