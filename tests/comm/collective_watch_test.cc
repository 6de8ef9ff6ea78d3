// The collective watch's report (framework/comm/collective_watch.h): which posts mean ranks in
// calls that cannot complete together, and how the report names each rank's call. The
// multi-process behaviour is tested in tests/fleet/collective_mismatch_test.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "framework/comm/collective_watch.h"

namespace keel {
namespace {

PostedWait FleetWait(const std::string& name, uint64_t seq) {
  PostedWait w;
  w.channel = "fleet";
  w.where = "fleet's calls";
  w.seq = seq;
  w.exclusive = true;
  w.name = name;
  return w;
}

PostedWait RingWait(const std::string& name, const std::string& where, uint64_t seq,
                    const std::string& channel = "", const std::string& detail = "") {
  PostedWait w;
  w.channel = channel.empty() ? where : channel;
  w.where = where;
  w.seq = seq;
  w.name = name;
  w.detail = detail;
  return w;
}

std::vector<RankPost> Posts(std::vector<std::vector<PostedWait>> waits) {
  std::vector<RankPost> posts;
  for (size_t r = 0; r < waits.size(); ++r) {
    RankPost p;
    p.rank = static_cast<int>(r);
    p.waits = waits[r];
    posts.push_back(p);
  }
  return posts;
}

TEST(CollectiveWatchReport, AMetricOnRankZeroAgainstABarrierOnRankOneNamesBothCalls) {
  const std::string report = CollectiveMismatchReport(
      Posts({{FleetWait("fleet::metrics::sum", 4),
              RingWait("fleet::metrics::sum", "fleet's eager ring", 2, "ring 2147483647")},
             {FleetWait("fleet::barrier_worker", 4)}}));
  EXPECT_EQ(report,
            "collective mismatch: ranks 0 and 1 wait in collective calls that cannot complete "
            "together:\n"
            "  rank 0: fleet::metrics::sum (fleet call #4; on fleet's eager ring, collective #2)\n"
            "  rank 1: fleet::barrier_worker (fleet call #4)\n"
            "Every rank must make the same collective calls in the same order; a collective that "
            "only some ranks reach (a metric inside `if (fleet::is_first_worker())`, a training "
            "step one rank skips) waits for the others forever.");
  // The user's words only: no ring id of fleet's own ring, no store key.
  EXPECT_EQ(report.find("2147483647"), std::string::npos);
  EXPECT_EQ(report.find("keel/"), std::string::npos);
}

TEST(CollectiveWatchReport, AFleetCallAgainstATrainingStepNamesTheOpAndItsRun) {
  const std::string report =
      CollectiveMismatchReport(Posts({{FleetWait("fleet::metrics::sum", 3)},
                                      {RingWait("op c_allreduce_sum of @FUSED_GRAD@0", "ring 0", 14,
                                                "", "in run 6 of its program")}}));
  EXPECT_NE(report.find("  rank 0: fleet::metrics::sum (fleet call #3)\n"), std::string::npos)
      << report;
  EXPECT_NE(report.find("  rank 1: op c_allreduce_sum of @FUSED_GRAD@0 in run 6 of its program "
                        "(ring 0, collective #14)\n"),
            std::string::npos)
      << report;
}

TEST(CollectiveWatchReport, TheSameFleetCallOneCallAheadOrARingsSetupCannotMeet) {
  // One rank made one more metric call than the other.
  EXPECT_NE(CollectiveMismatchReport(Posts(
                {{FleetWait("fleet::metrics::sum", 5)}, {FleetWait("fleet::metrics::sum", 6)}})),
            "");
  // Setting up a program's ring (startup program) against fleet's eager ring's setup.
  const std::string report = CollectiveMismatchReport(
      Posts({{RingWait("op c_comm_init", "ring 0", 0, "", "in run 1 of its program")},
             {FleetWait("fleet::metrics::max", 1),
              RingWait("fleet::metrics::max", "fleet's eager ring", 0, "ring 2147483647")}}));
  EXPECT_NE(report.find("rank 0: op c_comm_init in run 1 of its program (setting up ring 0)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 1: fleet::metrics::max (fleet call #1; setting up fleet's eager "
                        "ring)"),
            std::string::npos)
      << report;
  // Two different collectives, or two numbers, on one ring.
  EXPECT_NE(CollectiveMismatchReport(Posts({{RingWait("op c_allreduce_sum of a", "ring 1", 7)},
                                            {RingWait("op c_broadcast of b", "ring 1", 7)}})),
            "");
  EXPECT_NE(CollectiveMismatchReport(Posts({{RingWait("op c_allreduce_sum of a", "ring 1", 7)},
                                            {RingWait("op c_allreduce_sum of a", "ring 1", 8)}})),
            "");
}

TEST(CollectiveWatchReport, WaitsThatMayStillCompleteAreNoMismatch) {
  // A rank with no post may be computing its way to the call.
  EXPECT_EQ(CollectiveMismatchReport(Posts({{FleetWait("fleet::barrier_worker", 2)}, {}})), "");
  // Every rank in the same call (a slow peer, a big tensor).
  EXPECT_EQ(CollectiveMismatchReport(Posts({{FleetWait("fleet::metrics::sum", 2)},
                                            {FleetWait("fleet::metrics::sum", 2)},
                                            {FleetWait("fleet::metrics::sum", 2)}})),
            "");
  // Collectives of one step on different rings run at once: a rank waiting on ring 1 while
  // another waits on ring 0 is two ring threads of one step, not a mismatch.
  EXPECT_EQ(CollectiveMismatchReport(Posts({{RingWait("op c_allreduce_sum of a", "ring 0", 3)},
                                            {RingWait("op c_allreduce_sum of b", "ring 1", 3)}})),
            "");
  // Rings of one id in different groups (hierarchical all-reduce) are different rings.
  EXPECT_EQ(CollectiveMismatchReport(
                Posts({{RingWait("op c_allreduce_sum of a", "ring 2", 3, "ring 2 node0")},
                       {RingWait("op c_allreduce_sum of a", "ring 2", 4, "ring 2 node1")}})),
            "");
}

TEST(CollectiveWatchReport, ARankNotInAnyCollectiveIsSaidToBeBusyAndManyRanksAreCut) {
  std::vector<std::vector<PostedWait>> waits(20);
  waits[0] = {FleetWait("fleet::barrier_worker", 1)};
  waits[1] = {FleetWait("fleet::all_reduce", 1)};
  const std::string report = CollectiveMismatchReport(Posts(waits));
  EXPECT_NE(report.find("  rank 2: in no collective for as long (busy elsewhere, or stopped)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("  rank 15: "), std::string::npos) << report;
  EXPECT_EQ(report.find("  rank 16: "), std::string::npos) << report;
  EXPECT_NE(report.find("(4 more ranks)"), std::string::npos) << report;
}

TEST(CollectiveWatchReport, PostsSurviveTheStoreAndLoseTabsAndNewlines) {
  RankPost post;
  post.waits = {
      FleetWait("fleet::metrics::acc", 9),
      RingWait("op c_allreduce_sum of x\ty", "ring 0", 12, "ring 0", "in run 3\nof its program")};
  const RankPost back = DecodePost(3, EncodePost(post));
  EXPECT_EQ(back.rank, 3);
  EXPECT_FALSE(back.exited);
  ASSERT_EQ(back.waits.size(), 2u);
  EXPECT_EQ(back.waits[0].channel, "fleet");
  EXPECT_TRUE(back.waits[0].exclusive);
  EXPECT_EQ(back.waits[0].seq, 9u);
  EXPECT_EQ(back.waits[0].name, "fleet::metrics::acc");
  EXPECT_FALSE(back.waits[1].exclusive);
  EXPECT_EQ(back.waits[1].seq, 12u);
  EXPECT_EQ(back.waits[1].name, "op c_allreduce_sum of x y");
  EXPECT_EQ(back.waits[1].detail, "in run 3 of its program");
  EXPECT_TRUE(DecodePost(0, "").waits.empty());
  EXPECT_TRUE(DecodePost(0, "garbage without fields\n").waits.empty());

  RankPost left;
  left.exited = true;
  left.last_seq = {{"fleet", 4}, {"ring 0", 31}, {"ring 2147483647", 2}};
  const RankPost left_back = DecodePost(1, EncodePost(left));
  EXPECT_TRUE(left_back.exited);
  EXPECT_TRUE(left_back.waits.empty());
  EXPECT_EQ(left_back.last_seq, left.last_seq);
}

// A rank that exited posts the last call it made on each channel: a wait for a call it never made
// cannot complete; a wait for one it made is about to.
TEST(CollectiveWatchReport, ARankThatExitedBeforeACallIsNamedAsGone) {
  RankPost left;
  left.rank = 1;
  left.exited = true;
  left.last_seq = {{"fleet", 1}, {"ring 0", 30}};
  RankPost waiting;
  waiting.rank = 0;
  waiting.waits = {FleetWait("fleet::metrics::sum", 2),
                   RingWait("fleet::metrics::sum", "fleet's eager ring", 0, "ring 2147483647")};
  const std::string report = CollectiveMismatchReport({waiting, left});
  EXPECT_NE(report.find("collective mismatch: rank 1 exited while rank 0 waits in a collective "
                        "call it would have to join:\n"
                        "  rank 0: fleet::metrics::sum (fleet call #2; setting up fleet's eager "
                        "ring)\n"
                        "  rank 1: exited after fleet call #1 (its program returned or called "
                        "exit)\n"),
            std::string::npos)
      << report;
  // A step's all-reduce the exited rank made (its last, #30) completes; #31 never does.
  waiting.waits = {RingWait("op c_allreduce_sum of w@GRAD", "ring 0", 30)};
  EXPECT_EQ(CollectiveMismatchReport({waiting, left}), "");
  waiting.waits = {RingWait("op c_allreduce_sum of w@GRAD", "ring 0", 31)};
  EXPECT_NE(CollectiveMismatchReport({waiting, left}), "");
  // Its last fleet call is one the waiting rank may be finishing.
  waiting.waits = {FleetWait("fleet::barrier_worker", 1)};
  EXPECT_EQ(CollectiveMismatchReport({waiting, left}), "");
  // Nobody waits: nothing to report.
  waiting.waits.clear();
  EXPECT_EQ(CollectiveMismatchReport({waiting, left}), "");
}

}  // namespace
}  // namespace keel
