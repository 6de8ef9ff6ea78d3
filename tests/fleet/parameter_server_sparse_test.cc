// Sparse embedding tables in parameter-server training, in real processes on loopback
// (tests/workers/ps_sparse_worker.cc under keel launch --server_num --worker_num):
// - is_sparse: the trainers send row-sparse gradients (each row to the server of its block), the
//   servers merge them row by row in trainer order, 1/N, and update those rows: 2 trainers x b
//   rows end where one process on 2b rows ends (SGD and lazy Adam, 1 and 2 servers), float
//   rounding only; async with one trainer is exact too, and two async trainers train.
// - is_distributed: the table lives on the servers only (rows id % S, created on first touch from
//   the per-row initializer): the rows the servers hold and the dense parameters equal one
//   process's (whose table is a dense is_sparse table of the same initial rows); a table of 10 M
//   rows that a trainer's memory budget refuses as is_sparse trains as is_distributed, with the
//   rows balanced over the servers and no trainer near the table's size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>

#include <unistd.h>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "tests/util/files.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

struct Job {
  std::string output;
  int exit_code = -1;
};

Job Launch(int servers, int trainers, const std::string& dir, const std::string& flags) {
  const std::string worker = BinPath("ps_sparse_worker") + " --out=" + dir + "/save" + flags;
  const std::string cmd =
      servers == 0 ? worker + " 2>&1"
                   : "FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=30 " + Keel() +
                         " launch --server_num=" + std::to_string(servers) +
                         " --worker_num=" + std::to_string(trainers) + " --log_dir=" + dir +
                         "/log " + worker + " 2>&1; rc=$?; tail -n 8 " + dir + "/log/*; exit $rc";
  CommandResult r = RunCommand(cmd);
  return {cmd + "\n" + r.output, r.exit_code};
}

std::map<std::string, std::vector<float>> Params(const std::string& dir) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : LoadSafetensors(dir + "/save/" + kPersistablesFile))
    out[name] = std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  return out;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

// Max difference over the parameters both hold (`expect` of them, by name).
double MaxDiff(const std::map<std::string, std::vector<float>>& got,
               const std::map<std::string, std::vector<float>>& ref, size_t expect) {
  EXPECT_EQ(got.size(), expect);
  double worst = 0;
  for (const auto& [name, r] : ref) {
    auto it = got.find(name);
    if (it == got.end()) continue;
    worst = std::max(worst, MaxDiff(it->second, r));
  }
  return worst;
}

void ExpectSparseSyncEqualsOneProcess(int servers, const std::string& optimizer) {
  SCOPED_TRACE(optimizer + " on " + std::to_string(servers) + " server(s)");
  const std::string dir = MakeTempDir();
  const std::string flags = " --table=sparse --optimizer=" + optimizer + " --rows=16 --steps=4";
  Job one = Launch(0, 1, dir + "/one", flags);
  Job ps = Launch(servers, 2, dir + "/ps", flags);
  Job none = Launch(0, 1, dir + "/none", " --table=sparse --steps=0");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  ASSERT_EQ(none.exit_code, 0) << none.output;
  const auto got = Params(dir + "/ps"), ref = Params(dir + "/one"), init = Params(dir + "/none");
  const double diff = MaxDiff(got, ref, 5);  // table, fc_0 w/b, fc_1 w/b
  std::printf(
      "is_sparse table, sync parameter server, %d server(s) x 2 trainers x 8 rows vs 1 process x "
      "16 rows, %s, 4 steps: max abs difference %.3g over the parameters (table %.3g)\n",
      servers, optimizer.c_str(), diff, MaxDiff(got.at("table"), ref.at("table")));
  EXPECT_LT(diff, 1e-5) << ps.output;
  // The table really trained (rows moved from their initial values).
  EXPECT_GT(MaxDiff(got.at("table"), init.at("table")), 1e-3);
  RunCommand("rm -rf " + dir);
}

TEST(ParameterServerSparse, SparseTableSyncTwoServersSgdEqualsOneProcess) {
  ExpectSparseSyncEqualsOneProcess(2, "sgd");
}

TEST(ParameterServerSparse, SparseTableSyncTwoServersLazyAdamEqualsOneProcess) {
  ExpectSparseSyncEqualsOneProcess(2, "adam");
}

TEST(ParameterServerSparse, SparseTableSyncOneServerLazyAdamEqualsOneProcess) {
  ExpectSparseSyncEqualsOneProcess(1, "adam");
}

// Trainer 0's checkpoint of an is_sparse table with lazy Adam holds what one process's holds: the
// table and its moments reassembled from both servers' blocks, the beta powers, the rate.
TEST(ParameterServerSparse, SparseTableCheckpointEqualsOneProcess) {
  const std::string dir = MakeTempDir();
  const std::string flags = " --table=sparse --optimizer=adam --rows=16 --steps=3 --checkpoint";
  Job one = Launch(0, 1, dir + "/one", flags);
  Job ps = Launch(2, 2, dir + "/ps", flags);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  const auto ref = Params(dir + "/one");
  const double diff = MaxDiff(Params(dir + "/ps"), ref, ref.size());
  std::printf(
      "is_sparse table checkpoint, 2 servers x 2 trainers, lazy adam, 3 steps: %zu vars, "
      "max abs difference %.3g\n",
      ref.size(), diff);
  EXPECT_EQ(ref.size(), 5u * 5 + 1);  // 5 x (param, 2 moments, 2 powers), the rate
  EXPECT_LT(diff, 1e-5) << ps.output;
  RunCommand("rm -rf " + dir);
}

// Trainer 0's checkpoint of an is_distributed table holds the rows the servers created, by id,
// with their lazy-Adam moments, and the rule the other rows start from (framework/io/checkpoint.h,
// StoredRows): what one process's checkpoint holds, whose table is whole. The stored rows are its
// rows, its other rows are still their initial values, and every other var matches.
TEST(ParameterServerSparse, DistributedTableCheckpointHoldsTheServersRowsAsOneProcessHasThem) {
  const std::string dir = MakeTempDir();
  const std::string flags =
      " --table=distributed --optimizer=adam --rows=16 --steps=3 --checkpoint --vocab=512";
  Job one = Launch(0, 1, dir + "/one", flags);
  Job ps = Launch(2, 2, dir + "/ps", flags);
  Job none = Launch(0, 1, dir + "/none",
                    " --table=distributed --optimizer=adam --steps=0 --checkpoint --vocab=512");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  ASSERT_EQ(none.exit_code, 0) << none.output;
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> got;
  for (auto& [name, t] : LoadSafetensors(dir + "/ps/save/" + kPersistablesFile, &meta))
    got[name] = t;
  const auto ref = Params(dir + "/one"), init = Params(dir + "/none");
  EXPECT_EQ(meta["keel.rows.table"].rfind("uniform -0.5 0.5 ", 0), 0u) << meta["keel.rows.table"];
  ASSERT_TRUE(got.count("table@ROWS.ids")) << ps.output;
  const Tensor& ids = got.at("table@ROWS.ids");
  const int64_t n = ids.numel(), D = 8;
  ASSERT_GT(n, 0);
  EXPECT_LT(n, 3 * 16 * 4 + 1);  // at most the ids of 3 steps of 16 samples x 4 slots
  std::vector<bool> stored(512, false);
  double worst = 0;
  for (const std::string var : {"table", "table_moment1_0", "table_moment2_0"}) {
    SCOPED_TRACE(var);
    ASSERT_TRUE(got.count(var + "@ROWS.values"));
    const Tensor& v = got.at(var + "@ROWS.values");
    ASSERT_EQ(v.dims(), DDim({n, D}));
    EXPECT_EQ(TensorBytes(got.at(var + "@ROWS.ids")), TensorBytes(ids));
    for (int64_t k = 0; k < n; ++k) {
      const int64_t id = ids.data<int64_t>()[k];
      ASSERT_TRUE(id >= 0 && id < 512 && (k == 0 || ids.data<int64_t>()[k - 1] < id));
      stored[id] = true;
      for (int64_t j = 0; j < D; ++j)
        worst = std::max(worst, std::abs(static_cast<double>(v.data<float>()[k * D + j]) -
                                         ref.at(var)[id * D + j]));
    }
  }
  // Rows no trainer touched: one process's are their initial values, as the rule makes them.
  int64_t untouched = 0;
  for (int64_t id = 0; id < 512; ++id) {
    if (stored[id]) continue;
    ++untouched;
    for (int64_t j = 0; j < D; ++j) {
      ASSERT_EQ(ref.at("table")[id * D + j], init.at("table")[id * D + j]) << id;
      ASSERT_EQ(ref.at("table_moment1_0")[id * D + j], 0.0f) << id;
    }
  }
  EXPECT_GT(untouched, 0);
  // Everything else (the dense layers, their moments, the beta powers, the rate) is whole.
  size_t others = 0;
  for (const auto& [name, r] : ref) {
    if (name.rfind("table", 0) == 0 && name.find("pow") == std::string::npos) continue;
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& t = got.at(name);
    worst = std::max(worst,
                     MaxDiff(std::vector<float>(t.data<float>(), t.data<float>() + t.numel()), r));
    ++others;
  }
  EXPECT_EQ(others, ref.size() - 3);
  std::printf(
      "is_distributed table checkpoint, 2 servers x 2 trainers vs 1 process, lazy adam, 3 steps: "
      "%lld stored rows of 512, max abs difference %.3g\n",
      static_cast<long long>(n), worst);
  EXPECT_LT(worst, 1e-5);
  RunCommand("rm -rf " + dir);
}

// Async with one trainer and no communicator (send_queue_size=0: the trainer pushes and pulls in
// each step) applies its steps in order: exactly one process's run. Two async trainers with the
// communicator train too (every row gradient applied once, in arrival order).
TEST(ParameterServerSparse, SparseTableAsyncOneTrainerEqualsOneProcessAndTwoTrainersTrain) {
  const std::string dir = MakeTempDir();
  const std::string flags = " --table=sparse --optimizer=adam --rows=8 --steps=4";
  Job one = Launch(0, 1, dir + "/one", flags);
  Job ps = Launch(2, 1, dir + "/ps", flags + " --mode=async --send_queue_size=0");
  Job two = Launch(2, 2, dir + "/two",
                   " --table=sparse --optimizer=adam --rows=16 --steps=4 "
                   "--mode=async");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const double diff = MaxDiff(Params(dir + "/ps"), Params(dir + "/one"), 5);
  std::printf(
      "is_sparse table, async parameter server, 2 servers x 1 trainer vs 1 process, lazy adam, 4 "
      "steps: max abs difference %.3g\n",
      diff);
  EXPECT_LT(diff, 1e-5) << ps.output;
  RunCommand("rm -rf " + dir);
}

// "server S holds N rows of table" lines, by server.
std::vector<long> ServerRowsOf(const std::string& output) {
  std::vector<long> n;
  const std::regex re("server (\\d+) holds (\\d+) rows of table");
  std::map<int, long> by;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it)
    by[std::stoi((*it)[1])] = std::stol((*it)[2]);
  for (const auto& kv : by) n.push_back(kv.second);
  return n;
}

// Rows of a distributed table: id -> values, from the servers' rows.bin files.
std::map<int64_t, std::vector<float>> Rows(const std::string& save, int servers, int64_t dim) {
  std::map<int64_t, std::vector<float>> rows;
  for (int s = 0; s < servers; ++s) {
    const std::string file = save + "/server" + std::to_string(s) + "/rows.bin";
    FILE* f = std::fopen(file.c_str(), "rb");
    EXPECT_NE(f, nullptr) << file;
    if (f == nullptr) continue;
    int64_t n = 0;
    EXPECT_EQ(std::fread(&n, sizeof(n), 1, f), 1u);
    for (int64_t r = 0; r < n; ++r) {
      int64_t id = 0;
      std::vector<float> v(static_cast<size_t>(dim));
      EXPECT_EQ(std::fread(&id, sizeof(id), 1, f), 1u);
      EXPECT_EQ(std::fread(v.data(), sizeof(float), dim, f), static_cast<size_t>(dim));
      EXPECT_TRUE(rows.emplace(id, v).second) << "id " << id << " on two servers";
      if (servers > 1) {
        EXPECT_EQ(id % servers, s) << "id " << id << " on server " << s;
      }
    }
    std::fclose(f);
  }
  return rows;
}

// A job of 2 servers and 2 trainers on two "nodes", the loopback addresses 127.0.0.1 and
// 127.0.0.2, each with a server and a trainer: one `keel launch --servers --workers` per node.
Job LaunchTwoNodes(const std::string& dir, const std::string& flags) {
  const std::string servers =
      "127.0.0.1:" + std::to_string(FreePort()) + ",127.0.0.2:" + std::to_string(FreePort());
  const std::string workers =
      "127.0.0.1:" + std::to_string(FreePort()) + ",127.0.0.2:" + std::to_string(FreePort());
  const std::string worker = BinPath("ps_sparse_worker") + " --out=" + dir + "/save" + flags;
  auto node = [&](const std::string& ip, const std::string& name) {
    return Keel() + " launch --servers=" + servers + " --workers=" + workers + " --node_ip=" + ip +
           " --log_dir=" + dir + "/log" + name + " " + worker + " > " + dir + "/" + name +
           ".txt 2>&1";
  };
  const std::string cmd = "mkdir -p " + dir +
                          " && export KEEL_JOB_TOKEN=two-nodes FLAGS_cpu_math_threads=1 "
                          "FLAGS_comm_timeout_s=30; (" +
                          node("127.0.0.2", "b") + ") & " + node("127.0.0.1", "a") +
                          "; a=$?; wait $!; b=$?; cat " + dir + "/a.txt " + dir +
                          "/b.txt; tail -n 8 " + dir + "/log*/*; exit $((a || b))";
  CommandResult r = RunCommand(cmd);
  return {cmd + "\n" + r.output, r.exit_code};
}

void ExpectDistributedEqualsOneProcess(int servers, const std::string& mode,
                                       const std::string& optimizer, const std::string& extra = "",
                                       bool two_nodes = false) {
  SCOPED_TRACE(optimizer + " on " + std::to_string(servers) + " server(s), " + mode + extra +
               (two_nodes ? " on two nodes" : ""));
  const std::string dir = MakeTempDir();
  const int trainers = mode == "async" ? 1 : 2;
  const std::string flags = " --table=distributed --optimizer=" + optimizer +
                            " --rows=16 --steps=4 --mode=" + mode + extra;
  const size_t vocab_at = extra.find("--vocab=");
  const size_t vocab =
      vocab_at == std::string::npos ? 2048 : std::stoul(extra.substr(vocab_at + 8));
  Job one = Launch(0, 1, dir + "/one", flags);
  // Async: one trainer without a communicator (send_queue_size=0) is exact.
  Job ps = two_nodes ? LaunchTwoNodes(dir + "/ps", flags)
                     : Launch(servers, trainers, dir + "/ps",
                              flags + (mode == "async" ? " --send_queue_size=0" : ""));
  Job none = Launch(0, 1, dir + "/none",
                    " --table=distributed --steps=0 --vocab=" + std::to_string(vocab));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  ASSERT_EQ(none.exit_code, 0) << none.output;
  // The trainer holds no table: only fc_0 and fc_1.
  const double dense = MaxDiff(Params(dir + "/ps"), Params(dir + "/one"), 4);
  const auto got = Rows(dir + "/ps/save", servers, 8);
  const auto ref = Rows(dir + "/one/save", 1, 8);
  const auto init = Rows(dir + "/none/save", 1, 8);
  ASSERT_EQ(ref.size(), vocab);
  double rows = 0, moved = 0;
  for (const auto& [id, v] : got) rows = std::max(rows, MaxDiff(v, ref.at(id)));
  // Every row the servers never created is still at its initial value in one process.
  size_t untouched = 0;
  for (const auto& [id, v] : ref) {
    moved = std::max(moved, MaxDiff(v, init.at(id)));
    if (got.count(id) == 0) {
      ++untouched;
      EXPECT_EQ(MaxDiff(v, init.at(id)), 0) << "row " << id;
    }
  }
  std::printf(
      "is_distributed table, %s parameter server, %d server(s) x %d trainer(s) vs 1 process "
      "(dense is_sparse table of the same initial rows), %s, 4 steps: %zu rows on the servers, "
      "max abs difference %.3g over them, %.3g over the dense parameters\n",
      mode.c_str(), servers, trainers, optimizer.c_str(), got.size(), rows, dense);
  EXPECT_GT(got.size(), 10u);
  EXPECT_GT(untouched, 0u);
  EXPECT_GT(moved, 1e-3);
  EXPECT_LT(rows, 1e-5) << ps.output;
  EXPECT_LT(dense, 1e-5) << ps.output;
  RunCommand("rm -rf " + dir);
}

TEST(ParameterServerSparse, DistributedTableSyncTwoServersSgdEqualsOneProcess) {
  ExpectDistributedEqualsOneProcess(2, "sync", "sgd");
}

TEST(ParameterServerSparse, DistributedTableSyncTwoServersLazyAdamEqualsOneProcess) {
  ExpectDistributedEqualsOneProcess(2, "sync", "adam");
}

// One table looked up twice (2 slots each, as Paddle's Fluid CTR model looks each slot up): each
// lookup fetches its rows, backward sums the two row-sparse gradients, the table is pushed once.
TEST(ParameterServerSparse, DistributedTableLookedUpTwiceEqualsOneProcess) {
  ExpectDistributedEqualsOneProcess(2, "sync", "adam", " --lookups=2");
  ExpectDistributedEqualsOneProcess(2, "async", "adam", " --lookups=2");
}

// keel launch --servers/--workers on two nodes (two loopback addresses of this machine): server 0
// and trainer 0 on one, server 1 and trainer 1 on the other; the job equals one process.
TEST(ParameterServerSparse, TwoNodeLaunchWithServersAndWorkersListsEqualsOneProcess) {
  ExpectDistributedEqualsOneProcess(2, "sync", "adam", "", /*two_nodes=*/true);
}

TEST(ParameterServerSparse, DistributedTableSyncOneServerSgdEqualsOneProcess) {
  ExpectDistributedEqualsOneProcess(1, "sync", "sgd");
}

// A lookup's request carries its ids in the header's message up to ps::kInlineIds (8192) and
// sends them after it beyond: 2600 rows x 4 uniform ids of 40000 per trainer are about 9100
// distinct ids for its one server, which go the long way; the job still equals one process.
TEST(ParameterServerSparse, DistributedTableRequestsOfMoreIdsThanInlineEqualOneProcess) {
  ExpectDistributedEqualsOneProcess(1, "sync", "adam", " --rows=5200 --vocab=40000 --uniform_ids");
}

TEST(ParameterServerSparse, DistributedTableAsyncOneTrainerLazyAdamEqualsOneProcess) {
  ExpectDistributedEqualsOneProcess(2, "async", "adam");
}

// Two async trainers fetch and push rows of a distributed table while the servers serve them in
// arrival order (prefetches between steps, no cycle between two servers); every row a trainer
// touched exists on its server. And GEO with an is_sparse table: the trainers' local lazy Adam
// updates rows, the exchanges move the whole table (dense deltas).
TEST(ParameterServerSparse, DistributedTableAsyncTwoTrainersAndSparseTableGeoTrain) {
  const std::string dir = MakeTempDir();
  Job async = Launch(2, 2, dir + "/async",
                     " --table=distributed --optimizer=adam --rows=16 --steps=6 --mode=async");
  ASSERT_EQ(async.exit_code, 0) << async.output;
  const std::vector<long> rows = ServerRowsOf(async.output);
  ASSERT_EQ(rows.size(), 2u) << async.output;
  EXPECT_GT(rows[0] + rows[1], 100) << async.output;
  Job geo = Launch(2, 2, dir + "/geo",
                   " --table=sparse --optimizer=adam --rows=16 --steps=6 --mode=geo --geo_k=2");
  EXPECT_EQ(geo.exit_code, 0) << geo.output;
  RunCommand("rm -rf " + dir);
}

// A 10 M x 8 table (305 MiB) against a trainer budget of 64 MiB: as is_sparse every trainer
// would hold it and is refused naming the table and the setting; as is_distributed it trains,
// the trainers' peak memory far below the table, the servers' rows balanced within 10 %.
TEST(ParameterServerSparse, TenMillionRowTableTrainsOnlyOnTheServers) {
  const std::string dir = MakeTempDir();
  const std::string big = " --vocab=10000000 --dim=8 --worker_memory_mb=64 --uniform_ids";
  Job refused = Launch(2, 2, dir + "/refused", " --table=sparse --steps=1" + big);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("ps_worker_memory_mb=64"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("the largest is table [10000000, 8]"), std::string::npos)
      << refused.output;
  Job ok = Launch(2, 2, dir + "/ok", " --table=distributed --rows=512 --steps=5" + big);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  const std::vector<long> rows = ServerRowsOf(ok.output);
  ASSERT_EQ(rows.size(), 2u) << ok.output;
  const double mean = (rows[0] + rows[1]) / 2.0;
  std::printf(
      "10 M x 8 distributed table, 2 servers x 2 trainers, 5 steps of 512 x 4 ids: %ld and "
      "%ld rows on the servers (%.1f %% apart)\n",
      rows[0], rows[1], 100.0 * std::abs(rows[0] - rows[1]) / mean);
  EXPECT_GT(mean, 4000);
  EXPECT_LT(std::abs(rows[0] - rows[1]), 0.1 * mean) << ok.output;
  // Trainer 0's peak resident memory: far below the 305 MiB table.
  const std::regex re("trainer 0 trained 5 steps, VmHWM ([0-9.]+) MB");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(ok.output, m, re)) << ok.output;
  std::printf("trainer 0 peak resident memory: %s MB\n", m[1].str().c_str());
  EXPECT_LT(std::stod(m[1]), 200) << ok.output;
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
