// keel launch's plan: from the launcher's flags and environment to this node's workers, each with
// its rank and environment, and the endpoints the job meets at. Planning is pure: it starts no
// process and reads no global state. What it needs from the machine (free ports, the command's
// path, the number of cores, a random token, which flags the workers know) it asks a LaunchHost,
// which tests answer themselves (tests/cli/launch_plan_test.cc); launch.cc fills LaunchInput
// from gflags and the real environment and gives the plan to the supervisor
// (launch_supervisor.h).
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace keel {
namespace cli {

// What keel launch was asked to do.
struct LaunchInput {
  // The launcher's flags (launch.cc defines them; --selected_gpus, --gpu_comm_backend and
  // --comm_timeout_s are the library's, --log_dir is glog's), with their defaults.
  std::string cluster_node_ips, node_ip, master_addr, selected_gpus, log_dir;
  std::string gpu_comm_backend = "auto";
  int started_port = 0, nproc_per_node = 1, nnodes = 1, node_rank = 0, master_port = 0;
  int grace_period_s = 5, max_restarts = 0, stopped_timeout_s = 0, comm_timeout_s = 300;
  // The workers' CPU scheduling policy: "batch" (SCHED_BATCH), "normal" (SCHED_OTHER, as the
  // launcher runs), or "auto" (batch for a parameter-server job, normal otherwise).
  std::string cpu_sched = "auto";
  // The workers' CPUs: "none" (the OS places them) or "cores" (each process of this node bound to
  // its own contiguous run of the launcher's CPUs, LaunchWorker::cpus).
  std::string cpu_bind = "none";
  // Parameter-server mode (docs/parameter-server.md): server_num servers and worker_num trainers
  // on this node, with Paddle's parameter-server variables; 0 and 0: a collective job.
  int server_num = 0, worker_num = 0;
  // Or every server's and trainer's endpoint ("ip:port,..."; Paddle fleetrun's --servers and
  // --workers): the same on every node, each node starting those at its --node_ip (or POD_IP).
  std::string servers, workers;
  // The names of those flags that are set (on the command line or by FLAGS_ variables) rather
  // than left at their defaults: "--nnodes=1" and no --nnodes mean different things.
  std::set<std::string> set_flags;
  // The flags given before the command, as typed (LaunchArgs::given, launch.h).
  std::map<std::string, std::string> given;
  // COMMAND ARGS...
  std::vector<std::string> command;
  // The launcher's environment, "NAME=value" entries as `environ` holds them.
  std::vector<std::string> env;
};

// What planning asks of the machine.
struct LaunchHost {
  // `count` distinct ports that are free on this node now, none of them `exclude`.
  std::function<std::vector<int>(int count, int exclude)> free_ports;
  // `command` as execve needs it: a path with a '/' as is, else the first executable found in
  // `path` (the PATH variable's value; nullptr when unset). A keel::Error when there is none.
  std::function<std::string(const std::string& command, const char* path)> resolve_executable;
  // The cores this process may run on: how many, and their ids in increasing order.
  std::function<int()> cpu_count;
  std::function<std::vector<int>()> cpus;
  // A fresh random job token.
  std::function<std::string()> random_token;
  // Whether the workers may be given flag `name`: a flag keel defines (not gflags' own, such as
  // --help or --flagfile). Asked only of flags that are not the launcher's own.
  std::function<bool(const std::string& name)> is_worker_flag;
};

// One worker of this node.
struct LaunchWorker {
  int local = 0, rank = 0;
  // Its whole environment ("NAME=value"): the launcher's, with the worker's identity set. The
  // supervisor adds the restart count of each attempt, the status pipe and, for rank 0, the
  // store's listening socket (launch_supervisor.cc).
  std::vector<std::string> env;
  std::string role;  // parameter-server mode: "server 1", "trainer 0" (how errors name it)
  // The CPUs it is bound to (--cpu_bind=cores); empty: wherever the OS puts it.
  std::vector<int> cpus;
  std::string log_path;  // LOG_DIR/workerlog.<local> (parameter-server mode: serverlog.<i> for
                         // server i, workerlog.<j> for trainer j)
};

struct LaunchPlan {
  int nnodes = 1, node_rank = 0, nproc_per_node = 1;
  std::vector<std::string> endpoints;  // world size entries, "ip:port", in rank order; empty
                                       // when nodes meet at --master_addr (other ips unknown)
  std::string master;                  // rank 0's "ip:port", where it serves the store
  std::vector<int> gpus;               // FLAGS_selected_gpus per local rank; empty on CPU
  std::string token;
  std::string cpu_math_threads;  // empty: the environment already sets it
  // Flags given to the launcher for the workers: FLAGS_name=value in their environment.
  std::vector<std::pair<std::string, std::string>> worker_flags;
  std::string log_dir;
  std::vector<std::string> command;
  std::string executable;  // command[0] resolved against PATH
  int grace_period_s = 5;  // from SIGTERM to SIGKILL when stopping workers
  // The workers run under SCHED_BATCH (sched(7)): one woken by a message does not preempt the
  // one running (docs/launch.md, --cpu_sched).
  bool sched_batch = false;
  int max_restarts = 0;
  double stopped_limit_s = 300;       // a worker stopped (state T) this long fails the job
  std::vector<LaunchWorker> workers;  // local rank order
  int console_local = 0;              // whose output is copied to the console (trainer 0 in
                                      // parameter-server mode)
  int world() const {
    return endpoints.empty() ? nnodes * nproc_per_node : static_cast<int>(endpoints.size());
  }
  int rank(int local) const { return node_rank * nproc_per_node + local; }
};

// Checks the input for contradictions (a keel::Error naming the flags) and plans the launch.
LaunchPlan MakeLaunchPlan(const LaunchInput& in, const LaunchHost& host);

}  // namespace cli
}  // namespace keel
