// keel launch [flags] COMMAND [ARGS...]: starts this node's workers of a data-parallel job, each
// with its rank in the environment (Paddle's and torchrun's conventions both), and supervises
// them. This file holds the launcher's flags and reads them and the environment into a
// LaunchInput; the plan (launch_plan.h) says which workers run with what environment, the
// supervisor (launch_supervisor.h) runs and watches them, the sentinel (launch_sentinel.h) kills
// them if the launcher is killed, and process_util.h holds the POSIX helpers.
#include "python_free_cli/launch.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <map>
#include <string>
#include <vector>

#include "python_free_cli/commands.h"
#include "python_free_cli/launch_plan.h"
#include "python_free_cli/launch_supervisor.h"
#include "python_free_cli/process_util.h"

extern char** environ;

// --log_dir is glog's flag (declared in glog/logging.h); the launcher reuses it, default "log".
// --selected_gpus is defined in the library (fleet/role_maker.cc), so that FLAGS_selected_gpus in a
// worker's environment is a known flag there too.
DECLARE_string(selected_gpus);
DECLARE_string(gpu_comm_backend);
DEFINE_string(cluster_node_ips, "", "Every node's ip in node-rank order, e.g. 10.0.0.1,10.0.0.2.");
DEFINE_string(node_ip, "",
              "This node's ip: must be in --cluster_node_ips; single node: 127.0.0.1.");
DEFINE_int32(started_port, 0,
             "Local rank i on every node gets port started_port+i; 0: free ports on this node "
             "(single node only).");
DEFINE_int32(nproc_per_node, 1, "Workers on this node (default: the number of --selected_gpus).");
DEFINE_int32(nnodes, 1, "Nodes in the job (default: the number of --cluster_node_ips).");
DEFINE_int32(
    node_rank, 0,
    "This node's index in 0..nnodes-1 (default: --node_ip's place in --cluster_node_ips).");
DEFINE_string(master_addr, "", "Rank 0's ip, where it serves the rendezvous store.");
DEFINE_int32(master_port, 0, "Rank 0's port (default: --started_port, else a free port).");
DEFINE_int32(grace_period_s, 5, "Seconds from SIGTERM to SIGKILL when stopping workers.");
DEFINE_int32(max_restarts, 0,
             "Elastic restarts (torchrun's --max_restarts): when a worker fails, stop every "
             "worker and start them all again, up to this many times; each worker gets "
             "KEEL_RESTART_COUNT (keel train --save_dir resumes from its last checkpoint). 0: the "
             "first failure ends the job.");
DEFINE_int32(stopped_timeout_s, 0,
             "A worker stopped (state T: SIGSTOP, a debugger) this long fails the job; 0: the "
             "comm timeout (FLAGS_comm_timeout_s), after which its peers have failed anyway.");
DECLARE_int32(comm_timeout_s);
DEFINE_int32(server_num, 0, "Parameter servers on this node (docs/parameter-server.md).");
DEFINE_int32(worker_num, 0, "Trainers on this node, with --server_num.");
DEFINE_string(cpu_sched, "auto",
              "Workers' CPU policy: batch (SCHED_BATCH), normal, or auto: batch in a "
              "parameter-server job.");
DEFINE_string(cpu_bind, "none",
              "Workers' CPUs: none (the OS places them), or cores: each process on this node "
              "bound to its own run of the launcher's CPUs.");
DEFINE_string(servers, "", "Every parameter server, ip:port,... (fleetrun's; any node count).");
DEFINE_string(workers, "", "Every trainer, ip:port,...; a node starts those at its --node_ip.");

namespace keel {
namespace cli {

LaunchArgs SplitLaunchArgs(const std::vector<std::string>& args) {
  LaunchArgs out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;  // "-" or a word: the command
    out.flags.push_back(a);
    const size_t eq = a.find('=');
    std::string name =
        a.substr(a[1] == '-' ? 2 : 1,
                 eq == std::string::npos ? std::string::npos : eq - (a[1] == '-' ? 2 : 1));
    gflags::CommandLineFlagInfo info;
    const bool known = gflags::GetCommandLineFlagInfo(name.c_str(), &info);
    if (eq != std::string::npos) {
      out.given[name] = a.substr(eq + 1);
      continue;
    }
    if (known && info.type != "bool" && i + 1 < args.size()) {
      out.flags.push_back(args[++i]);  // `--flag value`
      out.given[name] = args[i];
    } else if (known) {
      out.given[name] = "true";
    } else if (name.compare(0, 2, "no") == 0 &&
               gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) &&
               info.type == "bool") {
      out.given[name.substr(2)] = "false";
    }
  }
  out.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
}

namespace {

// The launcher's flags and environment, as planning takes them.
LaunchInput InputFromFlags(const std::vector<std::string>& command,
                           const std::map<std::string, std::string>& given) {
  LaunchInput in;
  in.cluster_node_ips = FLAGS_cluster_node_ips;
  in.node_ip = FLAGS_node_ip;
  in.master_addr = FLAGS_master_addr;
  in.selected_gpus = FLAGS_selected_gpus;
  in.gpu_comm_backend = FLAGS_gpu_comm_backend;
  in.log_dir = FLAGS_log_dir;
  in.started_port = FLAGS_started_port;
  in.nproc_per_node = FLAGS_nproc_per_node;
  in.nnodes = FLAGS_nnodes;
  in.node_rank = FLAGS_node_rank;
  in.master_port = FLAGS_master_port;
  in.grace_period_s = FLAGS_grace_period_s;
  in.cpu_sched = FLAGS_cpu_sched;
  in.cpu_bind = FLAGS_cpu_bind;
  in.max_restarts = FLAGS_max_restarts;
  in.stopped_timeout_s = FLAGS_stopped_timeout_s;
  in.comm_timeout_s = FLAGS_comm_timeout_s;
  in.server_num = FLAGS_server_num;
  in.worker_num = FLAGS_worker_num;
  in.servers = FLAGS_servers;
  in.workers = FLAGS_workers;
  for (const char* name : {"server_num", "worker_num", "nproc_per_node", "nnodes", "node_rank",
                           "started_port", "master_port", "log_dir"}) {
    gflags::CommandLineFlagInfo info;
    CHECK(gflags::GetCommandLineFlagInfo(name, &info)) << name;
    if (!info.is_default) in.set_flags.insert(name);
  }
  in.given = given;
  in.command = command;
  for (char** e = environ; e && *e; ++e) in.env.emplace_back(*e);
  return in;
}

// This machine, as planning asks it.
LaunchHost SystemHost() {
  LaunchHost host;
  host.free_ports = FreePorts;
  host.resolve_executable = ResolveExecutable;
  host.cpu_count = CpuCount;
  host.cpus = AffinityCpus;
  host.random_token = RandomToken;
  host.is_worker_flag = [](const std::string& name) {
    gflags::CommandLineFlagInfo info;
    return gflags::GetCommandLineFlagInfo(name.c_str(), &info) &&
           info.filename.find("gflags") == std::string::npos;
  };
  return host;
}

}  // namespace

int Launch(const std::vector<std::string>& command,
           const std::map<std::string, std::string>& given) {
  return SuperviseWorkers(MakeLaunchPlan(InputFromFlags(command, given), SystemHost()));
}

}  // namespace cli
}  // namespace keel
