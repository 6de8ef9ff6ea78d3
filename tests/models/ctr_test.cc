// The CTR-DNN model of the zoo: its Zipf draws, its synthetic click rule, the Criteo reader, the
// bucketed AUC, and that it learns the rule through its row-sparse table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/error.h"
#include "models/ctr/ctr_model.h"
#include "models/model_zoo.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"
#include "transpiler/ps_pass.h"

namespace keel {
namespace models {
namespace {

using testing::ErrorOf;
using testing::ExpectErrorContainsAll;

TEST(CtrData, ZipfDrawsFollowTheLaw) {
  std::mt19937_64 rng(5);
  const int n = 200000;
  std::map<int64_t, int> count;
  for (int i = 0; i < n; ++i) ++count[DrawZipf(&rng, 1.2)];
  // P(k) = k^-1.2 / zeta(1.2), zeta(1.2) = 5.5915...
  const double zeta = 5.591582441;
  for (int64_t k : {1, 2, 3, 10}) {
    const double p = std::pow(static_cast<double>(k), -1.2) / zeta;
    EXPECT_NEAR(count[k] / static_cast<double>(n), p, 4 * std::sqrt(p * (1 - p) / n) + 1e-4)
        << "k = " << k;
  }
  EXPECT_EQ(count.begin()->first, 1);
}

TEST(CtrData, SyntheticRuleIsFixedAndBalanced) {
  CtrConfig c;
  c.vocab = 1001;
  SyntheticCtrData a(c, 2024, 7), b(c, 2024, 7), other(c, 2024, 8);
  FeedMap fa, fb, fo;
  a.Next(4096, &fa);
  b.Next(4096, &fb);
  other.Next(4096, &fo);
  EXPECT_EQ(testing::ToDouble(fa["ids"]), testing::ToDouble(fb["ids"]));
  EXPECT_EQ(testing::ToDouble(fa["label"]), testing::ToDouble(fb["label"]));
  EXPECT_NE(testing::ToDouble(fa["ids"]), testing::ToDouble(fo["ids"]));
  EXPECT_EQ(fa["ids"].dims(), DDim({4096, 26, 1}));
  EXPECT_EQ(fa["dense"].dims(), DDim({4096, 13}));
  double positives = 0;
  for (double y : testing::ToDouble(fa["label"])) positives += y;
  EXPECT_NEAR(positives / 4096, 0.5, 0.05);
  for (double id : testing::ToDouble(fa["ids"])) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, c.vocab);
  }
}

TEST(CtrData, AucOfBucketedScoresMatchesPairCounting) {
  AucCounter perfect, reversed, tied;
  for (int i = 0; i < 100; ++i) {
    perfect.Add(0.9, true);
    perfect.Add(0.1, false);
    reversed.Add(0.1, true);
    reversed.Add(0.9, false);
    tied.Add(0.5, i % 2 == 0);
  }
  EXPECT_DOUBLE_EQ(perfect.Auc(), 1.0);
  EXPECT_DOUBLE_EQ(reversed.Auc(), 0.0);
  EXPECT_DOUBLE_EQ(tied.Auc(), 0.5);
  // Random scores: the exact Mann-Whitney statistic, up to the buckets' resolution.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::pair<double, bool>> xs;
  AucCounter auc;
  for (int i = 0; i < 2000; ++i) {
    const bool pos = u(rng) < 0.4;
    const double s = pos ? std::sqrt(u(rng)) : u(rng);
    xs.push_back({s, pos});
    auc.Add(s, pos);
  }
  double pairs = 0, wins = 0;
  for (const auto& [sp, p] : xs)
    for (const auto& [sn, q] : xs)
      if (p && !q) {
        pairs += 1;
        wins += sp > sn ? 1 : sp == sn ? 0.5 : 0;
      }
  EXPECT_NEAR(auc.Auc(), wins / pairs, 2e-3);
  EXPECT_GT(auc.Auc(), 0.6);
}

TEST(CtrData, CriteoLinesParseAndBadOnesAreNamed) {
  const std::string dir = testing::MakeTempDir();
  const std::string good = dir + "/day.tsv";
  {
    std::ofstream f(good);
    std::string line = "1\t5\t-7\t\t3";
    for (int i = 4; i < 13; ++i) line += "\t1";
    for (int s = 0; s < 26; ++s) line += s == 3 ? "\t" : "\t68fd1e64";
    f << line << "\n";
    std::string zero = "0";
    for (int i = 0; i < 13; ++i) zero += "\t100000";
    for (int s = 0; s < 26; ++s) zero += "\tabc";
    f << zero << "\n";
  }
  CtrConfig c;
  c.vocab = 1000;
  CriteoData data(good, c, 0, 1);
  ASSERT_EQ(data.size(), 2);
  FeedMap feed;
  data.Next(3, &feed);  // wraps around
  const std::vector<double> label = testing::ToDouble(feed["label"]);
  EXPECT_EQ(label, (std::vector<double>{1, 0, 1}));
  const std::vector<double> dense = testing::ToDouble(feed["dense"]);
  EXPECT_FLOAT_EQ(dense[0], 5.0f / 20);  // I1 in [0, 20]
  EXPECT_FLOAT_EQ(dense[1], 0.0f);       // I2 = -7 clipped to its minimum -3
  EXPECT_FLOAT_EQ(dense[2], 0.0f);       // missing
  EXPECT_FLOAT_EQ(dense[13 + 4], 1.0f);  // 100000 clipped to I5's maximum 64000
  const std::vector<double> ids = testing::ToDouble(feed["ids"]);
  EXPECT_NE(ids[0], ids[1]) << "the same value in two slots hashes apart";
  EXPECT_EQ(ids[0], ids[2 * 26]) << "the third sample is the first again";
  CriteoData shard(good, c, 1, 2);
  EXPECT_EQ(shard.size(), 1);

  const std::string bad = dir + "/bad.tsv";
  {
    std::ofstream f(bad);
    f << "1\t2\t3\n";
  }
  ExpectErrorContainsAll(ErrorOf([&] { CriteoData d(bad, c, 0, 1); }),
                         {bad + ":1", "40 tab-separated", "got 3"});
  ExpectErrorContainsAll(ErrorOf([&] { CriteoData d(dir + "/none.tsv", c, 0, 1); }),
                         {"none.tsv", "cannot open"});
}

// 150 steps of batch 256 on a 2,000-row table: the AUC on held-out samples of the rule rises well
// above chance, and only the batches' rows of the table moved.
TEST(CtrModel, LearnsTheSyntheticRuleThroughItsSparseTable) {
  ModelConfig cfg;
  cfg.name = "ctr";
  cfg.seed = 5;
  cfg.ctr.vocab = 2000;
  cfg.batch_size = 256;
  TrainableModel m = BuildModel(cfg);
  EXPECT_NE(m.optimizer.find("lazy_mode"), std::string::npos) << m.optimizer;
  EXPECT_TRUE(m.main->global_block().FindVar(GradVarName("SparseFeatFactors"))->row_sparse());
  Executor exe;
  exe.Run(*m.startup);
  const Evaluation before = m.evaluate(exe);
  FeedMap feed;
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    m.next_batch(cfg.batch_size, &feed);
    const double loss = exe.Run(*m.main, feed, {m.loss})[0].item<double>();
    if (step < 10) first += loss / 10;
    if (step >= 140) last += loss / 10;
  }
  const Evaluation after = m.evaluate(exe);
  EXPECT_EQ(after.samples, 8 * 512);
  EXPECT_LT(last, first);
  std::printf("ctr: loss %.4f -> %.4f, test AUC %.4f -> %.4f, accuracy %.4f\n", first, last,
              before.auc, after.auc, after.accuracy);
  EXPECT_GT(after.auc, 0.70) << "before " << before.auc;
  EXPECT_GT(after.auc, before.auc + 0.1);
}

// CtrConfig::is_distributed: the table's initializer becomes per-row (row_seeded_random, U(-1,
// 1)); under the parameter-server pass the trainer holds no table (its lookup fetches rows) and
// each server holds a shard of it (listen_and_serv's TableVars), the dense layers as before.
TEST(CtrModel, DistributedTableLivesOnTheServersOnly) {
  ModelConfig cfg;
  cfg.name = "ctr";
  cfg.ctr.vocab = 1000001;
  cfg.ctr.is_distributed = true;
  TrainableModel m = BuildModel(cfg);
  bool row_seeded = false;
  for (const auto& op : m.startup->global_block().ops())
    row_seeded |= op->type() == "row_seeded_random" &&
                  op->Output("Out")[0] == "SparseFeatFactors" && op->Attr<float>("a") == -1.0f &&
                  op->Attr<float>("b") == 1.0f;
  EXPECT_TRUE(row_seeded);
  for (int index : {-1, 0}) {
    std::unique_ptr<Program> main = m.main->Clone(), startup = m.startup->Clone();
    transpiler::PsOptions o;
    o.nservers = 2;
    o.ntrainers = 2;
    o.server_index = index;
    o.worker_memory_mb = 16;  // the dense layers fit; the 38 MiB table would not
    transpiler::ParameterServerPass(o).Apply(*main, *startup);
    const Block& b = main->global_block();
    if (index < 0) {
      EXPECT_EQ(b.FindVar("SparseFeatFactors"), nullptr);
      EXPECT_EQ(startup->global_block().FindVar("SparseFeatFactors"), nullptr);
      bool fetches = false;
      for (const auto& op : b.ops()) fetches |= op->type() == "distributed_lookup_table";
      EXPECT_TRUE(fetches);
    } else {
      const OpDesc& serv = *b.op(b.num_ops() - 1);
      ASSERT_EQ(serv.type(), "listen_and_serv");
      EXPECT_EQ(serv.Output("TableVars")[0], "SparseFeatFactors");
    }
  }
  // The evaluation program, under the same plan: its lookup fetches rows too.
  const transpiler::PsPlan plan = transpiler::PlanParameterServer(*m.main, 2);
  std::unique_ptr<Program> test = m.test->Clone();
  transpiler::RewriteDistributedLookups(*test, plan, 2, 0);
  EXPECT_EQ(test->global_block().FindVar("SparseFeatFactors"), nullptr);
  int fetches = 0;
  for (const auto& op : test->global_block().ops()) {
    fetches += op->type() == "distributed_lookup_table";
    EXPECT_NE(op->type(), "lookup_table");
  }
  EXPECT_EQ(fetches, 1);
}

}  // namespace
}  // namespace models
}  // namespace keel
