// `keel launch` end to end with shell commands as workers: the environment each worker sees
// (Paddle's and torchrun's variables), logs and console, pass-through of the command's flags,
// failure propagation (exit code, SIGKILL, exec failure), signal forwarding, and flag checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/util/files.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

// Each worker prints one line of its environment.
const char* kEnvScript =
    "'echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK lws=$LOCAL_WORLD_SIZE "
    "pt=$PADDLE_TRAINER_ID pn=$PADDLE_TRAINERS_NUM cur=$PADDLE_CURRENT_ENDPOINT "
    "eps=$PADDLE_TRAINER_ENDPOINTS master=$MASTER_ADDR:$MASTER_PORT tok=$KEEL_JOB_TOKEN "
    "gpu=${FLAGS_selected_gpus-unset} threads=$FLAGS_cpu_math_threads'";

// "k1=v1 k2=v2 ..." (the first line of `text` containing "rank=") -> {k1: v1, ...}.
std::map<std::string, std::string> EnvLine(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("rank=", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      size_t eq = w.find('=');
      if (eq != std::string::npos) kv[w.substr(0, eq)] = w.substr(eq + 1);
    }
    break;
  }
  return kv;
}

struct Timed {
  CommandResult result;
  double seconds;
};

Timed RunTimed(const std::string& cmd) {
  auto t0 = std::chrono::steady_clock::now();
  CommandResult r = RunCommand(cmd);
  return {r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

TEST(KeelLaunch, EveryWorkerSeesItsRankInBothConventions) {
  std::string dir = MakeTempDir();
  // stderr (the launcher's own lines) dropped: stdout is rank 0's output only.
  auto r = RunCommand("env -u KEEL_JOB_TOKEN -u FLAGS_cpu_math_threads -u FLAGS_selected_gpus " +
                      Keel() + " launch --nproc_per_node=3 --log_dir=" + dir + " sh -c " +
                      kEnvScript + " 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::map<std::string, std::string>> env;
  for (int i = 0; i < 3; ++i) {
    env.push_back(EnvLine(ReadText(dir + "/workerlog." + std::to_string(i))));
    ASSERT_FALSE(env[i].empty()) << "workerlog." << i;
  }
  std::string eps = env[0]["eps"];
  std::vector<std::string> endpoints;
  std::istringstream split(eps);
  for (std::string ep; std::getline(split, ep, ',');) endpoints.push_back(ep);
  ASSERT_EQ(endpoints.size(), 3u) << eps;
  std::set<std::string> distinct(endpoints.begin(), endpoints.end());
  EXPECT_EQ(distinct.size(), 3u) << "ports must differ: " << eps;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("local rank " + std::to_string(i));
    std::string s = std::to_string(i);
    EXPECT_EQ(env[i]["rank"], s);
    EXPECT_EQ(env[i]["pt"], s);
    EXPECT_EQ(env[i]["local"], s);
    EXPECT_EQ(env[i]["world"], "3");
    EXPECT_EQ(env[i]["pn"], "3");
    EXPECT_EQ(env[i]["lws"], "3");
    EXPECT_EQ(env[i]["eps"], eps);
    EXPECT_EQ(env[i]["cur"], endpoints[i]);
    EXPECT_EQ(env[i]["master"], endpoints[0]);  // rank 0 serves the rendezvous store
    EXPECT_EQ(env[i]["tok"], env[0]["tok"]);
    EXPECT_EQ(env[i]["gpu"], "unset");  // CPU mode
    EXPECT_GE(std::stoi(env[i]["threads"]), 1);
  }
  EXPECT_EQ(endpoints[0].rfind("127.0.0.1:", 0), 0u) << eps;
  EXPECT_GE(env[0]["tok"].size(), 16u);
  EXPECT_EQ(env[0]["tok"].find_first_not_of("0123456789abcdef"), std::string::npos);
  // The console carries rank 0's line, and only its.
  EXPECT_EQ(EnvLine(r.output), env[0]) << r.output;
  EXPECT_FALSE(Contains(r.output, "rank=1 ")) << r.output;

  // A second job draws a fresh token; a token in the environment is reused.
  auto again = RunCommand("env -u KEEL_JOB_TOKEN " + Keel() + " launch --log_dir=" + dir +
                          " sh -c " + kEnvScript + " 2>/dev/null");
  EXPECT_NE(EnvLine(again.output)["tok"], env[0]["tok"]);
  auto given = RunCommand("KEEL_JOB_TOKEN=feedbeef " + Keel() + " launch --log_dir=" + dir +
                          " sh -c " + kEnvScript + " 2>/dev/null");
  EXPECT_EQ(EnvLine(given.output)["tok"], "feedbeef");
  // FLAGS_cpu_math_threads from the environment is kept.
  auto threads = RunCommand("FLAGS_cpu_math_threads=7 " + Keel() + " launch --nproc_per_node=2" +
                            " --log_dir=" + dir + " sh -c " + kEnvScript + " 2>/dev/null");
  EXPECT_EQ(EnvLine(threads.output)["threads"], "7") << threads.output;
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, ArgumentsAfterTheCommandPassThroughUntouched) {
  std::string dir = MakeTempDir();
  // --nproc_per_node and --steps after the command belong to the worker, not to keel.
  auto r = RunCommand(Keel() + " launch --log_dir " + dir +
                      " sh -c 'echo \"args:$*\"' sh "
                      "--steps=5 --nproc_per_node=7 'a b' -x");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "args:--steps=5 --nproc_per_node=7 a b -x")) << r.output;
  EXPECT_FALSE(std::ifstream(dir + "/workerlog.1").good()) << "one worker expected";
  // `--` ends the launcher's flags.
  auto dashes = RunCommand(Keel() + " launch --nproc_per_node 2 --log_dir=" + dir +
                           " -- sh -c 'echo \"args:$*\"' sh --steps=5");
  ASSERT_EQ(dashes.exit_code, 0) << dashes.output;
  EXPECT_TRUE(Contains(dashes.output, "args:--steps=5")) << dashes.output;
  EXPECT_TRUE(Contains(ReadText(dir + "/workerlog.1"), "args:--steps=5"));
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, Rank0OutputReachesConsoleAndLogWhole) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Keel() + " launch --nproc_per_node=2 --log_dir=" + dir +
                      " sh -c 'seq 1 100000; echo done-$RANK >&2' 2>/dev/null | wc -l");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(std::stoi(r.output), 100001) << r.output;
  std::string log0 = ReadText(dir + "/workerlog.0");
  EXPECT_EQ(std::count(log0.begin(), log0.end(), '\n'), 100001);
  EXPECT_TRUE(Contains(log0, "\n99999\n100000\ndone-0\n"));
  EXPECT_TRUE(Contains(ReadText(dir + "/workerlog.1"), "done-1"));
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, GpuModeGivesEachWorkerOneGpu) {
  std::string dir = MakeTempDir();
  auto r = RunCommand("env -u CUDA_VISIBLE_DEVICES " + Keel() +
                      " launch --selected_gpus=2,5 --log_dir=" + dir + " sh -c " + kEnvScript);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto w0 = EnvLine(ReadText(dir + "/workerlog.0")), w1 = EnvLine(ReadText(dir + "/workerlog.1"));
  EXPECT_EQ(w0["gpu"], "2");
  EXPECT_EQ(w1["gpu"], "5");
  EXPECT_EQ(w1["world"], "2");  // --nproc_per_node defaults to the number of GPUs
  // With CUDA_VISIBLE_DEVICES, as in Paddle, a worker gets its GPU's index among the visible.
  auto v = RunCommand("CUDA_VISIBLE_DEVICES=4,5,6 " + Keel() +
                      " launch --selected_gpus=6,4 --log_dir=" + dir + " sh -c " + kEnvScript);
  ASSERT_EQ(v.exit_code, 0) << v.output;
  EXPECT_EQ(EnvLine(ReadText(dir + "/workerlog.0"))["gpu"], "2");
  EXPECT_EQ(EnvLine(ReadText(dir + "/workerlog.1"))["gpu"], "0");
  // Host-staged collectives let two ranks share a GPU; the backend reaches the workers.
  auto h =
      RunCommand("env -u CUDA_VISIBLE_DEVICES " + Keel() +
                 " launch --selected_gpus=3,3 --gpu_comm_backend=host --log_dir=" + dir +
                 " sh -c 'echo backend=$FLAGS_gpu_comm_backend; " + std::string(kEnvScript + 1));
  ASSERT_EQ(h.exit_code, 0) << h.output;
  for (const char* log : {"/workerlog.0", "/workerlog.1"}) {
    const std::string text = ReadText(dir + log);
    EXPECT_EQ(EnvLine(text)["gpu"], "3") << text;
    EXPECT_TRUE(Contains(text, "backend=host")) << text;
  }
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, MultiNodeRanksAndEndpoints) {
  std::string dir = MakeTempDir();
  auto r = RunCommand("KEEL_JOB_TOKEN=0123abcd " + Keel() +
                      " launch --nnodes=2 --node_rank=1 --cluster_node_ips=127.0.0.1,127.0.0.2 "
                      "--node_ip=127.0.0.2 --nproc_per_node=2 --started_port=7000 --log_dir=" +
                      dir + " sh -c " + kEnvScript);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string eps = "127.0.0.1:7000,127.0.0.1:7001,127.0.0.2:7000,127.0.0.2:7001";
  for (int local = 0; local < 2; ++local) {
    SCOPED_TRACE("local rank " + std::to_string(local));
    auto w = EnvLine(ReadText(dir + "/workerlog." + std::to_string(local)));
    EXPECT_EQ(w["rank"], std::to_string(2 + local));
    EXPECT_EQ(w["pt"], std::to_string(2 + local));
    EXPECT_EQ(w["local"], std::to_string(local));
    EXPECT_EQ(w["world"], "4");
    EXPECT_EQ(w["lws"], "2");
    EXPECT_EQ(w["eps"], eps);
    EXPECT_EQ(w["cur"], "127.0.0.2:" + std::to_string(7000 + local));
    EXPECT_EQ(w["master"], "127.0.0.1:7000");
    EXPECT_EQ(w["tok"], "0123abcd");
  }
  // --node_ip alone says which node this is.
  auto by_ip = RunCommand("KEEL_JOB_TOKEN=t " + Keel() +
                          " launch --cluster_node_ips=127.0.0.1,127.0.0.2 --node_ip=127.0.0.2 "
                          "--started_port=7100 --log_dir=" +
                          dir + " sh -c " + kEnvScript);
  ASSERT_EQ(by_ip.exit_code, 0) << by_ip.output;
  auto w = EnvLine(ReadText(dir + "/workerlog.0"));
  EXPECT_EQ(w["rank"], "1");
  EXPECT_EQ(w["eps"], "127.0.0.1:7100,127.0.0.2:7100");
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, FailingWorkerStopsTheOthersAndIsNamed) {
  std::string dir = MakeTempDir();
  auto t = RunTimed(Keel() + " launch --nproc_per_node=3 --log_dir=" + dir +
                    " sh -c 'if [ $RANK = 1 ]; then echo first-line; echo boom-$RANK >&2; "
                    "exit 3; fi; sleep 30'");
  EXPECT_NE(t.result.exit_code, 0) << t.result.output;
  EXPECT_FALSE(t.result.signaled) << t.result.output;
  EXPECT_LT(t.seconds, 10.0) << "the sleeping workers were not stopped";
  EXPECT_TRUE(Contains(t.result.output, "worker rank 1 (local 1, pid ")) << t.result.output;
  EXPECT_TRUE(Contains(t.result.output, "exited with code 3")) << t.result.output;
  EXPECT_TRUE(Contains(t.result.output, "first-line\nboom-1\n")) << t.result.output;
  RunCommand("rm -rf " + dir);
}

// Ranks that fail together (a decision they all take, such as finding no readable checkpoint)
// learn it a moment apart: the launcher lets the others end by themselves for a moment before
// SIGTERM, so each one's reason reaches its log. Rank 0 here fails 0.2 s after rank 1; a launcher
// that signalled at once would stop it before it said why.
TEST(KeelLaunch, PeersFailingWithTheFirstSayWhyBeforeTheyAreStopped) {
  std::string dir = MakeTempDir();
  auto t = RunTimed(Keel() + " launch --nproc_per_node=2 --log_dir=" + dir +
                    " sh -c 'if [ $RANK = 1 ]; then exit 3; fi; sleep 0.2; "
                    "echo rank0-says-why; exit 4'");
  EXPECT_NE(t.result.exit_code, 0) << t.result.output;
  EXPECT_TRUE(Contains(t.result.output, "exited with code 3")) << t.result.output;
  EXPECT_TRUE(Contains(ReadText(dir + "/workerlog.0"), "rank0-says-why")) << t.result.output;
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, KillNineOfOneWorkerEndsTheJobNamingIt) {
  std::string dir = MakeTempDir();
  auto t = RunTimed(Keel() + " launch --nproc_per_node=3 --log_dir=" + dir +
                    " sh -c 'if [ $RANK = 1 ]; then sleep 0.3; kill -9 $$; fi; sleep 30'");
  EXPECT_NE(t.result.exit_code, 0) << t.result.output;
  EXPECT_LT(t.seconds, 10.0);
  EXPECT_TRUE(Contains(t.result.output, "worker rank 1 (local 1, pid ")) << t.result.output;
  EXPECT_TRUE(Contains(t.result.output, "was killed by signal SIGKILL (9)")) << t.result.output;
  RunCommand("rm -rf " + dir);
}

// A killed worker's peer often fails at the same instant (EPIPE in a collective) and can be
// reaped first. The launcher is stopped while rank 1 is killed and rank 0 then exits with an
// error, so both deaths wait in one batch, rank 0's first in waitpid order: the report must still
// name rank 1's SIGKILL as the cause and rank 0's exit as its consequence.
TEST(KeelLaunch, KilledWorkerIsTheRootCauseEvenWhenAPeerIsReapedFirst) {
  std::string dir = MakeTempDir();
  std::string script =
      "export D=" + dir + "\n" + Keel() +
      " launch --nproc_per_node=2 --log_dir=$D sh -c 'echo $$ > $D/pid.$RANK; "
      "if [ $RANK = 0 ]; then while [ ! -e $D/go ]; do sleep 0.02; done; "
      "echo peer-gone >&2; exit 1; fi; sleep 30' > $D/out.txt 2>&1 &\n"
      "L=$!\n"
      "for i in $(seq 100); do [ -s $D/pid.0 ] && [ -s $D/pid.1 ] && break; sleep 0.1; done\n"
      "kill -STOP $L\n"
      "kill -9 $(cat $D/pid.1)\n"
      "touch $D/go\n"
      "p0=$(cat $D/pid.0)\n"
      "for i in $(seq 200); do grep -q '^State:.*Z' /proc/$p0/status 2>/dev/null && break; "
      "sleep 0.02; done\n"
      "kill -CONT $L; wait $L; echo launcher_rc=$?\n"
      "cat $D/out.txt\n";
  auto t = RunTimed(script);
  const std::string& out = t.result.output;
  EXPECT_LT(t.seconds, 10.0) << out;
  EXPECT_TRUE(Contains(out, "launcher_rc=137")) << out;  // 128 + SIGKILL: the cause's status
  EXPECT_TRUE(Contains(out, "worker rank 1 (local 1, pid ")) << out;
  EXPECT_TRUE(Contains(out, "was killed by signal SIGKILL (9)")) << out;
  EXPECT_TRUE(Contains(out, "worker rank 0 (local 0) failed too (exited with code 1)")) << out;
  RunCommand("rm -rf " + dir);
}

std::string Trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \n"), e = s.find_last_not_of(" \n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// --cpu_sched: the workers' scheduling policy (field 41 of /proc/PID/stat: 0 SCHED_OTHER, 3
// SCHED_BATCH), inherited by what they start.
TEST(KeelLaunch, CpuSchedPutsTheWorkersUnderSchedBatch) {
  const std::string policy = " sh -c 'cut -d\" \" -f41 /proc/self/stat' 2>/dev/null";
  const std::string env = "env -u KEEL_JOB_TOKEN -u FLAGS_cpu_math_threads ";
  auto r = RunCommand(env + Keel() + " launch --nproc_per_node=1 --cpu_sched=batch" + policy);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Trimmed(r.output), "3") << r.output;
  r = RunCommand(env + Keel() + " launch --nproc_per_node=1" + policy);
  EXPECT_EQ(Trimmed(r.output), "0") << r.output;  // auto: a collective job runs as launched
  r = RunCommand(env + Keel() + " launch --server_num=1 --worker_num=1" + policy);
  EXPECT_EQ(Trimmed(r.output), "3") << r.output;  // auto: a parameter-server job
  r = RunCommand(env + Keel() + " launch --server_num=1 --worker_num=1 --cpu_sched=normal" +
                 policy);
  EXPECT_EQ(Trimmed(r.output), "0") << r.output;
}

// The CPU ids of a /proc/PID/status Cpus_allowed_list line in `text` ("0-3,6"); empty if none.
std::vector<int> AllowedCpus(const std::string& text) {
  const std::string key = "Cpus_allowed_list:";
  const size_t at = text.find(key);
  if (at == std::string::npos) return {};
  std::istringstream list(text.substr(at + key.size(), text.find('\n', at) - at - key.size()));
  std::vector<int> cpus;
  std::string range;
  while (std::getline(list, range, ',')) {
    const size_t dash = range.find('-');
    const int lo = std::stoi(range),
              hi = dash == std::string::npos ? lo : std::stoi(range.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

// --cpu_bind=cores: each worker runs on its own run of the launcher's CPUs, and what it starts
// inherits them; the default (none) leaves every worker the launcher's.
TEST(KeelLaunch, CpuBindGivesEachWorkerItsOwnCpus) {
  const std::vector<int> mine = AllowedCpus(ReadText("/proc/self/status"));
  if (mine.size() < 2) GTEST_SKIP() << "needs 2 CPUs, this test may run on " << mine.size();
  const std::string env = "env -u KEEL_JOB_TOKEN -u FLAGS_cpu_math_threads ";
  const std::string show = " sh -c 'grep Cpus_allowed_list /proc/self/status' > /dev/null 2>&1";
  for (const std::string bind : {"cores", "none"}) {
    SCOPED_TRACE(bind);
    std::string dir = MakeTempDir();
    auto r = RunCommand(env + Keel() + " launch --nproc_per_node=2 --cpu_bind=" + bind +
                        " --log_dir=" + dir + show);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<int> w0 = AllowedCpus(ReadText(dir + "/workerlog.0"));
    const std::vector<int> w1 = AllowedCpus(ReadText(dir + "/workerlog.1"));
    const size_t half = mine.size() / 2;
    if (bind == "cores") {
      EXPECT_EQ(w0, std::vector<int>(mine.begin(), mine.begin() + half));
      EXPECT_EQ(w1, std::vector<int>(mine.begin() + half, mine.end()));
    } else {
      EXPECT_EQ(w0, mine);
      EXPECT_EQ(w1, mine);
    }
    RunCommand("rm -rf " + dir);
  }
}

TEST(KeelLaunch, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  std::string dir = MakeTempDir();
  auto t = RunTimed(Keel() + " launch --nproc_per_node=2 --grace_period_s=1 --log_dir=" + dir +
                    " sh -c 'if [ $RANK = 0 ]; then while [ ! -e " + dir +
                    "/trapped ]; do sleep 0.05; done; exit 5; fi; trap \"\" TERM; touch " + dir +
                    "/trapped; sleep 30'");
  EXPECT_EQ(t.result.exit_code, 5) << t.result.output;
  EXPECT_LT(t.seconds, 8.0);
  EXPECT_GE(t.seconds, 0.9);
  EXPECT_TRUE(Contains(t.result.output, "worker rank 0 (local 0, pid ")) << t.result.output;
  EXPECT_TRUE(Contains(t.result.output, "killing them")) << t.result.output;
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, SigtermToTheLauncherStopsEveryWorkerAndItsChildren) {
  std::string dir = MakeTempDir();
  // Each worker records its own pid and its child's, then waits.
  std::string script =
      "export D=" + dir + "\n" + Keel() +
      " launch --nproc_per_node=3 --log_dir=$D sh -c "
      "'sleep 30 & echo $! > $D/child.$RANK; echo $$ > $D/pid.$RANK; wait' &\n"
      "L=$!\n"
      "for i in $(seq 100); do\n"
      "  [ -s $D/pid.0 ] && [ -s $D/pid.1 ] && [ -s $D/pid.2 ] && break\n"
      "  sleep 0.1\n"
      "done\n"
      "kill -TERM $L; wait $L; echo launcher_rc=$?\n"
      "for f in $D/pid.* $D/child.*; do p=$(cat $f)\n"
      "  if kill -0 $p 2>/dev/null; then echo alive $f; kill -9 $p; else echo gone $f; fi\n"
      "done\n";
  auto t = RunTimed(script);
  EXPECT_LT(t.seconds, 10.0) << t.result.output;
  EXPECT_TRUE(Contains(t.result.output, "launcher_rc=143")) << t.result.output;  // 128 + SIGTERM
  EXPECT_TRUE(Contains(t.result.output, "got SIGTERM")) << t.result.output;
  EXPECT_FALSE(Contains(t.result.output, "alive")) << t.result.output;
  int gone = 0;
  for (size_t p = t.result.output.find("gone "); p != std::string::npos;
       p = t.result.output.find("gone ", p + 1))
    ++gone;
  EXPECT_EQ(gone, 6) << t.result.output;
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, WorkersDieWithAKilledLauncher) {
  std::string dir = MakeTempDir();
  // kill -9 leaves the launcher no chance to stop anyone: PR_SET_PDEATHSIG does. A dead worker
  // may linger as a zombie of init, so a process counts as gone when it is one.
  std::string script =
      "export D=" + dir + "\n" + Keel() +
      " launch --nproc_per_node=2 --log_dir=$D sh -c 'echo $$ > $D/pid.$RANK; exec sleep 30' &\n"
      "L=$!\n"
      "for i in $(seq 100); do [ -s $D/pid.0 ] && [ -s $D/pid.1 ] && break; sleep 0.1; done\n"
      "kill -9 $L; wait $L; sleep 0.3\n"
      "for f in $D/pid.*; do p=$(cat $f)\n"
      "  if [ -e /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status; then\n"
      "    echo alive $f; kill -9 $p\n"
      "  else echo gone $f; fi\n"
      "done\n";
  auto r = RunCommand(script);
  EXPECT_FALSE(Contains(r.output, "alive")) << r.output;
  EXPECT_TRUE(Contains(r.output, "gone " + dir + "/pid.1")) << r.output;
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, UnrunnableCommandIsReported) {
  std::string dir = MakeTempDir();
  auto missing = RunCommand(Keel() + " launch --log_dir=" + dir + " no_such_keel_worker --x");
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_TRUE(Contains(missing.output, "'no_such_keel_worker'")) << missing.output;
  EXPECT_TRUE(Contains(missing.output, "not found in PATH")) << missing.output;
  auto path = RunCommand(Keel() + " launch --log_dir=" + dir + " " + dir + "/nothing");
  EXPECT_EQ(path.exit_code, 1) << path.output;
  EXPECT_TRUE(Contains(path.output, dir + "/nothing")) << path.output;
  // Executable but not a program: execve fails in the worker, which the launcher reports.
  RunCommand("printf 'echo hi\\n' > " + dir + "/noshebang && chmod +x " + dir + "/noshebang");
  auto bad = RunCommand(Keel() + " launch --log_dir=" + dir + " " + dir + "/noshebang");
  EXPECT_EQ(bad.exit_code, 126) << bad.output;
  EXPECT_TRUE(Contains(bad.output, "worker rank 0 (local 0")) << bad.output;
  EXPECT_TRUE(Contains(bad.output, "cannot execute '" + dir + "/noshebang'")) << bad.output;
  RunCommand("rm -rf " + dir);
}

// Flags given before the command are the workers': `keel launch --steps=3 keel train` trains 3
// steps (it used to run the default 100), --cpu_math_threads sets each worker's threads, and a
// worker program that does not define a passed flag refuses to start instead of ignoring it.
TEST(KeelLaunch, FlagsBeforeTheCommandReachTheWorkers) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Keel() +
                      " launch --nproc_per_node=2 --steps=3 --fetch_frequency=1 "
                      "--log_dir=" +
                      dir + " " + Keel() + " train --mlp_hidden=8 --batch_size=4 --seed=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "step 2 loss")) << r.output;
  EXPECT_FALSE(Contains(r.output, "step 3 loss")) << r.output;

  auto threads = RunCommand("env -u FLAGS_cpu_math_threads " + Keel() +
                            " launch --nproc_per_node=2 --cpu_math_threads=3 --log_dir=" + dir +
                            " sh -c " + kEnvScript);
  ASSERT_EQ(threads.exit_code, 0) << threads.output;
  for (int local = 0; local < 2; ++local)
    EXPECT_EQ(EnvLine(ReadText(dir + "/workerlog." + std::to_string(local)))["threads"], "3");

  // train_mlp (a program on the library) has no --bench_steps: it refuses to start.
  auto unknown =
      RunCommand("cd " + dir + " && " + Keel() + " launch --bench_steps=2 --log_dir=" + dir + " " +
                 BinPath("train_mlp"));
  EXPECT_NE(unknown.exit_code, 0) << unknown.output;
  EXPECT_TRUE(Contains(ReadText(dir + "/workerlog.0"),
                       "keel launch was given --bench_steps for its workers, but"))
      << ReadText(dir + "/workerlog.0");
  // keel train has it (keel bench's), and refuses it as not its own.
  auto foreign = RunCommand(Keel() + " launch --bench_steps=2 --log_dir=" + dir + " " + Keel() +
                            " train --steps=1");
  EXPECT_NE(foreign.exit_code, 0) << foreign.output;
  EXPECT_TRUE(Contains(ReadText(dir + "/workerlog.0"), "--bench_steps is not a flag of keel train"))
      << ReadText(dir + "/workerlog.0");
  RunCommand("rm -rf " + dir);
}

// torchrun's way to several nodes: each node's launcher knows only rank 0's --master_addr and
// --master_port, and its own --node_rank (README's promise; it used to need --cluster_node_ips).
// Two launchers on this host act as two nodes and train together.
TEST(KeelLaunch, MultiNodeByMasterAddressWithoutClusterIps) {
  std::string dir = MakeTempDir();
  const int port = FreePort();
  auto node = [&](int rank) {
    return "KEEL_JOB_TOKEN=0123abcd FLAGS_cpu_math_threads=1 " + Keel() +
           " launch --nnodes=2 --node_rank=" + std::to_string(rank) +
           " --master_addr=127.0.0.1 --master_port=" + std::to_string(port) +
           " --nproc_per_node=2 --log_dir=" + dir + "/node" + std::to_string(rank) + " " +
           BinPath("mlp_dp_worker") + " --steps=3 --global_batch=8";
  };
  auto r = RunCommand(node(1) + " > " + dir + "/node1.out 2>&1 & other=$!; " + node(0) +
                      "; code=$?; wait $other || code=1; exit $code");
  ASSERT_EQ(r.exit_code, 0) << r.output << ReadText(dir + "/node1.out");
  std::string all = ReadText(dir + "/node0/workerlog.0") + ReadText(dir + "/node0/workerlog.1") +
                    ReadText(dir + "/node1/workerlog.0") + ReadText(dir + "/node1/workerlog.1");
  // Four ranks trained together: each printed the same parameters.
  std::set<std::string> params;
  std::istringstream lines(all);
  std::string line;
  while (std::getline(lines, line))
    if (line.rfind("rank ", 0) == 0 && Contains(line, " params "))
      params.insert(line.substr(line.find(" params ")));
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_TRUE(Contains(all, "rank " + std::to_string(rank) + " params ")) << all;
  EXPECT_EQ(params.size(), 1u) << all;
  RunCommand("rm -rf " + dir);
}

TEST(KeelLaunch, ContradictoryFlagsAreExitOneNamingThem) {
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {"--nnodes=2 --node_rank=2 --cluster_node_ips=127.0.0.1,127.0.0.2 sh",
       "--node_rank=2 is out of range for --nnodes=2"},
      {"--node_rank=1 sh", "--node_rank=1 is out of range for --nnodes=1"},
      {"--selected_gpus=0,1,0 --gpu_comm_backend=nccl sh",
       "--selected_gpus='0,1,0' lists GPU 0 twice, but --gpu_comm_backend=nccl cannot put two "
       "ranks on one GPU"},
      {"--selected_gpus=0 --gpu_comm_backend=mpi sh",
       "--gpu_comm_backend must be auto, nccl or host, got 'mpi'"},
      {"--selected_gpus=0,x sh", "'x' is not a GPU id"},
      {"--selected_gpus=0,1 --nproc_per_node=3 sh", "--nproc_per_node=3 but --selected_gpus"},
      {"--nproc_per_node=0 sh", "--nproc_per_node must be positive"},
      {"--nnodes=2 --cluster_node_ips=127.0.0.1 sh", "--nnodes=2 but --cluster_node_ips"},
      {"--nnodes=2 --node_rank=1 sh", "--nnodes=2 needs --cluster_node_ips"},
      {"--nnodes=2 --master_addr=127.0.0.1 --master_port=7000 sh", "needs --node_rank"},
      {"--nnodes=2 --node_rank=1 --master_addr=127.0.0.1 sh", "needs --master_port"},
      {"--steps=3 keel train --steps=4",
       "--steps=3 is given to keel launch (for every worker) "
       "and '--steps=4' to the command; give it once"},
      {"--cluster_node_ips=127.0.0.1,127.0.0.2 --node_ip=127.0.0.3 sh",
       "--node_ip=127.0.0.3 is not in --cluster_node_ips"},
      {"--cluster_node_ips=127.0.0.1,127.0.0.2 --node_ip=127.0.0.2 --node_rank=0 sh",
       "--node_rank=0 but --node_ip=127.0.0.2 is node 1"},
      {"--cluster_node_ips=127.0.0.1,127.0.0.2 --started_port=7000 sh",
       "needs --node_rank or --node_ip"},
      {"--cluster_node_ips=127.0.0.1,127.0.0.2 --node_rank=1 sh", "needs --started_port"},
      {"--cluster_node_ips=127.0.0.1,127.0.0.2 --node_rank=1 --master_addr=127.0.0.2 sh",
       "--master_addr=127.0.0.2 but --cluster_node_ips"},
      {"--started_port=7000 --master_port=7001 sh", "--master_port=7001 but --started_port=7000"},
      {"--started_port=65535 --nproc_per_node=2 sh", "past 65535"},
      {"--grace_period_s=-1 sh", "--grace_period_s must be >= 0"},
      {"--cpu_sched=fifo sh", "--cpu_sched must be auto, batch or normal, got 'fifo'"},
      {"", "no command to launch"},
      {"--nproc_per_node=2", "no command to launch"},
  };
  for (const Case& c : cases) {
    auto r =
        RunCommand("env -u CUDA_VISIBLE_DEVICES KEEL_JOB_TOKEN=t " + Keel() + " launch " + c.flags);
    EXPECT_EQ(r.exit_code, 1) << c.flags << "\n" << r.output;
    EXPECT_TRUE(Contains(r.output, c.message)) << c.flags << "\n" << r.output;
  }
  // A multi-node job without a shared token would be refused by the rendezvous: refuse it here.
  auto r = RunCommand("env -u KEEL_JOB_TOKEN " + Keel() +
                      " launch --cluster_node_ips=127.0.0.1,127.0.0.2 --node_rank=1 "
                      "--started_port=7000 sh");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "KEEL_JOB_TOKEN")) << r.output;
}

}  // namespace
}  // namespace keel::testing
