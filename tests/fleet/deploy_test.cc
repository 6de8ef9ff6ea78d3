// deploy/: the Kubernetes PyTorchJob manifest and the Slurm sbatch script produce environments
// the role maker accepts, and a job started in them trains. The manifest's env is read from the
// YAML and completed with what the training operator adds (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT); the sbatch script runs for real with stand-ins for srun and scontrol that start
// its tasks on this machine the way Slurm does.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fleet/role_maker.h"
#include "framework/io/checkpoint.h"
#include "tests/util/files.h"
#include "tests/util/subprocess.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using testing::BinPath;
using testing::ReadText;
using testing::RunCommand;

std::string Source(const std::string& rel) { return std::string(KEEL_SOURCE_DIR) + "/" + rel; }

std::string Trim(std::string s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  s = b == std::string::npos ? "" : s.substr(b, e - b + 1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

// The env lists of the manifest's containers, in order (Master's, then Worker's): name -> value,
// "<secret>" for a valueFrom.
std::vector<std::map<std::string, std::string>> ManifestEnvs(const std::string& yaml) {
  std::vector<std::map<std::string, std::string>> envs;
  std::istringstream in(yaml);
  std::string line, name;
  bool in_env = false;
  size_t env_indent = 0;
  while (std::getline(in, line)) {
    size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '#') continue;
    std::string t = Trim(line);
    if (t == "env:") {
      envs.emplace_back();
      in_env = true;
      env_indent = indent;
      continue;
    }
    if (in_env && indent <= env_indent) in_env = false;
    if (!in_env) continue;
    if (t.rfind("- name:", 0) == 0) {
      name = Trim(t.substr(7));
    } else if (t.rfind("value:", 0) == 0 && !name.empty()) {
      envs.back()[name] = Trim(t.substr(6));
    } else if (t.rfind("valueFrom:", 0) == 0 && !name.empty()) {
      envs.back()[name] = "<secret>";
    }
  }
  return envs;
}

int ManifestPort(const std::string& yaml) {
  size_t at = yaml.find("containerPort:");
  return at == std::string::npos ? 0 : std::stoi(yaml.substr(at + 14));
}

TEST(Deploy, PyTorchJobManifestGivesEveryPodARoleTheRoleMakerAccepts) {
  const std::string yaml = ReadText(Source("deploy/k8s/keel-pytorchjob.yaml"));
  ASSERT_FALSE(yaml.empty());
  auto envs = ManifestEnvs(yaml);
  ASSERT_EQ(envs.size(), 2u) << "expected a Master and a Worker container";
  const int port = ManifestPort(yaml);
  ASSERT_EQ(port, 23456);
  EXPECT_NE(yaml.find("name: pytorch "), std::string::npos) << "the operator's container name";
  EXPECT_NE(yaml.find("--auto_resume"), std::string::npos);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("pod " + std::to_string(rank));
    std::map<std::string, std::string> env = envs[rank];
    EXPECT_EQ(env.count("KEEL_JOB_TOKEN"), 1u) << "every pod needs the job token";
    // What the training operator adds to each pod.
    env["RANK"] = std::to_string(rank);
    env["WORLD_SIZE"] = "2";
    env["MASTER_ADDR"] = "keel-mnist-master-0";
    env["MASTER_PORT"] = std::to_string(port);
    fleet::Role role = fleet::CloudRoleMaker::FromEnv(env);
    EXPECT_EQ(role.source, "torchrun");
    EXPECT_EQ(role.rank, rank);
    EXPECT_EQ(role.world_size, 2);
    EXPECT_EQ(role.local_rank, 0);
    EXPECT_EQ(role.local_world_size, 1);
    EXPECT_EQ(role.num_nodes(), 2);
    EXPECT_EQ(role.store_endpoint(), "keel-mnist-master-0:23456");
  }
  // The same environments on loopback (the master pod reaches itself as localhost) train.
  std::string dir = testing::MakeTempDir();
  std::string common =
      "env -u PADDLE_TRAINER_ID -u PADDLE_TRAINERS_NUM -u PADDLE_TRAINER_ENDPOINTS "
      "-u PADDLE_CURRENT_ENDPOINT KEEL_JOB_TOKEN=t WORLD_SIZE=2 LOCAL_RANK=0 "
      "LOCAL_WORLD_SIZE=1 FLAGS_cpu_comm_backend=gloo MASTER_ADDR=localhost "
      "MASTER_PORT=" +
      std::to_string(testing::FreePort()) + " ";
  std::string train = BinPath("keel") + " train --model=mlp --mlp_hidden=32 --steps=5 --seed=1";
  auto r = RunCommand("sh -c '" + common + "RANK=1 " + train + " > " + dir +
                      "/w1.txt 2>&1 & p=$!; " + common + "RANK=0 " + train + " --save_dir=" + dir +
                      "/ckpt; r0=$?; wait $p; r1=$?; cat " + dir + "/w1.txt; exit $((r0 + r1))'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 worker(s)"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(Deploy, SbatchScriptStartsAJobTheRoleMakerAccepts) {
  std::string dir = testing::MakeTempDir();
  fs::create_directories(dir + "/bin");
  // srun: starts SLURM_NTASKS copies of the command with each task's variables, one node.
  std::ofstream(dir + "/bin/srun")
      << "#!/bin/sh\n"
         "while [ $# -gt 0 ]; do case \"$1\" in --*) shift;; *) break;; "
         "esac; done\n"
         "i=0; pids=\"\"\n"
         "while [ $i -lt \"$SLURM_NTASKS\" ]; do\n"
         "  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NODEID=0 \"$@\" &\n"
         "  pids=\"$pids $!\"; i=$((i + 1))\n"
         "done\n"
         "rc=0; for p in $pids; do wait $p || rc=$?; done; exit $rc\n";
  std::ofstream(dir + "/bin/scontrol") << "#!/bin/sh\necho localhost\n";
  fs::permissions(dir + "/bin/srun", fs::perms::owner_all);
  fs::permissions(dir + "/bin/scontrol", fs::perms::owner_all);
  const std::string env =
      "env -u KEEL_JOB_TOKEN -u RANK -u WORLD_SIZE -u PADDLE_TRAINER_ID -u PADDLE_TRAINERS_NUM "
      "PATH=" +
      dir +
      "/bin:$PATH SLURM_JOB_ID=4242 SLURM_JOB_NAME=keeltest "
      "SLURM_JOB_NODELIST=localhost SLURM_NNODES=1 SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 "
      "SLURM_TASKS_PER_NODE=2 SLURM_CPUS_PER_TASK=1 MASTER_PORT=" +
      std::to_string(testing::FreePort()) + " KEEL=" + BinPath("keel") +
      " KEEL_ARGS='--model=mlp --mlp_hidden=32 --steps=5 --seed=1' SAVE_DIR=" + dir + "/ckpt ";
  auto r = RunCommand(env + "bash " + Source("deploy/slurm/keel.sbatch"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("source=slurm"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 worker(s)"), std::string::npos) << r.output;
  std::optional<TrainingState> st = ReadTrainingState(dir + "/ckpt");
  ASSERT_TRUE(st.has_value()) << r.output;
  EXPECT_EQ(st->step, 5);
  EXPECT_EQ(st->world_size, 2);
  // And task 1's environment alone, as the role maker sees it.
  fleet::Role role = fleet::CloudRoleMaker::FromEnv({{"SLURM_PROCID", "3"},
                                                     {"SLURM_LOCALID", "1"},
                                                     {"SLURM_NTASKS", "4"},
                                                     {"SLURM_NTASKS_PER_NODE", "2"},
                                                     {"MASTER_ADDR", "node1"},
                                                     {"MASTER_PORT", "24242"}});
  EXPECT_EQ(role.rank, 3);
  EXPECT_EQ(role.node_rank(), 1);
  EXPECT_EQ(role.local_rank, 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel
