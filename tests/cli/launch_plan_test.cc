// keel launch's plan (python_free_cli/launch_plan.h) without starting a process: ranks,
// endpoints, the workers' environment and every contradiction the flags can hold, with a fake
// machine answering for free ports, PATH, cores and tokens. tests/cli/launch_test.cc runs the
// launcher itself.
#include "python_free_cli/launch_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "framework/error.h"
#include "tests/util/op_test_util.h"

namespace keel::cli {
namespace {

using keel::testing::ErrorOf;

// A machine with 8 cores whose free ports are 41000, 41001, ... and whose every command
// resolves to /bin/<command>; it records what it was asked.
struct FakeHost {
  std::vector<std::pair<int, int>> free_port_calls;  // (count, exclude)
  std::string path_seen = "(not asked)";
  std::vector<std::string> known_flags = {"steps", "lr", "comm_timeout_s", "gpu_comm_backend"};

  LaunchHost Host() {
    LaunchHost host;
    host.free_ports = [this](int count, int exclude) {
      free_port_calls.emplace_back(count, exclude);
      std::vector<int> ports;
      for (int p = 41000; static_cast<int>(ports.size()) < count; ++p)
        if (p != exclude) ports.push_back(p);
      return ports;
    };
    host.resolve_executable = [this](const std::string& cmd, const char* path) {
      path_seen = path ? path : "(unset)";
      return "/bin/" + cmd;
    };
    host.cpu_count = [] { return 8; };
    host.cpus = [] { return std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}; };
    host.random_token = [] { return std::string("feedc0de"); };
    host.is_worker_flag = [this](const std::string& name) {
      for (const std::string& k : known_flags)
        if (k == name) return true;
      return false;
    };
    return host;
  }
};

LaunchInput Input(int nproc = 1) {
  LaunchInput in;
  in.command = {"train", "--steps=5"};
  in.env = {"HOME=/home/u", "PATH=/opt/bin:/usr/bin"};
  if (nproc != 1) {
    in.nproc_per_node = nproc;
    in.set_flags.insert("nproc_per_node");
  }
  return in;
}

// The worker's environment as a map; a variable set twice fails the test.
std::map<std::string, std::string> EnvOf(const LaunchWorker& w) {
  std::map<std::string, std::string> env;
  for (const std::string& e : w.env) {
    size_t eq = e.find('=');
    EXPECT_NE(eq, std::string::npos) << e;
    EXPECT_TRUE(env.emplace(e.substr(0, eq), e.substr(eq + 1)).second) << "set twice: " << e;
  }
  return env;
}

std::string PlanError(const LaunchInput& in) {
  FakeHost fake;
  return ErrorOf([&] { MakeLaunchPlan(in, fake.Host()); });
}

TEST(LaunchPlan, OneNodeGetsFreePortsAndEveryWorkerItsRank) {
  FakeHost fake;
  LaunchPlan plan = MakeLaunchPlan(Input(2), fake.Host());
  EXPECT_EQ(plan.world(), 2);
  EXPECT_EQ(plan.endpoints, (std::vector<std::string>{"127.0.0.1:41000", "127.0.0.1:41001"}));
  EXPECT_EQ(plan.master, "127.0.0.1:41000");
  EXPECT_EQ(fake.free_port_calls, (std::vector<std::pair<int, int>>{{2, 0}}));
  EXPECT_EQ(plan.token, "feedc0de");
  EXPECT_EQ(plan.executable, "/bin/train");
  EXPECT_EQ(fake.path_seen, "/opt/bin:/usr/bin");
  EXPECT_EQ(plan.log_dir, "log");
  ASSERT_EQ(plan.workers.size(), 2u);
  for (int local = 0; local < 2; ++local) {
    SCOPED_TRACE(local);
    const LaunchWorker& w = plan.workers[local];
    EXPECT_EQ(w.local, local);
    EXPECT_EQ(w.rank, local);
    EXPECT_EQ(w.log_path, "log/workerlog." + std::to_string(local));
    auto env = EnvOf(w);
    EXPECT_EQ(env["RANK"], std::to_string(local));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "41000");
    EXPECT_EQ(env["PADDLE_TRAINER_ID"], std::to_string(local));
    EXPECT_EQ(env["PADDLE_TRAINERS_NUM"], "2");
    EXPECT_EQ(env["PADDLE_TRAINER_ENDPOINTS"], "127.0.0.1:41000,127.0.0.1:41001");
    EXPECT_EQ(env["PADDLE_CURRENT_ENDPOINT"], plan.endpoints[local]);
    EXPECT_EQ(env["KEEL_JOB_TOKEN"], "feedc0de");
    EXPECT_EQ(env["FLAGS_cpu_math_threads"], "4");  // 8 cores shared by 2 workers
    EXPECT_EQ(env["HOME"], "/home/u");              // the launcher's environment passes on
    EXPECT_EQ(env.count("FLAGS_selected_gpus"), 0u);
    EXPECT_EQ(env.count("KEEL_LAUNCH_FLAGS"), 0u);
  }
  EXPECT_EQ(plan.command, (std::vector<std::string>{"train", "--steps=5"}));
}

TEST(LaunchPlan, ClusterNodeIpsGiveEveryNodeTheSameEndpoints) {
  FakeHost fake;
  LaunchInput in = Input(2);
  in.cluster_node_ips = "10.0.0.1, 10.0.0.2";
  in.node_ip = "10.0.0.2";
  in.started_port = 7000;
  in.set_flags.insert("started_port");
  in.env.push_back("KEEL_JOB_TOKEN=shared");
  LaunchPlan plan = MakeLaunchPlan(in, fake.Host());
  EXPECT_EQ(plan.nnodes, 2);
  EXPECT_EQ(plan.node_rank, 1);  // from --node_ip's place in the list
  EXPECT_EQ(plan.endpoints, (std::vector<std::string>{"10.0.0.1:7000", "10.0.0.1:7001",
                                                      "10.0.0.2:7000", "10.0.0.2:7001"}));
  EXPECT_EQ(plan.master, "10.0.0.1:7000");
  EXPECT_TRUE(fake.free_port_calls.empty());
  EXPECT_EQ(plan.token, "shared");
  ASSERT_EQ(plan.workers.size(), 2u);
  EXPECT_EQ(plan.workers[0].rank, 2);
  EXPECT_EQ(plan.workers[1].rank, 3);
  auto env = EnvOf(plan.workers[1]);
  EXPECT_EQ(env["RANK"], "3");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["PADDLE_CURRENT_ENDPOINT"], "10.0.0.2:7001");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "7000");
}

TEST(LaunchPlan, NodesMeetingAtTheMasterKnowNoOtherEndpoint) {
  FakeHost fake;
  LaunchInput in = Input(2);
  in.nnodes = 3;
  in.node_rank = 2;
  in.master_addr = "10.1.0.1";
  in.master_port = 29500;
  in.set_flags = {"nproc_per_node", "nnodes", "node_rank", "master_port"};
  in.env.push_back("KEEL_JOB_TOKEN=shared");
  LaunchPlan plan = MakeLaunchPlan(in, fake.Host());
  EXPECT_TRUE(plan.endpoints.empty());
  EXPECT_EQ(plan.master, "10.1.0.1:29500");
  EXPECT_EQ(plan.world(), 6);
  auto env = EnvOf(plan.workers[1]);
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["MASTER_ADDR"], "10.1.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
  EXPECT_EQ(env.count("PADDLE_TRAINER_ENDPOINTS"), 0u);
  EXPECT_EQ(env.count("PADDLE_TRAINER_ID"), 0u);
}

TEST(LaunchPlan, MasterPortOnOneNodeIsRankZerosAndTheRestAreFree) {
  FakeHost fake;
  LaunchInput in = Input(3);
  in.master_port = 41001;  // also the fake's second free port: it is excluded
  in.set_flags.insert("master_port");
  LaunchPlan plan = MakeLaunchPlan(in, fake.Host());
  EXPECT_EQ(fake.free_port_calls, (std::vector<std::pair<int, int>>{{2, 41001}}));
  EXPECT_EQ(plan.endpoints,
            (std::vector<std::string>{"127.0.0.1:41001", "127.0.0.1:41000", "127.0.0.1:41002"}));
  EXPECT_EQ(plan.master, "127.0.0.1:41001");
}

TEST(LaunchPlan, SelectedGpusSetTheWorkersAndAreRenumberedByCudaVisibleDevices) {
  FakeHost fake;
  LaunchInput in = Input();
  in.selected_gpus = "3,1";
  LaunchPlan plan = MakeLaunchPlan(in, fake.Host());
  EXPECT_EQ(plan.nproc_per_node, 2);  // one worker per GPU
  EXPECT_EQ(EnvOf(plan.workers[0])["FLAGS_selected_gpus"], "3");
  EXPECT_EQ(EnvOf(plan.workers[1])["FLAGS_selected_gpus"], "1");

  in.env.push_back("CUDA_VISIBLE_DEVICES=1,3");
  plan = MakeLaunchPlan(in, fake.Host());
  EXPECT_EQ(plan.gpus, (std::vector<int>{1, 0}));
  EXPECT_EQ(EnvOf(plan.workers[0])["FLAGS_selected_gpus"], "1");

  // Two ranks on one GPU: the host backend (or auto) stages collectives, NCCL refuses.
  in.selected_gpus = "1,1";
  EXPECT_EQ(MakeLaunchPlan(in, fake.Host()).gpus, (std::vector<int>{0, 0}));
  in.given["gpu_comm_backend"] = "nccl";
  EXPECT_NE(PlanError(in).find("lists GPU 1 twice, but --gpu_comm_backend=nccl"),
            std::string::npos);
}

TEST(LaunchPlan, FlagsForTheWorkersBecomeFlagsVariablesNamedInKeelLaunchFlags) {
  FakeHost fake;
  LaunchInput in = Input(2);
  in.given = {{"lr", "0.5"},            // the worker's flag
              {"nproc_per_node", "2"},  // the launcher's own
              {"helpfull", "true"},     // not a flag the workers know (gflags' own)
              {"comm_timeout_s", "9"}};
  LaunchPlan plan = MakeLaunchPlan(in, fake.Host());
  auto env = EnvOf(plan.workers[1]);
  EXPECT_EQ(env["FLAGS_lr"], "0.5");
  EXPECT_EQ(env["FLAGS_comm_timeout_s"], "9");
  EXPECT_EQ(env["KEEL_LAUNCH_FLAGS"], "comm_timeout_s,lr");
  EXPECT_EQ(env.count("FLAGS_nproc_per_node"), 0u);
  EXPECT_EQ(env.count("FLAGS_helpfull"), 0u);

  // The same flag given to the launcher and to the command is refused, in any spelling.
  for (const char* spelled : {"--steps=4", "-steps", "--nosteps"}) {
    in.given = {{"steps", "3"}};
    in.command = {"train", spelled};
    EXPECT_NE(PlanError(in).find(std::string("--steps=3 is given to keel launch (for every "
                                             "worker) and '") +
                                 spelled + "' to the command; give it once"),
              std::string::npos)
        << spelled;
  }
}

TEST(LaunchPlan, TheLaunchersOwnRankVariablesAreDroppedAndTheWorkersSetOnce) {
  FakeHost fake;
  LaunchInput in = Input();
  in.env = {"OMPI_COMM_WORLD_RANK=3", "SLURM_PROCID=3", "PADDLE_TRAINER_ID=7", "RANK=9",
            "KEEL_LAUNCH_FLAGS=x",    "KEEP=me"};
  auto env = EnvOf(MakeLaunchPlan(in, fake.Host()).workers[0]);
  EXPECT_EQ(env.count("OMPI_COMM_WORLD_RANK"), 0u);
  EXPECT_EQ(env.count("SLURM_PROCID"), 0u);
  EXPECT_EQ(env.count("KEEL_LAUNCH_FLAGS"), 0u);
  EXPECT_EQ(env["PADDLE_TRAINER_ID"], "0");
  EXPECT_EQ(env["RANK"], "0");
  EXPECT_EQ(env["KEEP"], "me");
  EXPECT_EQ(fake.path_seen, "(unset)");  // no PATH in this environment
}

TEST(LaunchPlan, CpuMathThreadsComeFromTheFlagTheEnvironmentOrTheCores) {
  FakeHost fake;
  LaunchInput in = Input(3);
  EXPECT_EQ(MakeLaunchPlan(in, fake.Host()).cpu_math_threads, "2");  // 8 cores / 3
  in.nproc_per_node = 16;
  EXPECT_EQ(MakeLaunchPlan(in, fake.Host()).cpu_math_threads, "1");  // at least one
  in.env.push_back("FLAGS_cpu_math_threads=5");
  LaunchPlan plan = MakeLaunchPlan(in, fake.Host());
  EXPECT_EQ(plan.cpu_math_threads, "");  // the environment's passes on untouched
  EXPECT_EQ(EnvOf(plan.workers[0])["FLAGS_cpu_math_threads"], "5");
  in.given["cpu_math_threads"] = "7";
  EXPECT_EQ(EnvOf(MakeLaunchPlan(in, fake.Host()).workers[0])["FLAGS_cpu_math_threads"], "7");
}

TEST(LaunchPlan, SupervisionSettingsAndLogPaths) {
  FakeHost fake;
  LaunchInput in = Input();
  in.comm_timeout_s = 0;
  EXPECT_EQ(MakeLaunchPlan(in, fake.Host()).stopped_limit_s, 1);  // at least a second
  in.comm_timeout_s = 120;
  EXPECT_EQ(MakeLaunchPlan(in, fake.Host()).stopped_limit_s, 120);
  in.stopped_timeout_s = 30;
  in.grace_period_s = 2;
  in.max_restarts = 3;
  in.log_dir = "/tmp/job/";
  LaunchPlan plan = MakeLaunchPlan(in, fake.Host());
  EXPECT_EQ(plan.log_dir, "log");  // --log_dir's value counts only when it is set
  in.set_flags.insert("log_dir");
  plan = MakeLaunchPlan(in, fake.Host());
  EXPECT_EQ(plan.stopped_limit_s, 30);
  EXPECT_EQ(plan.grace_period_s, 2);
  EXPECT_EQ(plan.max_restarts, 3);
  EXPECT_EQ(plan.workers[0].log_path, "/tmp/job/workerlog.0");
}

TEST(LaunchPlan, ContradictionsAreErrorsNamingTheFlags) {
  struct Case {
    std::string what, message;
    void (*edit)(LaunchInput*);
  };
  const std::vector<Case> cases = {
      {"no command", "no command to launch", [](LaunchInput* in) { in->command.clear(); }},
      {"negative grace", "--grace_period_s must be >= 0, got -1",
       [](LaunchInput* in) { in->grace_period_s = -1; }},
      {"negative restarts", "--max_restarts must be >= 0",
       [](LaunchInput* in) { in->max_restarts = -2; }},
      {"unknown backend", "--gpu_comm_backend must be auto, nccl or host, got 'mpi'",
       [](LaunchInput* in) {
         in->selected_gpus = "0";
         in->gpu_comm_backend = "mpi";
       }},
      {"bad gpu id", "'x' is not a GPU id", [](LaunchInput* in) { in->selected_gpus = "0,x"; }},
      {"empty gpu entry", "--selected_gpus='0,,1' has an empty entry",
       [](LaunchInput* in) { in->selected_gpus = "0,,1"; }},
      {"invisible gpu", "lists GPU 2, which CUDA_VISIBLE_DEVICES='0,1' does not make visible",
       [](LaunchInput* in) {
         in->selected_gpus = "2";
         in->env.push_back("CUDA_VISIBLE_DEVICES=0,1");
       }},
      {"gpus and nproc", "--nproc_per_node=3 but --selected_gpus='0,1' lists 2 GPU(s)",
       [](LaunchInput* in) {
         in->selected_gpus = "0,1";
         in->nproc_per_node = 3;
         in->set_flags.insert("nproc_per_node");
       }},
      {"zero nproc", "--nproc_per_node must be positive",
       [](LaunchInput* in) {
         in->nproc_per_node = 0;
         in->set_flags.insert("nproc_per_node");
       }},
      {"bad host", "--node_ip: 'a b' is not a host name or address",
       [](LaunchInput* in) { in->node_ip = "a b"; }},
      {"ip twice", "--cluster_node_ips='10.0.0.1,10.0.0.1' lists 10.0.0.1 twice",
       [](LaunchInput* in) { in->cluster_node_ips = "10.0.0.1,10.0.0.1"; }},
      {"nnodes and ips", "--nnodes=2 but --cluster_node_ips='10.0.0.1' lists 1 node ip(s)",
       [](LaunchInput* in) {
         in->cluster_node_ips = "10.0.0.1";
         in->nnodes = 2;
         in->set_flags.insert("nnodes");
       }},
      {"nodes unknown", "--nnodes=2 needs --cluster_node_ips",
       [](LaunchInput* in) {
         in->nnodes = 2;
         in->node_rank = 1;
         in->set_flags = {"nnodes", "node_rank"};
       }},
      {"master without rank", "needs --node_rank to say which node this is (0..1)",
       [](LaunchInput* in) {
         in->nnodes = 2;
         in->master_addr = "10.0.0.1";
         in->master_port = 7000;
         in->set_flags = {"nnodes", "master_port"};
       }},
      {"master without port", "needs --master_port, the same on every node",
       [](LaunchInput* in) {
         in->nnodes = 2;
         in->node_rank = 1;
         in->master_addr = "10.0.0.1";
         in->set_flags = {"nnodes", "node_rank"};
       }},
      {"rank out of range", "--node_rank=1 is out of range for --nnodes=1",
       [](LaunchInput* in) {
         in->node_rank = 1;
         in->set_flags.insert("node_rank");
       }},
      {"node ip not listed", "--node_ip=10.0.0.3 is not in --cluster_node_ips",
       [](LaunchInput* in) {
         in->cluster_node_ips = "10.0.0.1,10.0.0.2";
         in->node_ip = "10.0.0.3";
       }},
      {"node ip and rank disagree", "--node_rank=0 but --node_ip=10.0.0.2 is node 1",
       [](LaunchInput* in) {
         in->cluster_node_ips = "10.0.0.1,10.0.0.2";
         in->node_ip = "10.0.0.2";
         in->set_flags.insert("node_rank");
       }},
      {"which node", "needs --node_rank or --node_ip to say which node this is",
       [](LaunchInput* in) { in->cluster_node_ips = "10.0.0.1,10.0.0.2"; }},
      {"master not first",
       "--master_addr=10.0.0.2 but --cluster_node_ips='10.0.0.1,10.0.0.2' "
       "puts rank 0 on 10.0.0.1",
       [](LaunchInput* in) {
         in->cluster_node_ips = "10.0.0.1,10.0.0.2";
         in->master_addr = "10.0.0.2";
         in->set_flags.insert("node_rank");
       }},
      {"master elsewhere", "--master_addr=10.0.0.9 but rank 0 runs on this node",
       [](LaunchInput* in) {
         in->master_addr = "10.0.0.9";
         in->node_ip = "10.0.0.1";
       }},
      {"bad port", "--started_port=70000 is not a port (1..65535)",
       [](LaunchInput* in) {
         in->started_port = 70000;
         in->set_flags.insert("started_port");
       }},
      {"ports disagree", "--master_port=7001 but --started_port=7000 gives rank 0 port 7000",
       [](LaunchInput* in) {
         in->started_port = 7000;
         in->master_port = 7001;
         in->set_flags = {"started_port", "master_port"};
       }},
      {"ports past the end", "needs ports up to 65536, past 65535",
       [](LaunchInput* in) {
         in->started_port = 65535;
         in->nproc_per_node = 2;
         in->set_flags = {"started_port", "nproc_per_node"};
       }},
      {"nodes without ports", "needs --started_port (or --master_port)",
       [](LaunchInput* in) {
         in->cluster_node_ips = "10.0.0.1,10.0.0.2";
         in->set_flags.insert("node_rank");
       }},
      {"nodes without a token", "needs the same KEEL_JOB_TOKEN in every node's environment",
       [](LaunchInput* in) {
         in->cluster_node_ips = "10.0.0.1,10.0.0.2";
         in->started_port = 7000;
         in->set_flags = {"node_rank", "started_port"};
       }},
      {"empty log dir", "--log_dir must not be empty",
       [](LaunchInput* in) { in->set_flags.insert("log_dir"); }},
  };
  for (const Case& c : cases) {
    LaunchInput in = Input();
    c.edit(&in);
    std::string error = PlanError(in);
    EXPECT_NE(error.find(c.message), std::string::npos) << c.what << ": " << error;
  }
}

TEST(LaunchPlan, AnExecutableThatCannotBeFoundIsTheHostsError) {
  FakeHost fake;
  LaunchHost host = fake.Host();
  host.resolve_executable = [](const std::string& cmd, const char*) -> std::string {
    KEEL_THROW("cannot run command '", cmd, "': not found in PATH");
  };
  EXPECT_NE(ErrorOf([&] { MakeLaunchPlan(Input(), host); }).find("cannot run command 'train'"),
            std::string::npos);
}

// --server_num / --worker_num: servers first (ranks 0..S-1), then trainers, each with Paddle's
// parameter-server variables; logs serverlog.N / workerlog.N; trainer 0 on the console.
// --cpu_sched: auto is SCHED_BATCH for a parameter-server job only; batch and normal say so.
TEST(LaunchPlan, CpuSchedIsBatchForParameterServerJobsUnlessSaidOtherwise) {
  FakeHost fake;
  LaunchInput in = Input();
  EXPECT_FALSE(MakeLaunchPlan(in, fake.Host()).sched_batch);
  in.cpu_sched = "batch";
  EXPECT_TRUE(MakeLaunchPlan(in, fake.Host()).sched_batch);
  LaunchInput ps = Input();
  ps.server_num = 1;
  ps.worker_num = 1;
  EXPECT_TRUE(MakeLaunchPlan(ps, fake.Host()).sched_batch);
  ps.cpu_sched = "normal";
  EXPECT_FALSE(MakeLaunchPlan(ps, fake.Host()).sched_batch);
  for (LaunchInput* bad : {&in, &ps}) {
    bad->cpu_sched = "fifo";
    keel::testing::ExpectErrorContainsAll(
        ErrorOf([&] { MakeLaunchPlan(*bad, fake.Host()); }),
        {"--cpu_sched must be auto, batch or normal, got 'fifo'"});
  }
}

// --cpu_bind=cores: the launcher's CPUs dealt out in contiguous runs, in local rank order, to the
// workers (or the servers and trainers of this node); none binds nothing; fewer CPUs than
// processes, or another value, is an error naming the flag.
TEST(LaunchPlan, CpuBindDealsTheLaunchersCpusOutInRuns) {
  FakeHost fake;
  auto cpus_of = [](const LaunchPlan& plan) {
    std::vector<std::vector<int>> out;
    for (const LaunchWorker& w : plan.workers) out.push_back(w.cpus);
    return out;
  };
  LaunchInput in = Input(3);
  EXPECT_EQ(cpus_of(MakeLaunchPlan(in, fake.Host())),
            (std::vector<std::vector<int>>{{}, {}, {}}));  // none, the default
  in.cpu_bind = "cores";
  EXPECT_EQ(cpus_of(MakeLaunchPlan(in, fake.Host())),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3, 4}, {5, 6, 7}}));
  LaunchHost odd = fake.Host();
  odd.cpus = [] { return std::vector<int>{2, 3, 6, 7}; };  // a launcher under taskset -c 2,3,6,7
  in.nproc_per_node = 2;
  EXPECT_EQ(cpus_of(MakeLaunchPlan(in, odd)), (std::vector<std::vector<int>>{{2, 3}, {6, 7}}));
  LaunchInput ps = Input();
  ps.server_num = 1;
  ps.worker_num = 3;
  ps.cpu_bind = "cores";
  EXPECT_EQ(cpus_of(MakeLaunchPlan(ps, fake.Host())),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  in.nproc_per_node = 5;
  keel::testing::ExpectErrorContainsAll(
      ErrorOf([&] { MakeLaunchPlan(in, odd); }),
      {"--cpu_bind=cores", "5 processes", "only 4 CPU(s)", "--cpu_bind=none"});
  for (LaunchInput* bad : {&in, &ps}) {
    bad->cpu_bind = "numa";
    keel::testing::ExpectErrorContainsAll(ErrorOf([&] { MakeLaunchPlan(*bad, fake.Host()); }),
                                          {"--cpu_bind must be none or cores, got 'numa'"});
  }
}

TEST(LaunchPlan, ParameterServerModeGivesServersAndTrainersPaddlesVariables) {
  FakeHost fake;
  LaunchInput in = Input();
  in.server_num = 2;
  in.worker_num = 2;
  in.env.push_back("RANK=7");  // another launcher's: dropped
  LaunchPlan plan = MakeLaunchPlan(in, fake.Host());
  ASSERT_EQ(plan.workers.size(), 4u);
  EXPECT_EQ(plan.master, "127.0.0.1:41000");
  EXPECT_EQ(plan.console_local, 2);
  const std::vector<std::string> logs = {"log/serverlog.0", "log/serverlog.1", "log/workerlog.0",
                                         "log/workerlog.1"};
  for (int local = 0; local < 4; ++local) {
    SCOPED_TRACE(local);
    const LaunchWorker& w = plan.workers[local];
    EXPECT_EQ(w.rank, local);
    EXPECT_EQ(w.log_path, logs[local]);
    auto env = EnvOf(w);
    EXPECT_EQ(env["TRAINING_ROLE"], local < 2 ? "PSERVER" : "TRAINER");
    EXPECT_EQ(env["PADDLE_PSERVERS_IP_PORT_LIST"], "127.0.0.1:41000,127.0.0.1:41001");
    EXPECT_EQ(env["PADDLE_TRAINER_ENDPOINTS"], "127.0.0.1:41002,127.0.0.1:41003");
    EXPECT_EQ(env["PADDLE_TRAINERS_NUM"], "2");
    EXPECT_EQ(env["POD_IP"], "127.0.0.1");
    EXPECT_EQ(env["KEEL_JOB_TOKEN"], "feedc0de");
    EXPECT_EQ(env.count("RANK"), 0u);
    if (local < 2) {
      EXPECT_EQ(env["PADDLE_PORT"], std::to_string(41000 + local));
      EXPECT_EQ(env.count("PADDLE_TRAINER_ID"), 0u);
    } else {
      EXPECT_EQ(env["PADDLE_TRAINER_ID"], std::to_string(local - 2));
      EXPECT_EQ(env.count("PADDLE_PORT"), 0u);
    }
  }
  // What is not built is refused naming the flag.
  in.worker_num = 0;
  EXPECT_NE(PlanError(in).find("--worker_num=0"), std::string::npos);
  in.worker_num = 2;
  in.nnodes = 2;
  in.set_flags.insert("nnodes");
  EXPECT_NE(PlanError(in).find("--nnodes does not combine with a parameter-server launch"),
            std::string::npos);
  // --max_restarts restarts a parameter-server job as any other.
  in.nnodes = 1;
  in.set_flags.erase("nnodes");
  EXPECT_EQ(MakeLaunchPlan(in, fake.Host()).max_restarts, 0);
  in.max_restarts = 2;
  EXPECT_EQ(MakeLaunchPlan(in, fake.Host()).max_restarts, 2);
  in.max_restarts = -1;
  EXPECT_NE(PlanError(in).find("--max_restarts must be >= 0"), std::string::npos);
}

// --servers/--workers (Paddle fleetrun's): the same lists on every node; each node starts the
// processes at its address with their global ranks and Paddle's variables; the node of server 0
// serves the store. Contradictions are refused naming the flags.
TEST(LaunchPlan, ServersAndWorkersListsPlaceEachProcessOnItsNode) {
  FakeHost fake;
  LaunchInput in = Input();
  in.servers = "10.0.0.1:6170,10.0.0.2:6170";
  in.workers = "10.0.0.1:6171,10.0.0.2:6171,10.0.0.2:6172";
  in.env.push_back("KEEL_JOB_TOKEN=abc");
  in.node_ip = "10.0.0.2";
  LaunchPlan b = MakeLaunchPlan(in, fake.Host());
  EXPECT_TRUE(fake.free_port_calls.empty()) << "the ports are given";
  EXPECT_EQ(b.nnodes, 2);
  EXPECT_EQ(b.node_rank, 1);
  EXPECT_EQ(b.master, "10.0.0.1:6170");
  EXPECT_EQ(b.world(), 5);
  ASSERT_EQ(b.workers.size(), 3u);  // server 1, trainers 1 and 2
  const std::vector<int> ranks = {1, 3, 4};
  const std::vector<std::string> logs = {"log/serverlog.1", "log/workerlog.1", "log/workerlog.2"};
  for (int local = 0; local < 3; ++local) {
    SCOPED_TRACE(local);
    const LaunchWorker& w = b.workers[local];
    EXPECT_EQ(w.rank, ranks[local]);
    EXPECT_EQ(w.log_path, logs[local]);
    auto env = EnvOf(w);
    EXPECT_EQ(env["PADDLE_PSERVERS_IP_PORT_LIST"], in.servers);
    EXPECT_EQ(env["PADDLE_TRAINER_ENDPOINTS"], in.workers);
    EXPECT_EQ(env["PADDLE_TRAINERS_NUM"], "3");
    EXPECT_EQ(env["POD_IP"], "10.0.0.2");
    EXPECT_EQ(env["KEEL_JOB_TOKEN"], "abc");
    EXPECT_EQ(env["TRAINING_ROLE"], local == 0 ? "PSERVER" : "TRAINER");
    if (local > 0) {
      EXPECT_EQ(env["PADDLE_TRAINER_ID"], std::to_string(local));
    }
  }
  EXPECT_EQ(EnvOf(b.workers[0])["PADDLE_PORT"], "6170");
  EXPECT_EQ(b.console_local, 1);  // no trainer 0 here: its first trainer
  // Node 0 by POD_IP (Paddle's variable): server 0 (rank 0, the store) and trainer 0.
  in.node_ip.clear();
  in.env.push_back("POD_IP=10.0.0.1");
  LaunchPlan a = MakeLaunchPlan(in, fake.Host());
  EXPECT_EQ(a.node_rank, 0);
  ASSERT_EQ(a.workers.size(), 2u);
  EXPECT_EQ(a.workers[0].rank, 0);
  EXPECT_EQ(a.workers[1].rank, 2);
  EXPECT_EQ(a.console_local, 1);
  in.env.pop_back();
  // One address for all: that node starts them all, no --node_ip needed, no token either.
  LaunchInput one = Input();
  one.servers = "127.0.0.1:7000";
  one.workers = "127.0.0.1:7001,127.0.0.1:7002";
  LaunchPlan o = MakeLaunchPlan(one, fake.Host());
  EXPECT_EQ(o.workers.size(), 3u);
  EXPECT_EQ(o.nnodes, 1);
  // Refusals.
  auto refused = [&](LaunchInput x, const std::string& text) {
    const std::string e = PlanError(x);
    EXPECT_NE(e.find(text), std::string::npos) << "want '" << text << "' in: " << e;
  };
  refused(in, "give each node's own as --node_ip (or POD_IP)");
  LaunchInput x = in;
  x.node_ip = "10.0.0.9";
  refused(x, "this node's address 10.0.0.9 (--node_ip) is none of --servers/--workers'");
  x = in;
  x.node_ip = "10.0.0.1";
  x.workers.clear();
  refused(x, "--servers and --workers go together");
  x = in;
  x.node_ip = "10.0.0.1";
  x.workers = "10.0.0.1:6170";
  refused(x, "--workers: endpoint 10.0.0.1:6170 is listed twice");
  x = in;
  x.node_ip = "10.0.0.1";
  x.servers = "10.0.0.1";
  refused(x, "--servers");
  x = in;
  x.node_ip = "10.0.0.1";
  x.server_num = 2;
  x.set_flags.insert("server_num");
  refused(x, "--server_num/--worker_num do not combine with --servers/--workers");
  x = in;
  x.node_ip = "10.0.0.1";
  x.max_restarts = 1;
  refused(x, "--max_restarts=1 with --servers/--workers on 2 nodes is not built");
  x = in;
  x.node_ip = "10.0.0.1";
  x.env = {"PATH=/usr/bin"};
  refused(x, "needs KEEL_JOB_TOKEN set alike on every node");
}

}  // namespace
}  // namespace keel::cli
