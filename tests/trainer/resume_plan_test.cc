// The ranks' choice of a resume checkpoint (trainer/resume.h), from their reports: the newest
// readable checkpoint wins, and every rank whose own file is not that one receives it. The
// processes that carry it out are tested in tests/cli/multihost_test.cc (two hosts, each with its
// own save_dir) and tests/cli/fault_tolerance_test.cc.
#include "trainer/resume.h"

#include <gtest/gtest.h>

#include <vector>

namespace keel::testing {
namespace {

RankCheckpoint Has(int64_t step, const std::string& crc, uint64_t size = 100) {
  RankCheckpoint c;
  c.dir = "ckpt";
  c.has = true;
  c.step = step;
  c.crc32 = crc;
  c.size = size;
  return c;
}

RankCheckpoint None(const std::string& error = "") {
  RankCheckpoint c;
  c.dir = "ckpt";
  c.error = error;
  return c;
}

TEST(ResumePlan, TheNewestCheckpointGoesToEveryRankWithoutIt) {
  // Rank 0 wrote step 20 on its node; rank 1's node has nothing, rank 2's an older one, rank 3's
  // both damaged.
  ResumePlan p = PlanResume({Has(20, "aaaa"), None(), Has(10, "bbbb"), None("damaged")});
  EXPECT_EQ(p.source, 0);
  EXPECT_EQ(p.receivers, (std::vector<int>{1, 2, 3}));
}

TEST(ResumePlan, ARankOtherThanZeroCanHoldTheNewest) {
  // Rank 0's latest is damaged, so it reports its previous checkpoint (step 20); rank 1 still
  // reads step 30: both resume from 30, which rank 0 receives.
  ResumePlan p = PlanResume({Has(20, "aaaa"), Has(30, "cccc")});
  EXPECT_EQ(p.source, 1);
  EXPECT_EQ(p.receivers, (std::vector<int>{0}));
}

TEST(ResumePlan, RanksThatReadTheSameFileLoadTheirOwn) {
  // A shared folder: every rank reads the same file, nothing is sent.
  ResumePlan shared = PlanResume({Has(30, "cccc"), Has(30, "cccc"), Has(30, "cccc")});
  EXPECT_EQ(shared.source, 0);
  EXPECT_TRUE(shared.receivers.empty());
  // Equal steps but another file (another run's): the lowest rank's is sent to the others.
  ResumePlan other = PlanResume({Has(30, "cccc"), Has(30, "dddd"), Has(30, "cccc", 99)});
  EXPECT_EQ(other.source, 0);
  EXPECT_EQ(other.receivers, (std::vector<int>{1, 2}));
}

TEST(ResumePlan, NoReadableCheckpointAnywhereHasNoSource) {
  ResumePlan p = PlanResume({None(), None("damaged")});
  EXPECT_EQ(p.source, -1);
  EXPECT_TRUE(p.receivers.empty());
}

}  // namespace
}  // namespace keel::testing
