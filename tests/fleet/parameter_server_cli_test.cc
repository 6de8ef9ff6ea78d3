// keel train and keel bench in parameter-server mode, real processes on loopback under
// `keel launch --server_num=2 --worker_num=2` (docs/parameter-server.md, "keel train"): each
// mode trains the mlp to the end with the servers stopped by the trainers; the CTR model's AUC is
// summed over the trainers; refusals name the flag; a sync run resumed from its checkpoint (under
// another number of servers) ends where the uninterrupted run ends, bit for bit; a GEO checkpoint
// is complete (one process loads it) and resumes exactly where the exchange makes that possible;
// killing a server or a trainer ends the job at once, naming it (tools/ps_kill_trials.sh), and
// under --max_restarts restarts it, ending where the uninterrupted run ends.
#include <gtest/gtest.h>

#include <string>

#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

struct JobRun {
  std::string output;
  int exit_code = -1;
};

// `keel launch --server_num=S --worker_num=W LAUNCH_FLAGS keel ARGS` in DIR (with ENV); the
// output with the logs' tails.
JobRun Launch(int servers, int trainers, const std::string& dir, const std::string& args,
              const std::string& launch_flags = "", const std::string& env = "") {
  const std::string cmd = "cd " + dir + " && " + env +
                          " FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=20 " + Keel() +
                          " launch " + launch_flags + " --server_num=" + std::to_string(servers) +
                          " --worker_num=" + std::to_string(trainers) + " --log_dir=log " + Keel() +
                          " " + args + " 2>&1; rc=$?; tail -n 4 log/*; exit $rc";
  CommandResult r = RunCommand(cmd);
  return {cmd + "\n" + r.output, r.exit_code};
}

constexpr const char* kMlp =
    " --model=mlp --mlp_hidden=32 --batch_size=16 --progress=lines --seed=7";

void ExpectTrainsAndStops(const std::string& mode) {
  SCOPED_TRACE(mode);
  const std::string dir = MakeTempDir();
  JobRun r = Launch(2, 2, dir, std::string("train") + kMlp + " --steps=6 " + mode);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "2 worker(s)")) << r.output;  // the trainers, not the servers
  for (int step : {0, 5})
    EXPECT_TRUE(Contains(r.output, "step " + std::to_string(step) + " loss ")) << r.output;
  // Both servers left their loop because every trainer stopped (fleet::stop_worker).
  const CommandResult stopped = RunCommand("grep -l 'every trainer stopped' " + dir + "/log/*");
  EXPECT_TRUE(Contains(stopped.output, "serverlog.0")) << r.output;
  EXPECT_TRUE(Contains(stopped.output, "serverlog.1")) << r.output;
  RunCommand("rm -rf " + dir);
}

TEST(ParameterServerCli, SyncTrainsTheMlpAndStopsTheServers) {
  ExpectTrainsAndStops("--ps_mode=sync");
}

// Trainer 0 (not rank 0, a server) writes the inference model after training.
TEST(ParameterServerCli, TrainerZeroSavesTheInferenceModel) {
  const std::string dir = MakeTempDir();
  JobRun r = Launch(2, 2, dir,
                    std::string("train") + kMlp +
                        " --steps=2 --ps_mode=sync --save_inference_dir=" + dir + "/infer");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(RunCommand("test -s " + dir + "/infer/__model__ && test -s " + dir +
                       "/infer/params.safetensors")
                .exit_code,
            0)
      << r.output;
  RunCommand("rm -rf " + dir);
}

TEST(ParameterServerCli, AsyncTrainsTheMlpAndStopsTheServers) {
  ExpectTrainsAndStops("--ps_mode=async");
}

TEST(ParameterServerCli, GeoTrainsTheMlpAndStopsTheServers) {
  ExpectTrainsAndStops("--ps_mode=geo --geo_k=2");
}

// The CTR model evaluates on every trainer's shard, the AUC buckets summed over the trainers on
// their own ring: 4096 test samples, each trainer's 2048 together.
TEST(ParameterServerCli, CtrEvaluatesOverTheTrainers) {
  const std::string dir = MakeTempDir();
  JobRun r = Launch(2, 2, dir,
                    "train --model=ctr --vocab=1000 --batch_size=64 --steps=4 --eval_every=4 "
                    "--progress=lines --seed=3 --ps_mode=async");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "test_auc")) << r.output;
  EXPECT_TRUE(Contains(r.output, "(4096 test samples)")) << r.output;
  RunCommand("rm -rf " + dir);
}

// --ctr_table=distributed: the CTR table's rows live on the servers only (the trainers run
// distributed_lookup_table); it trains, synchronously and asynchronously, and evaluates.
TEST(ParameterServerCli, CtrWithADistributedTableTrains) {
  const std::string dir = MakeTempDir();
  for (const char* mode : {"sync", "async"}) {
    SCOPED_TRACE(mode);
    JobRun r = Launch(2, 2, dir,
                      std::string("train --model=ctr --ctr_table=distributed --vocab=100000 "
                                  "--batch_size=64 --steps=4 --progress=lines --seed=3 "
                                  "--ps_mode=") +
                          mode);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "step 3 loss ")) << r.output;
  }
  // It evaluates: the test program's lookup fetches the held-out batches' rows from the servers
  // too (rows no trainer touched are created there, as their initial values).
  JobRun eval = Launch(2, 2, dir,
                       "train --model=ctr --ctr_table=distributed --vocab=1000 --batch_size=64 "
                       "--steps=4 --eval_every=2 --progress=lines --seed=3 --ps_mode=sync");
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(Contains(eval.output, "test_auc")) << eval.output;
  EXPECT_TRUE(Contains(eval.output, "(4096 test samples)")) << eval.output;
  CommandResult program = RunCommand(
      Keel() +
      " inspect --strategy --ps --nservers=2 --nworkers=2 --rank=2 --program=main --model=ctr "
      "--ctr_table=distributed 2>&1");
  EXPECT_EQ(program.exit_code, 0) << program.output;
  EXPECT_TRUE(Contains(program.output, "distributed_lookup_table")) << program.output;
  RunCommand("rm -rf " + dir);
}

// Async with a distributed table: a trainer asks every server for its next batch's rows while its
// communicator may still push the previous step to another server. Here each trainer's push
// reaches "its" server (trainer t: server t) 300 ms late, so each server serves one trainer's
// push, then that trainer's request for rows, while the other server waits for the other
// trainer's late push. A server that, before serving rows, waited for the trainer to take its
// replies to the push (which a trainer takes only once every server took the push) closed a
// cycle through the two servers and the two trainers: the job hung until the comm timeout (and
// did so by chance, about one keel bench ctr run in four, without the delays).
TEST(ParameterServerCli, AsyncDistributedTablePrefetchesWhileTheCommunicatorPushes) {
  const std::string dir = MakeTempDir();
  JobRun r = Launch(2, 2, dir,
                    "train --model=ctr --ctr_table=distributed --vocab=100000 --batch_size=64 "
                    "--steps=4 --progress=lines --seed=3 --ps_mode=async",
                    "",
                    "KEEL_FAULT_DELAY=ps_push_to_server0@0:300,"
                    "ps_push_to_server1@1:300");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "step 3 loss ")) << r.output;
  RunCommand("rm -rf " + dir);
}

// keel bench in a parameter-server job prints one JSON line with the trainers' samples/s summed
// (what ../shared/anchors/compare_ps.sh reads) and the mode.
TEST(ParameterServerCli, BenchPrintsOneJsonLineOfEveryTrainer) {
  const std::string dir = MakeTempDir();
  JobRun r = Launch(2, 2, dir,
                    "bench mlp --mlp_hidden=32 --batch_size=16 --bench_steps=5 --bench_warmup=1 "
                    "--ps_mode=async");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "\"samples_per_s\": ")) << r.output;
  EXPECT_TRUE(Contains(r.output, "\"ps_mode\": \"async\", \"servers\": 2")) << r.output;
  // keel launch --cpu_sched=auto runs a parameter-server job under SCHED_BATCH, and says so.
  EXPECT_TRUE(Contains(r.output, "\"cpu_sched\": \"batch\"")) << r.output;
  RunCommand("rm -rf " + dir);
}

TEST(ParameterServerCli, RefusalsNameTheFlag) {
  const std::string dir = MakeTempDir();
  // Without a parameter-server job.
  CommandResult alone =
      RunCommand(Keel() + " train --model=mlp --mlp_hidden=8 --steps=1 --ps_mode=async 2>&1");
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_TRUE(Contains(alone.output, "--ps_mode is a setting of parameter-server training"))
      << alone.output;
  // A model not built for it, a collective setting, a GEO setting in another mode.
  JobRun lenet = Launch(1, 1, dir, "train --model=lenet --steps=1");
  EXPECT_NE(lenet.exit_code, 0);
  EXPECT_TRUE(Contains(lenet.output, "--model=lenet in parameter-server training")) << lenet.output;
  JobRun tp = Launch(1, 1, dir, std::string("train") + kMlp + " --steps=1 --local_sgd_steps=2");
  EXPECT_NE(tp.exit_code, 0);
  EXPECT_TRUE(Contains(tp.output, "--local_sgd_steps does not combine with parameter-server"))
      << tp.output;
  JobRun geo = Launch(1, 1, dir, std::string("train") + kMlp + " --steps=1 --geo_k=3");
  EXPECT_NE(geo.exit_code, 0);
  EXPECT_TRUE(Contains(geo.output, "--geo_k goes with --ps_mode=geo")) << geo.output;
  JobRun stale = Launch(1, 1, dir, std::string("train") + kMlp + " --steps=1 --ps_max_staleness=1");
  EXPECT_NE(stale.exit_code, 0);
  EXPECT_TRUE(Contains(stale.output, "--ps_max_staleness goes with --ps_mode=async"))
      << stale.output;
  stale = Launch(1, 1, dir,
                 std::string("train") + kMlp + " --steps=1 --ps_mode=async --ps_max_staleness=-2");
  EXPECT_NE(stale.exit_code, 0);
  EXPECT_TRUE(Contains(stale.output, "a_sync_configs.max_staleness=-2 must be >= 0"))
      << stale.output;
  CommandResult table = RunCommand(Keel() + " train" + kMlp + " --steps=1 --ctr_table=dense 2>&1");
  EXPECT_NE(table.exit_code, 0);
  EXPECT_TRUE(Contains(table.output, "--ctr_table is a setting of the ctr model")) << table.output;
  table = RunCommand(Keel() + " train --model=ctr --vocab=100 --steps=1 --ctr_table=rows 2>&1");
  EXPECT_NE(table.exit_code, 0);
  EXPECT_TRUE(Contains(table.output, "--ctr_table=rows: sparse, dense or distributed"))
      << table.output;
  RunCommand("rm -rf " + dir);
}

// Sync, Adam: 6 steps in one go equal 3 steps, a checkpoint, and 3 more resumed from it, with
// the resumed job on one server instead of two (its blocks cut anew from the checkpoint): the
// parameters, Adam's moments and powers all bit for bit. The servers' optimizer state comes back
// from the checkpoint: a resume that restarted it (fresh moments, powers at 1) would differ.
TEST(ParameterServerCli, SyncResumeUnderAnotherServerCountIsExact) {
  const std::string dir = MakeTempDir();
  const std::string flags = std::string("train") + kMlp + " --optimizer=adam --ps_mode=sync";
  JobRun whole = Launch(2, 2, dir, flags + " --steps=6 --save_dir=" + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  JobRun first = Launch(2, 2, dir, flags + " --steps=3 --save_dir=" + dir + "/half");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  JobRun second = Launch(
      1, 2, dir, flags + " --steps=6 --load_dir=" + dir + "/half --save_dir=" + dir + "/end");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_TRUE(Contains(second.output, "resumed from " + dir + "/half at step 3")) << second.output;
  const auto want = CheckpointTensorBytes(dir + "/whole");
  const auto got = CheckpointTensorBytes(dir + "/end");
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(got.size(), want.size());
  int differ = 0;
  for (const auto& [name, bytes] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    if (it->second != bytes) ++differ;
    EXPECT_EQ(it->second, bytes) << name << " differs";
  }
  std::printf(
      "sync resume (2 servers x 2 trainers, 3 steps + 3 on 1 server): %d of %zu "
      "checkpoint tensors differ from 6 uninterrupted steps\n",
      differ, want.size());
  // The half-way checkpoint really differs from the end (the resumed run trained).
  EXPECT_NE(CheckpointTensorBytes(dir + "/half"), want);
  RunCommand("rm -rf " + dir);
}

// A checkpoint of a distributed table (its rows pulled from the servers, stored by id) resumes
// exactly under another server count: 3 steps on 2 servers and 3 more on 1 end bit for bit where
// 6 steps on 2 servers end (the table's rows, their Adam moments, the dense layers). One process
// loads it (the whole table: the stored rows, the others as the rule makes them), and a job of
// servers resumes from one process's checkpoint, each server keeping the rows it owns that moved:
// 3 steps in one process and 3 on 1 server x 1 trainer equal 6 in one process.
TEST(ParameterServerCli, DistributedTableCheckpointResumesExactlyUnderAnotherServerCount) {
  const std::string dir = MakeTempDir();
  const std::string ctr =
      "train --model=ctr --ctr_table=distributed --vocab=100000 --batch_size=64 "
      "--progress=lines --seed=3 --optimizer=adam";
  const std::string sync = ctr + " --ps_mode=sync";
  JobRun whole = Launch(2, 2, dir, sync + " --steps=6 --save_dir=" + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  JobRun half = Launch(2, 2, dir, sync + " --steps=3 --save_dir=" + dir + "/half");
  ASSERT_EQ(half.exit_code, 0) << half.output;
  JobRun rest =
      Launch(1, 2, dir, sync + " --steps=6 --load_dir=" + dir + "/half --save_dir=" + dir + "/end");
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_TRUE(Contains(rest.output, "resumed from " + dir + "/half at step 3")) << rest.output;
  const auto want = CheckpointTensorBytes(dir + "/whole");
  ASSERT_TRUE(want.count("SparseFeatFactors@ROWS.values")) << whole.output;
  EXPECT_EQ(CheckpointTensorBytes(dir + "/end"), want);
  EXPECT_NE(CheckpointTensorBytes(dir + "/half"), want);

  // One process: from the job's checkpoint, and 6 steps its own way, then one more step each.
  const std::string one = "cd " + dir + " && FLAGS_cpu_math_threads=1 " + Keel() + " " + ctr;
  CommandResult w = RunCommand(one + " --steps=6 --save_dir=" + dir + "/one6 2>&1");
  ASSERT_EQ(w.exit_code, 0) << w.output;
  CommandResult h = RunCommand(one + " --steps=3 --save_dir=" + dir + "/one3 2>&1");
  ASSERT_EQ(h.exit_code, 0) << h.output;
  JobRun from_one = Launch(
      1, 1, dir, sync + " --steps=6 --load_dir=" + dir + "/one3 --save_dir=" + dir + "/from_one");
  ASSERT_EQ(from_one.exit_code, 0) << from_one.output;
  CommandResult a =
      RunCommand(one + " --steps=7 --load_dir=" + dir + "/from_one --save_dir=" + dir + "/a 2>&1");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_TRUE(Contains(a.output, "resumed from " + dir + "/from_one at step 6")) << a.output;
  CommandResult b =
      RunCommand(one + " --steps=7 --load_dir=" + dir + "/one6 --save_dir=" + dir + "/b 2>&1");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(CheckpointTensorBytes(dir + "/a"), CheckpointTensorBytes(dir + "/b"));
  RunCommand("rm -rf " + dir);
}

// Under --max_restarts a trainer killed after step 4 restarts the whole job, servers too; they
// resume from trainer 0's last checkpoint (the servers load their blocks of it) and end where the
// uninterrupted run ends, bit for bit (sync, Adam). (A killed server restarts the job the same
// way; tools/ps_kill_trials.sh kills at random without restarts.)
TEST(ParameterServerCli, MaxRestartsRestartsTheJobAfterAKilledTrainerAndEndsLikeTheWholeRun) {
  const std::string dir = MakeTempDir();
  const std::string flags = std::string("train") + kMlp +
                            " --optimizer=adam --ps_mode=sync --steps=8 --save_every=2 --save_dir=";
  JobRun whole = Launch(2, 2, dir, flags + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  JobRun restarted = Launch(2, 2, dir, flags + dir + "/restarted", "--max_restarts=1",
                            "KEEL_FAULT_POINT=trainer_step_4@1");
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  EXPECT_TRUE(
      Contains(restarted.output, "keel launch: restart 1 of 1: trainer 1 rank 3 (local 3, pid"))
      << restarted.output;
  EXPECT_TRUE(Contains(restarted.output, "restarting all 4 worker(s)")) << restarted.output;
  EXPECT_TRUE(Contains(restarted.output, "resumed from " + dir + "/restarted at step"))
      << restarted.output;
  const auto want = CheckpointTensorBytes(dir + "/whole");
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(CheckpointTensorBytes(dir + "/restarted"), want);
  RunCommand("rm -rf " + dir);
}

// GEO (k = 2) with one trainer: a checkpoint at an exchange holds the servers' parameters (which
// equal the trainer's there) and the trainer's Adam state, so resuming is exact; one process
// loads it (keel inspect reads it against nothing else: every tensor is there under its
// single-device name, including the optimizer state the GEO servers do not hold).
TEST(ParameterServerCli, GeoCheckpointIsCompleteAndResumesAtAnExchange) {
  const std::string dir = MakeTempDir();
  const std::string flags =
      std::string("train") + kMlp + " --optimizer=adam --ps_mode=geo --geo_k=2";
  JobRun whole = Launch(2, 1, dir, flags + " --steps=8 --save_dir=" + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  JobRun first = Launch(2, 1, dir, flags + " --steps=4 --save_dir=" + dir + "/half");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  JobRun second = Launch(
      2, 1, dir, flags + " --steps=8 --load_dir=" + dir + "/half --save_dir=" + dir + "/end");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const auto want = CheckpointTensorBytes(dir + "/whole");
  const auto got = CheckpointTensorBytes(dir + "/end");
  ASSERT_FALSE(want.empty());
  EXPECT_TRUE(want.count("fc_0.w_0_moment1_0")) << "no Adam state in the GEO checkpoint";
  EXPECT_EQ(got, want);
  // One process resumes from it: the single-device program's persistables are all there.
  CommandResult one =
      RunCommand("cd " + dir + " && FLAGS_cpu_math_threads=1 " + Keel() + " train" + kMlp +
                 " --optimizer=adam --steps=9 --load_dir=" + dir + "/end 2>&1");
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(Contains(one.output, "at step 8")) << one.output;
  RunCommand("rm -rf " + dir);
}

// tools/ps_kill_trials.sh, 2 trials of each kind: kill -9 a random server, then a random trainer,
// of a sync 2 x 2 job at a random step; each job ends within the comm timeout + 5 s with the
// launcher naming the killed process, nothing left running (the script checks; 20 trials each
// are in the docs).
TEST(ParameterServerCli, KillTrialsEndTheJobNamingTheDeadProcess) {
  const std::string cmd = std::string(KEEL_SOURCE_DIR) +
                          "/tools/ps_kill_trials.sh --trials=2 --comm_timeout_s=10 " + Keel() +
                          " 2>&1";
  CommandResult r = RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  EXPECT_TRUE(Contains(r.output, "summary server kills")) << r.output;
  EXPECT_TRUE(Contains(r.output, "summary trainer kills")) << r.output;
  EXPECT_TRUE(Contains(r.output, "failed checks: 0")) << r.output;
}

// The same without keel launch (--direct: nobody stops the survivors), asynchronous mode, a
// trainer killed: the servers wait for the next header from any live trainer, a Gloo receive that
// no closed connection fails; the transport's store watch ends it at once, naming the trainer
// (without it the other trainer trained on and the job did not end).
TEST(ParameterServerCli, DirectKillOfAnAsyncTrainerIsFoundByTheServers) {
  const std::string cmd = std::string(KEEL_SOURCE_DIR) +
                          "/tools/ps_kill_trials.sh --trials=2 --kind=trainer --mode=async "
                          "--direct --comm_timeout_s=10 " +
                          Keel() + " 2>&1";
  CommandResult r = RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  EXPECT_TRUE(Contains(r.output, "failed checks: 0")) << r.output;
}

}  // namespace
}  // namespace keel::testing
