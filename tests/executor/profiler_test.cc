// Profiler: off records nothing; on, every op the executor runs is one span in run order, the
// Chrome trace is valid JSON that real readers load, the summary adds up, and a bad path is a
// keel::Error naming it. Also `keel train --profile` end to end.
#include "framework/profiler/profiler.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "executor/executor.h"
#include "framework/dsl/layers.h"
#include "tests/util/op_test_util.h"
#include "tests/util/small_programs.h"
#include "tests/util/subprocess.h"

namespace keel {
namespace {

using testing::ErrorOf;

using Net = testing::TanhNet;

class ProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    profiler::Stop();
    profiler::Reset();
  }
  void TearDown() override {
    profiler::Stop();
    profiler::Reset();
  }
};

TEST_F(ProfilerTest, OffRecordsNothing) {
  Net n;
  Executor exe;
  exe.Run(n.main, {{"x", Tensor::FromVector<float>({1, 2, 3}, {1, 3})}});
  EXPECT_TRUE(profiler::Events().empty());
}

TEST_F(ProfilerTest, EveryOpRunIsOneSpanInOrder) {
  Net n;
  Executor exe;
  profiler::Start();
  for (int i = 0; i < 3; ++i)
    exe.Run(n.main, {{"x", Tensor::FromVector<float>({1, 2, 3}, {1, 3})}});
  profiler::Stop();
  exe.Run(n.main, {{"x", Tensor::FromVector<float>({1, 2, 3}, {1, 3})}});  // not recorded
  auto events = profiler::Events();
  const Block& b = n.main.global_block();
  ASSERT_EQ(events.size(), 3 * b.num_ops());
  int64_t last_end = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    EXPECT_EQ(e.name, b.op(i % b.num_ops())->type());
    EXPECT_EQ(e.category, "op");
    EXPECT_EQ(e.detail.rfind("#" + std::to_string(i % b.num_ops()) + " -> ", 0), 0u) << e.detail;
    EXPECT_GE(e.start_ns, last_end);  // sequential, in run order
    EXPECT_GE(e.dur_ns, 0);
    last_end = e.start_ns + e.dur_ns;
  }
  std::string summary = profiler::Summary();
  EXPECT_NE(summary.find("tanh"), std::string::npos) << summary;
  EXPECT_NE(summary.find(" 3 "), std::string::npos) << summary;  // 3 calls each
}

TEST_F(ProfilerTest, ChromeTraceIsValidJsonWithOneEventPerSpan) {
  Net n;
  Executor exe;
  profiler::Start();
  exe.Run(n.main, {{"x", Tensor::FromVector<float>({1, 2, 3}, {1, 3})}});
  profiler::Stop();
  std::string dir = testing::MakeTempDir();
  std::string path = dir + "/trace \"quoted\".json";
  profiler::WriteChromeTrace(path, 3);
  auto r = testing::RunCommand(
      "python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))[\"traceEvents\"]; "
      "x=[e for e in t if e[\"ph\"]==\"X\"]; "
      "print(len(x), sorted(set(e[\"pid\"] for e in t)), x[0][\"name\"], "
      "all(e[\"dur\"]>=0 for e in x))' '" +
      path + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, std::to_string(n.main.global_block().num_ops()) + " [3] " +
                          n.main.global_block().op(0)->type() + " True\n");
  testing::RunCommand("rm -rf '" + dir + "'");
}

TEST_F(ProfilerTest, UnwritablePathIsAnErrorNamingIt) {
  std::string msg = ErrorOf([] { profiler::WriteChromeTrace("/no/such/dir/trace.json"); });
  EXPECT_NE(msg.find("/no/such/dir/trace.json"), std::string::npos) << msg;
}

TEST(ProfilerCli, TrainWritesATraceAndPrintsTheSummary) {
  std::string dir = testing::MakeTempDir();
  auto r =
      testing::RunCommand(testing::BinPath("keel") +
                          " train --steps=3 --mlp_hidden=16 --seed=1 --profile=" + dir + "/t.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("profile of rank 0: " + dir + "/t.json"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fused_gemm_epilogue_grad"), std::string::npos) << r.output;
  auto j = testing::RunCommand(
      "python3 -c 'import json,sys; t=json.load(open(sys.argv[1])); "
      "print(sum(e[\"name\"]==\"sgd\" for e in t[\"traceEvents\"]))' " +
      dir + "/t.json");
  EXPECT_EQ(j.output, "18\n");  // 6 parameters x 3 steps
  testing::RunCommand("rm -rf " + dir);
}

// Two workers, one all-reduce per gradient: on rank 0 an all-reduce span (on its ring's thread)
// overlaps a backward op's span (on the main thread), and after clock alignment every all-reduce
// of rank 0 overlaps the same all-reduce of rank 1 (neither can finish before the other starts),
// within 0.3 ms for the alignment's error. Rank 1 starts 0.5 s late, so its own clock is 0.5 s
// behind rank 0's. 16 steps of 1024-wide layers: under the load of a parallel test run, 8 steps
// of 512 sometimes left no all-reduce overlapping a backward op (the ring's thread ran late).
TEST(ProfilerCli, TwoWorkerTraceShowsAllReduceOverlappingBackwardOnAlignedClocks) {
  std::string dir = testing::MakeTempDir();
  auto r = testing::RunCommand(
      "FLAGS_cpu_math_threads=1 " + testing::BinPath("keel") + " launch --nproc_per_node=2 " +
      "--log_dir=" + dir + "/log sh -c 'if [ \"$PADDLE_TRAINER_ID\" = 1 ]; then sleep 0.5; fi; " +
      "exec " + testing::BinPath("keel") +
      " train --steps=16 --mlp_hidden=1024 --seed=1 --fuse_all_reduce_ops=false --profile=" + dir +
      "/t.json'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ofstream(dir + "/check.py")
      << "import json, sys\n"
         "def spans(rank):\n"
         "    t = json.load(open(sys.argv[1] + '.rank%d' % rank))['traceEvents']\n"
         "    names = {e['tid']: e['args']['name'] for e in t if e['name'] == 'thread_name'}\n"
         "    x = [e for e in t if e['ph'] == 'X']\n"
         "    return x, names\n"
         "x0, names0 = spans(0)\n"
         "x1, _ = spans(1)\n"
         "ar = lambda x: [e for e in x if e['name'] == 'c_allreduce_sum']\n"
         "grads = [e for e in x0 if e['cat'] == 'op' and e['name'].endswith('_grad')]\n"
         "hit = lambda a, b: a['ts'] < b['ts'] + b['dur'] and b['ts'] < a['ts'] + a['dur']\n"
         "over = sum(1 for a in ar(x0) for g in grads if hit(a, g) and a['tid'] != g['tid'])\n"
         "print('comm_cat', all(e['cat'] == 'comm' for e in ar(x0)))\n"
         "print('ring_thread', sorted(set(names0[e['tid']] for e in ar(x0))))\n"
         "print('overlaps', over > 0)\n"
         "a0, a1 = ar(x0), ar(x1)\n"
         "near = lambda a, b: a['ts'] < b['ts'] + b['dur'] + 300 and b['ts'] < a['ts'] + a['dur'] "
         "+ 300\n"
         "print('aligned', len(a0) == len(a1) > 0 and all(near(a, b) for a, b in zip(a0, a1)))\n";
  auto j = testing::RunCommand("python3 " + dir + "/check.py " + dir + "/t.json");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  EXPECT_NE(j.output.find("comm_cat True"), std::string::npos) << j.output;
  EXPECT_NE(j.output.find("ring_thread ['keel-ring0']"), std::string::npos) << j.output;
  EXPECT_NE(j.output.find("overlaps True"), std::string::npos) << j.output;
  EXPECT_NE(j.output.find("aligned True"), std::string::npos) << j.output;
  testing::RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel
