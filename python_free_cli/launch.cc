// keel launch [flags] COMMAND [ARGS...]: starts this node's workers of a data-parallel job, each
// with its rank in the environment (Paddle's and torchrun's conventions both), and supervises
// them: rank 0's output is copied to the console, every worker's goes to LOG_DIR/workerlog.N, a
// failing worker stops all the others and is named with the tail of its log, and SIGINT/SIGTERM/
// SIGHUP are forwarded.
//
// Process layout: every worker is its own process group (so the launcher can signal a worker's
// whole tree, e.g. `sh -c '...; sleep 30'`, and a terminal's Ctrl-C reaches the workers exactly
// once, through the launcher); workers die with the launcher (PR_SET_PDEATHSIG). The launcher is
// one thread: signals are blocked and read from a signalfd in the same poll() as rank 0's pipe.
#include "python_free_cli/launch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "framework/error.h"
#include "python_free_cli/commands.h"

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

bool IsLaunchFlag(const std::string& name) {
  static const std::set<std::string> own = {
      "cluster_node_ips", "node_ip",   "started_port",  "nproc_per_node",
      "nnodes",           "node_rank", "master_addr",   "master_port",
      "grace_period_s",   "log_dir",   "selected_gpus", "cpu_math_threads",
      "max_restarts",     "stopped_timeout_s"};
  return own.count(name) > 0;
}

namespace {

// ---------------------------------------------------------------------------------------------
// The plan: who runs where, computed from the flags and checked for contradictions.

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
  std::string executable;  // command[0] resolved against PATH
  int world() const { return nnodes * nproc_per_node; }
  int rank(int local) const { return node_rank * nproc_per_node + local; }
};

bool FlagSet(const char* name) {
  gflags::CommandLineFlagInfo info;
  CHECK(gflags::GetCommandLineFlagInfo(name, &info)) << name;
  return !info.is_default;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// "a,b,c" -> {a, b, c}; an empty entry is an error naming the flag.
std::vector<std::string> SplitList(const std::string& flag, const std::string& value) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = value.find(',', start);
    std::string item = Trim(value.substr(start, comma - start));
    KEEL_ENFORCE(!item.empty(), flag, "='", value, "' has an empty entry");
    out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void CheckHost(const std::string& flag, const std::string& host) {
  KEEL_ENFORCE(!host.empty() && host.find_first_of(" \t:,") == std::string::npos, flag, ": '", host,
               "' is not an IPv4 address or host name");
}

void CheckPort(const char* flag, int port) {
  KEEL_ENFORCE(port >= 1 && port <= 65535, "--", flag, "=", port, " is not a port (1..65535)");
}

// One worker per listed GPU. A GPU listed twice puts two ranks on it, which NCCL refuses
// ("Duplicate GPU"): only with --gpu_comm_backend=host or auto (which then stages collectives
// through host memory). Returns the ids the workers see: unchanged, or their index in
// CUDA_VISIBLE_DEVICES when that is set.
std::vector<int> SelectedGpus(const std::string& backend) {
  KEEL_ENFORCE(backend == "auto" || backend == "nccl" || backend == "host",
               "--gpu_comm_backend must be auto, nccl or host, got '", backend, "'");
  std::vector<int> gpus;
  if (FLAGS_selected_gpus.empty()) return gpus;
  for (const std::string& s : SplitList("--selected_gpus", FLAGS_selected_gpus)) {
    KEEL_ENFORCE(s.find_first_not_of("0123456789") == std::string::npos && s.size() < 6,
                 "--selected_gpus='", FLAGS_selected_gpus, "': '", s, "' is not a GPU id");
    int g = std::stoi(s);
    KEEL_ENFORCE(backend != "nccl" || std::find(gpus.begin(), gpus.end(), g) == gpus.end(),
                 "--selected_gpus='", FLAGS_selected_gpus, "' lists GPU ", g,
                 " twice, but --gpu_comm_backend=nccl cannot put two ranks on one GPU (NCCL: "
                 "\"Duplicate GPU\"); use --gpu_comm_backend=host");
    gpus.push_back(g);
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return gpus;
  std::vector<std::string> ids;
  if (!Trim(visible).empty()) ids = SplitList("CUDA_VISIBLE_DEVICES", visible);
  for (int& g : gpus) {
    auto it = std::find(ids.begin(), ids.end(), std::to_string(g));
    KEEL_ENFORCE(it != ids.end(), "--selected_gpus='", FLAGS_selected_gpus, "' lists GPU ", g,
                 ", which CUDA_VISIBLE_DEVICES='", visible, "' does not make visible");
    g = static_cast<int>(it - ids.begin());
  }
  return gpus;
}

// `count` distinct ports that are free on this node now (bound together, then released).
std::vector<int> FreePorts(int count, int exclude) {
  std::vector<int> fds, ports;
  auto close_all = [&] {
    for (int fd : fds) close(fd);
  };
  while (static_cast<int>(ports.size()) < count) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      close_all();
      KEEL_THROW("cannot open a socket to find a free port: ", std::strerror(errno));
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      int err = errno;
      close_all();
      KEEL_THROW("cannot find a free port (bind to port 0): ", std::strerror(err),
                 "; pass --started_port");
    }
    int port = ntohs(addr.sin_port);
    if (port != exclude) ports.push_back(port);
  }
  close_all();
  return ports;
}

// command[0] as execve needs it: a path with a '/' as is, else the first executable in PATH.
std::string ResolveExecutable(const std::string& cmd) {
  auto runnable = [](const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
  };
  if (cmd.find('/') != std::string::npos) {
    struct stat st;
    KEEL_ENFORCE(stat(cmd.c_str(), &st) == 0, "cannot run command '", cmd,
                 "': ", std::strerror(errno));
    KEEL_ENFORCE(S_ISREG(st.st_mode), "cannot run command '", cmd, "': not a regular file");
    KEEL_ENFORCE(access(cmd.c_str(), X_OK) == 0, "cannot run command '", cmd,
                 "': not executable (chmod +x?)");
    return cmd;
  }
  const char* env_path = std::getenv("PATH");
  std::string path = env_path ? env_path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (true) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + cmd;
    if (runnable(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  KEEL_THROW("cannot run command '", cmd, "': not found in PATH (", path, ")");
}

std::string RandomToken() {
  std::random_device rd;  // /dev/urandom (getrandom) on Linux
  static const char* kHex = "0123456789abcdef";
  std::string token;
  for (int i = 0; i < 4; ++i) {
    uint32_t v = rd();
    for (int b = 0; b < 8; ++b, v >>= 4) token += kHex[v & 0xF];
  }
  return token;
}

int CpuCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The flags given before the command that are not the launcher's own, for the workers. A flag
// also given in the command itself (where the worker would take that one) is refused.
std::vector<std::pair<std::string, std::string>> WorkerFlags(
    const std::map<std::string, std::string>& given, const std::vector<std::string>& command) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, value] : given) {
    gflags::CommandLineFlagInfo info;
    if (IsLaunchFlag(name) || !gflags::GetCommandLineFlagInfo(name.c_str(), &info) ||
        info.filename.find("gflags") != std::string::npos)
      continue;  // the launcher's own, or gflags' (--help, --flagfile, ...)
    for (size_t i = 1; i < command.size(); ++i) {
      const std::string& a = command[i];
      for (const std::string& spelled : {"-" + name, "--" + name, "-no" + name, "--no" + name})
        KEEL_ENFORCE(a != spelled && a.rfind(spelled + "=", 0) != 0, "--", name, "=", value,
                     " is given to keel launch (for every worker) and '", a,
                     "' to the command; give it once");
    }
    out.emplace_back(name, value);
  }
  return out;
}

LaunchPlan MakePlan(const std::vector<std::string>& command,
                    const std::map<std::string, std::string>& given) {
  KEEL_ENFORCE(!command.empty(),
               "no command to launch; usage: keel launch [flags] COMMAND [ARGS...], "
               "e.g. keel launch --nproc_per_node=2 keel train --steps=5");
  LaunchPlan plan;
  KEEL_ENFORCE(FLAGS_grace_period_s >= 0, "--grace_period_s must be >= 0, got ",
               FLAGS_grace_period_s);
  KEEL_ENFORCE(FLAGS_max_restarts >= 0, "--max_restarts must be >= 0, got ", FLAGS_max_restarts);
  KEEL_ENFORCE(FLAGS_stopped_timeout_s >= 0, "--stopped_timeout_s must be >= 0, got ",
               FLAGS_stopped_timeout_s);

  // Workers on this node.
  plan.gpus = SelectedGpus(given.count("gpu_comm_backend") ? given.at("gpu_comm_backend")
                                                          : FLAGS_gpu_comm_backend);
  int ngpus = static_cast<int>(plan.gpus.size());
  plan.nproc_per_node = FLAGS_nproc_per_node;
  if (FlagSet("nproc_per_node")) {
    KEEL_ENFORCE(plan.nproc_per_node > 0, "--nproc_per_node must be positive, got ",
                 plan.nproc_per_node);
    KEEL_ENFORCE(ngpus == 0 || ngpus == plan.nproc_per_node,
                 "--nproc_per_node=", plan.nproc_per_node, " but --selected_gpus='",
                 FLAGS_selected_gpus, "' lists ", ngpus,
                 " GPU(s); GPU mode runs one worker per GPU");
  } else if (ngpus > 0) {
    plan.nproc_per_node = ngpus;
  }
  const int nproc = plan.nproc_per_node;

  // Nodes, and which one this is.
  std::vector<std::string> ips;
  if (!FLAGS_cluster_node_ips.empty()) {
    ips = SplitList("--cluster_node_ips", FLAGS_cluster_node_ips);
    for (size_t i = 0; i < ips.size(); ++i) {
      CheckHost("--cluster_node_ips", ips[i]);
      KEEL_ENFORCE(std::find(ips.begin(), ips.begin() + i, ips[i]) == ips.begin() + i,
                   "--cluster_node_ips='", FLAGS_cluster_node_ips, "' lists ", ips[i], " twice");
    }
  }
  if (!FLAGS_node_ip.empty()) CheckHost("--node_ip", FLAGS_node_ip);
  if (!FLAGS_master_addr.empty()) CheckHost("--master_addr", FLAGS_master_addr);
  plan.nnodes = FLAGS_nnodes;
  if (FlagSet("nnodes")) {
    KEEL_ENFORCE(plan.nnodes > 0, "--nnodes must be positive, got ", plan.nnodes);
    KEEL_ENFORCE(ips.empty() || static_cast<int>(ips.size()) == plan.nnodes,
                 "--nnodes=", plan.nnodes, " but --cluster_node_ips='", FLAGS_cluster_node_ips,
                 "' lists ", ips.size(), " node ip(s)");
  } else if (!ips.empty()) {
    plan.nnodes = static_cast<int>(ips.size());
  }
  // Several nodes meet either by --cluster_node_ips (every node's ip known: Paddle's endpoints)
  // or at --master_addr:--master_port (torchrun's way: each node knows only rank 0's).
  const bool by_master = plan.nnodes > 1 && ips.empty() && !FLAGS_master_addr.empty();
  KEEL_ENFORCE(plan.nnodes == 1 || !ips.empty() || by_master, "--nnodes=", plan.nnodes,
               " needs --cluster_node_ips listing every node's ip in node-rank order, or "
               "--master_addr and --master_port of rank 0's node (the launcher does not "
               "discover other nodes)");
  bool rank_set = FlagSet("node_rank");
  KEEL_ENFORCE(!by_master || rank_set, "a multi-node launch at --master_addr=", FLAGS_master_addr,
               " needs --node_rank to say which node this is (0..", plan.nnodes - 1, ")");
  KEEL_ENFORCE(!by_master || FlagSet("master_port"),
               "a multi-node launch at --master_addr=", FLAGS_master_addr,
               " needs --master_port, the same on every node");
  plan.node_rank = FLAGS_node_rank;
  KEEL_ENFORCE(plan.node_rank >= 0 && plan.node_rank < plan.nnodes, "--node_rank=", plan.node_rank,
               " is out of range for --nnodes=", plan.nnodes, " (0..", plan.nnodes - 1, ")");
  if (!ips.empty()) {
    if (!FLAGS_node_ip.empty()) {
      auto it = std::find(ips.begin(), ips.end(), FLAGS_node_ip);
      KEEL_ENFORCE(it != ips.end(), "--node_ip=", FLAGS_node_ip, " is not in --cluster_node_ips='",
                   FLAGS_cluster_node_ips, "'");
      int index = static_cast<int>(it - ips.begin());
      KEEL_ENFORCE(!rank_set || index == plan.node_rank, "--node_rank=", plan.node_rank,
                   " but --node_ip=", FLAGS_node_ip, " is node ", index, " in --cluster_node_ips='",
                   FLAGS_cluster_node_ips, "'");
      plan.node_rank = index;
    } else {
      KEEL_ENFORCE(plan.nnodes == 1 || rank_set, "a multi-node launch (--nnodes=", plan.nnodes,
                   ") needs --node_rank or --node_ip to say which node this is");
    }
    KEEL_ENFORCE(FLAGS_master_addr.empty() || FLAGS_master_addr == ips[0],
                 "--master_addr=", FLAGS_master_addr, " but --cluster_node_ips='",
                 FLAGS_cluster_node_ips, "' puts rank 0 on ", ips[0]);
  } else if (!by_master) {
    KEEL_ENFORCE(
        FLAGS_master_addr.empty() || FLAGS_node_ip.empty() || FLAGS_master_addr == FLAGS_node_ip,
        "--master_addr=", FLAGS_master_addr,
        " but rank 0 runs on this node, --node_ip=", FLAGS_node_ip);
    ips.push_back(!FLAGS_node_ip.empty()       ? FLAGS_node_ip
                  : !FLAGS_master_addr.empty() ? FLAGS_master_addr
                                               : "127.0.0.1");
  }

  // Ports: local rank i gets base+i on every node, or free ports on a single node.
  int base = 0;
  if (FlagSet("started_port")) {
    base = FLAGS_started_port;
    CheckPort("started_port", base);
  }
  if (FlagSet("master_port")) {
    CheckPort("master_port", FLAGS_master_port);
    KEEL_ENFORCE(base == 0 || FLAGS_master_port == base, "--master_port=", FLAGS_master_port,
                 " but --started_port=", base, " gives rank 0 port ", base);
    if (plan.nnodes > 1) base = FLAGS_master_port;
  }
  KEEL_ENFORCE(plan.nnodes == 1 || base > 0, "a multi-node launch (--nnodes=", plan.nnodes,
               ") needs --started_port (or --master_port) so that every node computes the same "
               "endpoints");
  std::vector<int> ports;
  if (base > 0) {
    KEEL_ENFORCE(base + nproc - 1 <= 65535, "--started_port=", base,
                 " with --nproc_per_node=", nproc, " needs ports up to ", base + nproc - 1,
                 ", past 65535");
    for (int i = 0; i < nproc; ++i) ports.push_back(base + i);
  } else if (FlagSet("master_port")) {
    ports = FreePorts(nproc - 1, FLAGS_master_port);
    ports.insert(ports.begin(), FLAGS_master_port);
  } else {
    ports = FreePorts(nproc, 0);
  }
  for (const std::string& ip : ips)
    for (int port : ports) plan.endpoints.push_back(ip + ":" + std::to_string(port));
  plan.master =
      by_master ? FLAGS_master_addr + ":" + std::to_string(FLAGS_master_port) : plan.endpoints[0];

  // One token per job: every node's launcher must be given the same one.
  const char* token = std::getenv("KEEL_JOB_TOKEN");
  if (token != nullptr && *token != '\0') {
    plan.token = token;
  } else {
    KEEL_ENFORCE(plan.nnodes == 1, "a multi-node launch (--nnodes=", plan.nnodes,
                 ") needs the same KEEL_JOB_TOKEN in every node's environment, e.g. "
                 "export KEEL_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')");
    plan.token = RandomToken();
  }

  // --cpu_math_threads given to the launcher is each worker's; else FLAGS_cpu_math_threads from
  // the environment; else the cores shared out.
  if (given.count("cpu_math_threads")) {
    plan.cpu_math_threads = given.at("cpu_math_threads");
  } else if (std::getenv("FLAGS_cpu_math_threads") == nullptr) {
    plan.cpu_math_threads = std::to_string(std::max(1, CpuCount() / nproc));
  }
  plan.worker_flags = WorkerFlags(given, command);
  plan.log_dir = FlagSet("log_dir") ? FLAGS_log_dir : "log";
  KEEL_ENFORCE(!plan.log_dir.empty(), "--log_dir must not be empty");
  plan.executable = ResolveExecutable(command[0]);
  return plan;
}

// The parent's environment with this worker's identity set. Another launcher's per-process rank
// variables (the launcher itself may be an OpenMPI or Slurm task) are dropped: they describe the
// launcher, not the worker.
std::vector<std::string> WorkerEnv(const LaunchPlan& plan, int local) {
  int rank = plan.rank(local);
  std::string eps;
  for (const std::string& ep : plan.endpoints) eps += (eps.empty() ? "" : ",") + ep;
  const std::string& master = plan.master;
  std::vector<std::pair<std::string, std::string>> set;
  if (!plan.endpoints.empty()) {  // Paddle's variables need every rank's endpoint
    set = {{"PADDLE_TRAINER_ID", std::to_string(rank)},
           {"PADDLE_TRAINERS_NUM", std::to_string(plan.world())},
           {"PADDLE_TRAINER_ENDPOINTS", eps},
           {"PADDLE_CURRENT_ENDPOINT", plan.endpoints[rank]}};
  }
  const std::vector<std::pair<std::string, std::string>> torchrun = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(plan.world())},
      {"LOCAL_RANK", std::to_string(local)},
      {"LOCAL_WORLD_SIZE", std::to_string(plan.nproc_per_node)},
      {"MASTER_ADDR", master.substr(0, master.rfind(':'))},
      {"MASTER_PORT", master.substr(master.rfind(':') + 1)},
      {"KEEL_JOB_TOKEN", plan.token},
  };
  set.insert(set.end(), torchrun.begin(), torchrun.end());
  if (!plan.gpus.empty()) set.push_back({"FLAGS_selected_gpus", std::to_string(plan.gpus[local])});
  if (!plan.cpu_math_threads.empty())
    set.push_back({"FLAGS_cpu_math_threads", plan.cpu_math_threads});
  std::string names;
  for (const auto& [name, value] : plan.worker_flags) {
    set.push_back({"FLAGS_" + name, value});
    names += (names.empty() ? "" : ",") + name;
  }
  if (!names.empty()) set.push_back({"KEEL_LAUNCH_FLAGS", names});
  std::set<std::string> drop = {
      "OMPI_COMM_WORLD_RANK",       "OMPI_COMM_WORLD_SIZE",   "OMPI_COMM_WORLD_LOCAL_RANK",
      "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID",           "SLURM_LOCALID",
      "KEEL_LAUNCH_FLAGS",          "PADDLE_TRAINER_ID",      "PADDLE_TRAINERS_NUM",
      "PADDLE_TRAINER_ENDPOINTS",   "PADDLE_CURRENT_ENDPOINT"};
  for (const auto& kv : set) drop.insert(kv.first);
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq && drop.count(std::string(*e, static_cast<size_t>(eq - *e)))) continue;
    env.emplace_back(*e);
  }
  for (const auto& kv : set) env.push_back(kv.first + "=" + kv.second);
  return env;
}

// ---------------------------------------------------------------------------------------------
// Running and supervising the workers.

const char* SignalName(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "signal";
  }
}

bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The last `n` lines of a file (reading at most its last 64 KiB).
std::string LogTail(const std::string& path, int n) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  off_t size = std::max<off_t>(0, lseek(fd, 0, SEEK_END));
  off_t from = std::max<off_t>(0, size - 65536);
  std::string text(static_cast<size_t>(size - from), '\0');
  ssize_t got = pread(fd, text.data(), text.size(), from);
  close(fd);
  text.resize(got > 0 ? static_cast<size_t>(got) : 0);
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (int lines = 0; pos > 0; --pos)
    if (text[pos - 1] == '\n' && ++lines == n) break;
  return text.substr(pos);
}

int OpenHigh(const std::string& path, int flags, mode_t mode = 0644) {
  int fd = open(path.c_str(), flags | O_CLOEXEC, mode);
  KEEL_ENFORCE(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  if (fd <= 2) {  // keep 0-2 free so dup2 in the child never meets itself
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    fd = high;
  }
  return fd;
}

using Clock = std::chrono::steady_clock;

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

struct Worker {
  int local = 0, rank = 0;
  pid_t pid = -1;  // also its process group id
  bool alive = false;
  int status = 0;
  bool reaped_after_kill = false;  // it may have died of the launcher's own SIGKILL
  std::string log_path;
  int log_fd = -1;
  // When a process of its group was first seen stopped (state T or t), if it still is.
  bool stopped = false, stopped_logged = false;
  Clock::time_point stopped_since;
  double stopped_for_s = 0;  // how long it had been stopped when the job failed
  bool stopped_too_long = false;
};

// Every process of the process groups `groups` with its state letter ('R', 'S', 'T', 'Z', ...),
// read from /proc.
struct ProcState {
  char state;
  pid_t pid, pgrp;
};
std::vector<ProcState> ProcessesOfGroups(const std::set<pid_t>& groups) {
  std::vector<ProcState> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string path = std::string("/proc/") + e->d_name + "/stat";
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[512];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) continue;
    buf[n] = '\0';
    // pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
    char* close_paren = std::strrchr(buf, ')');
    if (close_paren == nullptr) continue;
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (std::sscanf(close_paren + 1, " %c %d %d", &state, &ppid, &pgrp) != 3) continue;
    if (groups.count(pgrp))
      out.push_back({state, static_cast<pid_t>(std::atoi(e->d_name)), static_cast<pid_t>(pgrp)});
  }
  closedir(d);
  return out;
}

class Supervisor {
 public:
  Supervisor(const LaunchPlan& plan, const std::vector<std::string>& command)
      : plan_(plan), command_(command) {}

  int Run() {
    std::filesystem::path dir(plan_.log_dir);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    KEEL_ENFORCE(!ec, "--log_dir=", plan_.log_dir, ": cannot create it: ", ec.message());
    BlockSignals();
    // Orphans of a worker (`sh -c 'x & wait'`) become the launcher's children, not init's.
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    for (int local = 0; local < plan_.nproc_per_node; ++local) {
      Worker w;
      w.local = local;
      w.rank = plan_.rank(local);
      w.log_path = (dir / ("workerlog." + std::to_string(local))).string();
      w.log_fd = OpenHigh(w.log_path, O_WRONLY | O_CREAT | O_TRUNC);
      workers_.push_back(w);
    }
    StartSentinel();
    std::fprintf(
        stderr,
        "keel launch: %d worker(s), ranks %d..%d of %d, rank 0 at %s; logs in %s/workerlog.N\n",
        plan_.nproc_per_node, plan_.rank(0), plan_.rank(plan_.nproc_per_node - 1), plan_.world(),
        plan_.master.c_str(), plan_.log_dir.c_str());
    for (int attempt = 0;; ++attempt) {
      restart_ = attempt;
      for (Worker& w : workers_) Spawn(&w);
      Monitor();
      const Worker* cause = RootCause();
      if (cause != nullptr && stop_signal_ == 0 && attempt < FLAGS_max_restarts) {
        std::fprintf(stderr, "keel launch: restart %d of %d: %s; restarting all %zu worker(s)\n",
                     attempt + 1, FLAGS_max_restarts, Describe(*cause).c_str(), workers_.size());
        for (Worker& w : workers_) {
          std::string mark = StrCat("---- keel launch: restart ", attempt + 1, " of ",
                                    FLAGS_max_restarts, " (", Describe(*cause), ") ----\n");
          WriteAll(w.log_fd, mark.data(), mark.size());
        }
        ResetAttempt();
        continue;
      }
      int rc = Report();
      for (Worker& w : workers_) close(w.log_fd);
      StopSentinel();
      return rc;
    }
  }

 private:
  // SIGCHLD and the forwarded signals arrive through a signalfd; SIGPIPE is blocked so that a
  // closed console gives EPIPE instead of killing the launcher. A signal the launcher inherited
  // as ignored (nohup, `&` in a script) stays ignored.
  void BlockSignals() {
    sigset_t handled, blocked;
    sigemptyset(&handled);
    sigaddset(&handled, SIGCHLD);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old;
      sigaction(sig, nullptr, &old);
      if (old.sa_handler != SIG_IGN) sigaddset(&handled, sig);
    }
    blocked = handled;
    sigaddset(&blocked, SIGPIPE);
    PCHECK(sigprocmask(SIG_BLOCK, &blocked, &old_mask_) == 0);
    signal_fd_ = signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
    PCHECK(signal_fd_ >= 0);
  }

  // The sentinel: a small child that outlives a SIGKILL of the launcher. The launcher tells it
  // each worker's process group through a pipe only the launcher holds; when the pipe reaches end
  // of file without a goodbye (the launcher died), it kills every group it was told of, so no
  // worker (nor a worker's child, e.g. under an `sh -c` wrapper) is left training as an orphan.
  void StartSentinel() {
    int fds[2];
    PCHECK(pipe2(fds, O_CLOEXEC) == 0);
    pid_t pid = fork();
    PCHECK(pid >= 0);
    if (pid == 0) {
      close(fds[1]);
      setpgid(0, 0);  // out of the terminal's way: Ctrl-C reaches the launcher, not this
      signal(SIGINT, SIG_IGN);
      signal(SIGTERM, SIG_IGN);
      signal(SIGHUP, SIG_IGN);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      std::vector<pid_t> groups;
      std::string line;
      char c;
      while (true) {
        ssize_t n = read(fds[0], &c, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (c != '\n') {
          line += c;
          continue;
        }
        if (line == "bye") _exit(0);
        pid_t g = static_cast<pid_t>(std::atoi(line.c_str() + 1));
        if (line[0] == '+') groups.push_back(g);
        if (line[0] == '-')
          groups.erase(std::remove(groups.begin(), groups.end(), g), groups.end());
        line.clear();
      }
      for (pid_t g : groups) {
        kill(-g, SIGKILL);
        kill(-g, SIGCONT);
      }
      _exit(0);
    }
    close(fds[0]);
    sentinel_pid_ = pid;
    sentinel_fd_ = fds[1];
  }

  void TellSentinel(const std::string& line) {
    if (sentinel_fd_ >= 0) WriteAll(sentinel_fd_, (line + "\n").data(), line.size() + 1);
  }

  void StopSentinel() {
    TellSentinel("bye");
    close(sentinel_fd_);
    sentinel_fd_ = -1;
    if (sentinel_pid_ > 0) waitpid(sentinel_pid_, nullptr, 0);
  }

  void Spawn(Worker* w) {
    std::vector<std::string> env = WorkerEnv(plan_, w->local);
    env.push_back(StrCat("KEEL_RESTART_COUNT=", restart_));
    env.push_back(StrCat("TORCHELASTIC_RESTART_COUNT=", restart_));
    std::vector<char*> argv, envp;
    for (const std::string& a : command_) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    // Written by the child with write(2) only, if execve fails.
    std::string exec_error = "keel launch: cannot execute '" + plan_.executable + "': ";

    int out_fd = w->log_fd;  // rank 0 (local 0) writes to a pipe that the launcher tees
    if (w->local == 0) {
      int fds[2];
      PCHECK(pipe2(fds, O_CLOEXEC) == 0);
      pipe_fd_ = fds[0];
      out_fd = fds[1];
      fcntl(pipe_fd_, F_SETFL, O_NONBLOCK);
    }
    int null_fd = OpenHigh("/dev/null", O_RDONLY);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      int err = errno;
      SignalAll(SIGKILL);
      for (Worker& other : workers_)
        if (other.alive) waitpid(other.pid, nullptr, 0);
      KEEL_THROW("cannot start worker local rank ", w->local, ": fork: ", std::strerror(err));
    }
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the launcher died before prctl
      dup2(null_fd, 0);
      dup2(out_fd, 1);
      dup2(out_fd, 2);
      sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      execve(plan_.executable.c_str(), argv.data(), envp.data());
      int err = errno;
      const char* why = err == ENOENT    ? "No such file or directory"
                        : err == EACCES  ? "Permission denied"
                        : err == ENOEXEC ? "Exec format error (no #! line?)"
                        : err == E2BIG   ? "Argument list too long"
                                         : "exec failed";
      WriteAll(2, exec_error.data(), exec_error.size());
      WriteAll(2, why, std::strlen(why));
      WriteAll(2, "\n", 1);
      _exit(err == ENOENT ? 127 : 126);
    }
    setpgid(pid, pid);  // also here, so the group exists before the launcher ever signals it
    TellSentinel(StrCat("+", pid));
    close(null_fd);
    if (w->local == 0) close(out_fd);
    w->pid = pid;
    w->alive = true;
  }

  void SignalAll(int sig) {
    for (const Worker& w : workers_)
      if (w.pid > 0) kill(-w.pid, sig);  // the worker's whole process group
  }

  void Stop(int sig) {
    stopping_ = true;
    deadline_ = Clock::now() + std::chrono::seconds(FLAGS_grace_period_s);
    SignalAll(sig);
    SignalAll(SIGCONT);  // a stopped worker acts on the signal only once it runs
  }

  // Reaps workers and the orphans they left (the launcher is their subreaper).
  void Reap() {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (Worker& w : workers_) {
        if (!w.alive || w.pid != pid) continue;
        w.alive = false;
        w.status = status;
        w.reaped_after_kill = killed_;
        // Once its group is empty its id may be reused: the sentinel must forget it.
        if (kill(-w.pid, 0) != 0 && errno == ESRCH) TellSentinel(StrCat("-", w.pid));
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !stopping_) {
          first_failed_ = &w;
          NoteStoppedAtFailure();
          Stop(SIGTERM);
        }
      }
    }
  }

  // A worker whose process group has a stopped process (SIGSTOP, a debugger) makes its peers
  // wait in their collectives: it is named as soon as it is seen, blamed if the job then fails,
  // and failed itself once it has been stopped longer than the peers' comm timeout.
  void CheckStopped() {
    std::set<pid_t> groups;
    for (const Worker& w : workers_)
      if (w.alive) groups.insert(w.pid);
    if (groups.empty()) return;
    std::set<pid_t> stopped_groups;
    std::map<pid_t, pid_t> stopped_pid;
    for (const ProcState& p : ProcessesOfGroups(groups)) {
      if (p.state != 'T' && p.state != 't') continue;
      stopped_groups.insert(p.pgrp);
      stopped_pid[p.pgrp] = p.pid;
    }
    const auto now = Clock::now();
    for (Worker& w : workers_) {
      bool is_stopped = w.alive && stopped_groups.count(w.pid);
      if (is_stopped && !w.stopped) {
        w.stopped = true;  // a suspect from now on; named once seen stopped twice in a row
        w.stopped_since = now;
      } else if (is_stopped && !w.stopped_logged) {
        w.stopped_logged = true;
        std::fprintf(stderr,
                     "keel launch: worker rank %d (local %d, pid %d) is stopped (state T: "
                     "SIGSTOP, Ctrl-Z or a debugger?); the other ranks wait for it\n",
                     w.rank, w.local, static_cast<int>(stopped_pid[w.pid]));
      } else if (!is_stopped && w.stopped) {
        w.stopped = false;
        bool was_logged = w.stopped_logged;
        w.stopped_logged = false;
        if (w.alive && was_logged)
          std::fprintf(
              stderr, "keel launch: worker rank %d runs again after %s s stopped\n", w.rank,
              Seconds(std::chrono::duration<double>(now - w.stopped_since).count()).c_str());
      }
      double limit = StoppedLimitSeconds();
      if (w.stopped && !stopping_ &&
          std::chrono::duration<double>(now - w.stopped_since).count() > limit) {
        w.stopped_too_long = true;
        w.stopped_for_s = std::chrono::duration<double>(now - w.stopped_since).count();
        std::fprintf(stderr,
                     "keel launch: worker rank %d has been stopped for %.0f s, longer than the "
                     "comm timeout (%.0f s); stopping the job\n",
                     w.rank, w.stopped_for_s, limit);
        first_failed_ = &w;
        Stop(SIGTERM);
        SignalAll(SIGKILL);  // a stopped process cannot act on SIGTERM in time
        killed_ = true;
      }
    }
  }

  double StoppedLimitSeconds() const {
    return FLAGS_stopped_timeout_s > 0 ? FLAGS_stopped_timeout_s
                                       : std::max(1, FLAGS_comm_timeout_s);
  }

  // When a worker fails, every worker stopped at that moment is a suspect: its peers may have
  // timed out waiting for it.
  void NoteStoppedAtFailure() {
    const auto now = Clock::now();
    for (Worker& w : workers_)
      if (w.stopped) w.stopped_for_s = std::chrono::duration<double>(now - w.stopped_since).count();
  }

  void OnSignals() {
    signalfd_siginfo si;
    while (read(signal_fd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) {
        Reap();
      } else if (!stopping_) {
        std::fprintf(stderr, "keel launch: got %s, forwarding it to the workers\n",
                     SignalName(sig));
        stop_signal_ = sig;
        Stop(sig);
      } else if (!killed_) {
        std::fprintf(stderr, "keel launch: got %s while stopping, killing the workers\n",
                     SignalName(sig));
        if (stop_signal_ == 0) stop_signal_ = sig;
        SignalAll(SIGKILL);
        killed_ = true;
      }
    }
  }

  // Copies what rank 0 wrote to its log and to the console; false at end of file.
  bool PumpRank0() {
    char buf[65536];
    ssize_t n = read(pipe_fd_, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) {
      close(pipe_fd_);
      pipe_fd_ = -1;
      return false;
    }
    WriteAll(workers_[0].log_fd, buf, static_cast<size_t>(n));
    if (console_ok_) console_ok_ = WriteAll(STDOUT_FILENO, buf, static_cast<size_t>(n));
    return true;
  }

  bool AnyAlive() const {
    return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.alive; });
  }

  void Monitor() {
    Reap();  // a worker may have exited before the first poll
    auto next_check = Clock::now() + std::chrono::seconds(1);
    while (AnyAlive()) {
      int64_t timeout =
          std::chrono::duration_cast<std::chrono::milliseconds>(next_check - Clock::now()).count();
      if (stopping_ && !killed_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
        timeout = std::min<int64_t>(timeout, left.count());
      }
      pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {pipe_fd_, POLLIN, 0}};
      int n = poll(fds, pipe_fd_ >= 0 ? 2 : 1, static_cast<int>(std::max<int64_t>(0, timeout)));
      PCHECK(n >= 0 || errno == EINTR);
      if (n > 0 && fds[0].revents) OnSignals();
      if (n > 0 && pipe_fd_ >= 0 && fds[1].revents) PumpRank0();
      if (Clock::now() >= next_check) {
        CheckStopped();
        next_check = Clock::now() + std::chrono::seconds(1);
      }
      if (stopping_ && !killed_ && Clock::now() >= deadline_) {
        std::fprintf(stderr, "keel launch: workers still running %ds after SIGTERM, killing them\n",
                     FLAGS_grace_period_s);
        SignalAll(SIGKILL);
        killed_ = true;
      }
    }
    // Children of a stopped worker may outlive it, holding its group and rank 0's pipe: kill
    // them and reap them, so that no process (not even a zombie) outlives a stopped job.
    if (stopping_) {
      SignalAll(SIGKILL);
      SignalAll(SIGCONT);
      auto until = Clock::now() + std::chrono::seconds(1);
      while (Clock::now() < until) {
        pid_t pid = waitpid(-1, nullptr, WNOHANG);
        if (pid == sentinel_pid_ && pid > 0) sentinel_pid_ = -1;
        if (pid < 0) break;  // ECHILD: none left
        if (pid == 0) {
          bool any_left = false;
          for (const Worker& w : workers_) any_left = any_left || kill(-w.pid, 0) == 0;
          if (!any_left) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
    }
    for (const Worker& w : workers_)
      if (kill(-w.pid, 0) != 0 && errno == ESRCH) TellSentinel(StrCat("-", w.pid));
    // Drain rank 0's output: to end of file, or until it has been quiet a moment (a daemon it
    // left behind may keep the pipe open).
    auto until = Clock::now() + std::chrono::seconds(2);
    while (pipe_fd_ >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) break;
      pollfd fd = {pipe_fd_, POLLIN, 0};
      if (poll(&fd, 1, static_cast<int>(std::min<int64_t>(200, left.count()))) <= 0) break;
      PumpRank0();
    }
    if (pipe_fd_ >= 0) close(pipe_fd_);
    pipe_fd_ = -1;
  }

  void ResetAttempt() {
    for (Worker& w : workers_) {
      w.pid = -1;
      w.alive = false;
      w.status = 0;
      w.reaped_after_kill = false;
      w.stopped = w.stopped_logged = false;
      w.stopped_for_s = 0;
      w.stopped_too_long = false;
    }
    stopping_ = killed_ = false;
    first_failed_ = nullptr;
  }

  static std::string HowItEnded(int st) {
    return WIFEXITED(st) ? StrCat("exited with code ", WEXITSTATUS(st))
                         : StrCat("was killed by signal ", SignalName(WTERMSIG(st)), " (",
                                  WTERMSIG(st), ")", WCOREDUMP(st) ? ", core dumped" : "");
  }

  // "worker rank 1 (local 1, pid 123) was killed by signal SIGKILL (9)"
  std::string Describe(const Worker& w) const {
    std::string who = StrCat("worker rank ", w.rank, " (local ", w.local, ", pid ", w.pid, ")");
    if (w.stopped_too_long)
      return StrCat(who, " was stopped (state T) for ", static_cast<int>(w.stopped_for_s),
                    " s, longer than the comm timeout");
    if (w.stopped_for_s > 0 && &w != first_failed_)
      return StrCat(who, " was stopped (state T) for ", Seconds(w.stopped_for_s),
                    " s when the job failed; the other ranks waited for it");
    return StrCat(who, " ", HowItEnded(w.status));
  }

  // Whether a signal that nobody in the job sent (kill -9, the OOM killer, a crash) ended `w`.
  // SIGPIPE is a dead peer's echo, SIGTERM (or the forwarded signal) and the final SIGKILL are
  // the launcher's own.
  bool DiedOfOutsideSignal(const Worker& w) const {
    if (!WIFSIGNALED(w.status)) return false;
    int sig = WTERMSIG(w.status);
    if (sig == SIGPIPE) return false;
    if (stopping_ && (sig == SIGTERM || sig == stop_signal_)) return false;
    if (sig == SIGKILL && w.reaped_after_kill) return false;
    return true;
  }

  // The worker whose failure started the stop. A worker that was stopped when the job failed is
  // the cause (its peers timed out waiting for it). When a worker is killed, a peer blocked in a
  // collective with it often fails (EPIPE, reset) at the same instant and may be reaped first;
  // the killed one is the cause and the peer's failure is its consequence.
  const Worker* RootCause() const {
    if (first_failed_ == nullptr) return nullptr;
    for (const Worker& w : workers_)
      if (w.stopped_too_long || (w.stopped_for_s > 0 && &w != first_failed_)) return &w;
    if (DiedOfOutsideSignal(*first_failed_)) return first_failed_;
    for (const Worker& w : workers_)
      if (&w != first_failed_ && !w.alive && DiedOfOutsideSignal(w)) return &w;
    return first_failed_;
  }

  int Report() {
    const Worker* cause = RootCause();
    if (cause != nullptr) {
      const Worker& w = *cause;
      int st = w.status;
      std::string tail = LogTail(w.log_path, 20);
      if (FLAGS_max_restarts > 0)
        std::fprintf(stderr, "keel launch: giving up after %d restart(s); the last failure:\n",
                     restart_);
      std::fprintf(stderr,
                   "keel launch: %s\n"
                   "keel launch: last 20 lines of %s:\n%s%s",
                   Describe(w).c_str(), w.log_path.c_str(),
                   tail.empty() ? "(empty)\n" : tail.c_str(),
                   !tail.empty() && tail.back() != '\n' ? "\n" : "");
      if (cause != first_failed_) {
        const Worker& f = *first_failed_;
        std::fprintf(stderr,
                     "keel launch: worker rank %d (local %d) failed too (%s), as a consequence; "
                     "its log is %s\n",
                     f.rank, f.local, HowItEnded(f.status).c_str(), f.log_path.c_str());
      }
      if (workers_.size() > 1)
        std::fprintf(stderr, "keel launch: stopped the other %zu worker(s)\n", workers_.size() - 1);
      if (w.stopped_for_s > 0 && !(WIFEXITED(st) && WEXITSTATUS(st) != 0)) return 1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (stop_signal_ != 0) {
      std::fprintf(stderr, "keel launch: stopped %zu worker(s) after %s\n", workers_.size(),
                   SignalName(stop_signal_));
      return 128 + stop_signal_;
    }
    return 0;
  }

  const LaunchPlan& plan_;
  const std::vector<std::string>& command_;
  std::vector<Worker> workers_;
  sigset_t old_mask_;
  int signal_fd_ = -1;
  int pipe_fd_ = -1;  // rank 0's stdout+stderr
  bool console_ok_ = true;
  bool stopping_ = false, killed_ = false;
  Clock::time_point deadline_;
  const Worker* first_failed_ = nullptr;
  int stop_signal_ = 0;  // the signal that stopped the job, if one did
  int restart_ = 0;      // this attempt's restart count
  pid_t sentinel_pid_ = -1;
  int sentinel_fd_ = -1;
};

}  // namespace

int Launch(const std::vector<std::string>& command,
           const std::map<std::string, std::string>& given) {
  LaunchPlan plan = MakePlan(command, given);
  return Supervisor(plan, command).Run();
}

}  // namespace cli
}  // namespace keel
