#include "python_free_cli/launch_plan.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "framework/base/endpoint.h"
#include "framework/base/strings.h"
#include "framework/error.h"
#include "python_free_cli/launch.h"

namespace keel {
namespace cli {

bool IsLaunchFlag(const std::string& name) {
  static const std::set<std::string> own = {
      "cluster_node_ips", "node_ip",          "started_port", "nproc_per_node",    "nnodes",
      "node_rank",        "master_addr",      "master_port",  "grace_period_s",    "log_dir",
      "selected_gpus",    "cpu_math_threads", "max_restarts", "stopped_timeout_s", "server_num",
      "worker_num",       "servers",          "workers",      "cpu_sched",         "cpu_bind"};
  return own.count(name) > 0;
}

namespace {

// --cpu_sched: whether the workers run under SCHED_BATCH.
bool SchedBatch(const LaunchInput& in, bool parameter_server) {
  KEEL_ENFORCE(in.cpu_sched == "auto" || in.cpu_sched == "batch" || in.cpu_sched == "normal",
               "--cpu_sched must be auto, batch or normal, got '", in.cpu_sched, "'");
  return in.cpu_sched == "batch" || (in.cpu_sched == "auto" && parameter_server);
}

// --cpu_bind=cores: the launcher's CPUs dealt to this node's processes in contiguous runs, in
// local rank order (the earlier runs one CPU shorter when they do not divide evenly).
void BindCpus(const LaunchInput& in, const LaunchHost& host, LaunchPlan* plan) {
  KEEL_ENFORCE(in.cpu_bind == "none" || in.cpu_bind == "cores",
               "--cpu_bind must be none or cores, got '", in.cpu_bind, "'");
  if (in.cpu_bind == "none") return;
  const std::vector<int> cpus = host.cpus();
  const size_t n = plan->workers.size();
  KEEL_ENFORCE(cpus.size() >= n, "--cpu_bind=cores gives each of the ", n,
               " processes of this node CPUs of its own, but keel launch may run on only ",
               cpus.size(), " CPU(s); use --cpu_bind=none");
  for (size_t i = 0; i < n; ++i)
    plan->workers[i].cpus.assign(
        cpus.begin() + static_cast<std::ptrdiff_t>(i * cpus.size() / n),
        cpus.begin() + static_cast<std::ptrdiff_t>((i + 1) * cpus.size() / n));
}

// The value of `name` in `env` as getenv(3) finds it (the first entry), nullptr when unset.
const char* Getenv(const std::vector<std::string>& env, const char* name) {
  const size_t n = std::strlen(name);
  for (const std::string& e : env)
    if (e.size() > n && e[n] == '=' && e.compare(0, n, name) == 0) return e.c_str() + n + 1;
  return nullptr;
}

// "a,b,c" -> {a, b, c}, each trimmed; an empty entry is an error naming the flag.
std::vector<std::string> SplitList(const std::string& flag, const std::string& value) {
  std::vector<std::string> out = StrSplit(value, ',');
  for (std::string& item : out) {
    item = StrTrim(item);
    KEEL_ENFORCE(!item.empty(), flag, "='", value, "' has an empty entry");
  }
  return out;
}

void CheckPort(const char* flag, int port) {
  KEEL_ENFORCE(port >= 1 && port <= 65535, "--", flag, "=", port, " is not a port (1..65535)");
}

// One worker per listed GPU. A GPU listed twice puts two ranks on it, which NCCL refuses
// ("Duplicate GPU"): only with --gpu_comm_backend=host or auto (which then stages collectives
// through host memory). Returns the ids the workers see: unchanged, or their index in
// CUDA_VISIBLE_DEVICES when that is set.
std::vector<int> SelectedGpus(const LaunchInput& in, const std::string& backend) {
  KEEL_ENFORCE(backend == "auto" || backend == "nccl" || backend == "host",
               "--gpu_comm_backend must be auto, nccl or host, got '", backend, "'");
  std::vector<int> gpus;
  if (in.selected_gpus.empty()) return gpus;
  for (const std::string& s : SplitList("--selected_gpus", in.selected_gpus)) {
    KEEL_ENFORCE(s.find_first_not_of("0123456789") == std::string::npos && s.size() < 6,
                 "--selected_gpus='", in.selected_gpus, "': '", s, "' is not a GPU id");
    int g = std::stoi(s);
    KEEL_ENFORCE(backend != "nccl" || std::find(gpus.begin(), gpus.end(), g) == gpus.end(),
                 "--selected_gpus='", in.selected_gpus, "' lists GPU ", g,
                 " twice, but --gpu_comm_backend=nccl cannot put two ranks on one GPU (NCCL: "
                 "\"Duplicate GPU\"); use --gpu_comm_backend=host");
    gpus.push_back(g);
  }
  const char* visible = Getenv(in.env, "CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return gpus;
  std::vector<std::string> ids;
  if (!StrTrim(visible).empty()) ids = SplitList("CUDA_VISIBLE_DEVICES", visible);
  for (int& g : gpus) {
    auto it = std::find(ids.begin(), ids.end(), std::to_string(g));
    KEEL_ENFORCE(it != ids.end(), "--selected_gpus='", in.selected_gpus, "' lists GPU ", g,
                 ", which CUDA_VISIBLE_DEVICES='", visible, "' does not make visible");
    g = static_cast<int>(it - ids.begin());
  }
  return gpus;
}

// The flags given before the command that are not the launcher's own, for the workers. A flag
// also given in the command itself (where the worker would take that one) is refused.
std::vector<std::pair<std::string, std::string>> WorkerFlags(const LaunchInput& in,
                                                             const LaunchHost& host) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, value] : in.given) {
    if (IsLaunchFlag(name) || !host.is_worker_flag(name))
      continue;  // the launcher's own, or gflags' (--help, --flagfile, ...)
    for (size_t i = 1; i < in.command.size(); ++i) {
      const std::string& a = in.command[i];
      for (const std::string& spelled : {"-" + name, "--" + name, "-no" + name, "--no" + name})
        KEEL_ENFORCE(a != spelled && a.rfind(spelled + "=", 0) != 0, "--", name, "=", value,
                     " is given to keel launch (for every worker) and '", a,
                     "' to the command; give it once");
    }
    out.emplace_back(name, value);
  }
  return out;
}

// The launcher's environment with this worker's identity set. Another launcher's per-process
// rank variables (the launcher itself may be an OpenMPI or Slurm task) are dropped: they describe
// the launcher, not the worker.
std::vector<std::string> WorkerEnv(const LaunchPlan& plan, const std::vector<std::string>& parent,
                                   int local) {
  int rank = plan.rank(local);
  const std::string& master = plan.master;
  std::vector<std::pair<std::string, std::string>> set;
  if (!plan.endpoints.empty()) {  // Paddle's variables need every rank's endpoint
    set = {{"PADDLE_TRAINER_ID", std::to_string(rank)},
           {"PADDLE_TRAINERS_NUM", std::to_string(plan.world())},
           {"PADDLE_TRAINER_ENDPOINTS", StrJoin(plan.endpoints, ",")},
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
  std::vector<std::string> names;
  for (const auto& [name, value] : plan.worker_flags) {
    set.push_back({"FLAGS_" + name, value});
    names.push_back(name);
  }
  if (!names.empty()) set.push_back({"KEEL_LAUNCH_FLAGS", StrJoin(names, ",")});
  std::set<std::string> drop = {
      "OMPI_COMM_WORLD_RANK",       "OMPI_COMM_WORLD_SIZE",   "OMPI_COMM_WORLD_LOCAL_RANK",
      "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID",           "SLURM_LOCALID",
      "KEEL_LAUNCH_FLAGS",          "PADDLE_TRAINER_ID",      "PADDLE_TRAINERS_NUM",
      "PADDLE_TRAINER_ENDPOINTS",   "PADDLE_CURRENT_ENDPOINT"};
  for (const auto& kv : set) drop.insert(kv.first);
  std::vector<std::string> env;
  for (const std::string& e : parent) {
    const size_t eq = e.find('=');
    if (eq != std::string::npos && drop.count(e.substr(0, eq))) continue;
    env.push_back(e);
  }
  for (const auto& kv : set) env.push_back(kv.first + "=" + kv.second);
  return env;
}

// Parameter-server mode, each process told its role by Paddle's variables (fleet/role_maker.h,
// CloudRoleMaker(false)); the store is on server 0's endpoint. Either server_num servers (ranks
// 0..S-1) and worker_num trainers on this node, on free ports; or --servers/--workers list every
// endpoint of the job (Paddle fleetrun's flags, given alike on every node) and this node starts
// the servers and trainers at its address: --node_ip, else POD_IP, else the one address they all
// share.
LaunchPlan MakePsLaunchPlan(const LaunchInput& in, const LaunchHost& host) {
  auto flag_set = [&](const char* name) { return in.set_flags.count(name) > 0; };
  const bool listed = !in.servers.empty() || !in.workers.empty();
  if (listed) {
    KEEL_ENFORCE(!in.servers.empty() && !in.workers.empty(),
                 "--servers and --workers go together (every server's and every trainer's "
                 "ip:port), got only --",
                 in.servers.empty() ? "workers" : "servers");
    KEEL_ENFORCE(!flag_set("server_num") && !flag_set("worker_num"),
                 "--server_num/--worker_num do not combine with --servers/--workers (the lists "
                 "give the counts)");
  } else {
    KEEL_ENFORCE(in.server_num >= 1 && in.worker_num >= 1,
                 "parameter-server launch: --server_num=", in.server_num,
                 " and --worker_num=", in.worker_num, " must both be >= 1");
  }
  for (const char* flag : {"nproc_per_node", "nnodes", "node_rank", "started_port", "master_port"})
    KEEL_ENFORCE(!flag_set(flag), "--", flag,
                 " does not combine with a parameter-server launch: --server_num/--worker_num "
                 "run this node's servers and trainers, --servers/--workers place them on nodes");
  KEEL_ENFORCE(in.cluster_node_ips.empty() && in.master_addr.empty(),
               "--cluster_node_ips / --master_addr do not combine with a parameter-server launch "
               "(--servers/--workers list the nodes' endpoints)");
  KEEL_ENFORCE(in.selected_gpus.empty(),
               "--selected_gpus does not combine with a parameter-server launch: "
               "parameter-server training runs on CPU in keel");
  KEEL_ENFORCE(in.max_restarts >= 0, "--max_restarts must be >= 0, got ", in.max_restarts);
  LaunchPlan plan;
  plan.sched_batch = SchedBatch(in, true);
  std::vector<std::string> servers, trainers, hosts;
  std::string ip;
  if (listed) {
    servers = SplitList("--servers", in.servers);
    trainers = SplitList("--workers", in.workers);
    std::set<std::string> seen;
    for (const auto& [flag, list] : {std::pair{"--servers", &servers}, {"--workers", &trainers}})
      for (const std::string& e : *list) {
        const std::string h = ParseEndpoint(flag, e).host;
        // The nodes in order of first mention: server 0's first (node rank 0, the store's).
        if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
        KEEL_ENFORCE(seen.insert(e).second, flag, ": endpoint ", e, " is listed twice");
      }
    const std::set<std::string> ips(hosts.begin(), hosts.end());
    const char* pod_ip = Getenv(in.env, "POD_IP");
    if (!in.node_ip.empty()) {
      CheckHost("--node_ip", in.node_ip);
      ip = in.node_ip;
    } else if (pod_ip != nullptr && *pod_ip != '\0') {
      CheckHost("POD_IP", pod_ip);
      ip = pod_ip;
    } else {
      KEEL_ENFORCE(ips.size() == 1, "--servers/--workers name ", ips.size(),
                   " addresses: give each node's own as --node_ip (or POD_IP) so that it starts "
                   "the servers and trainers listed there");
      ip = *ips.begin();
    }
    KEEL_ENFORCE(ips.count(ip), "this node's address ", ip, " (",
                 in.node_ip.empty() ? "POD_IP" : "--node_ip",
                 ") is none of --servers/--workers': it would start nothing");
    plan.nnodes = static_cast<int>(ips.size());
    // A restart needs every node's launcher to stop and start together, which they do not
    // arrange among themselves yet.
    KEEL_ENFORCE(in.max_restarts == 0 || plan.nnodes == 1, "--max_restarts=", in.max_restarts,
                 " with --servers/--workers on ", plan.nnodes,
                 " nodes is not built (restarts are per node; a single-node job restarts)");
    plan.node_rank = static_cast<int>(std::find(hosts.begin(), hosts.end(), ip) - hosts.begin());
  } else {
    ip = in.node_ip.empty() ? "127.0.0.1" : in.node_ip;
    if (!in.node_ip.empty()) CheckHost("--node_ip", in.node_ip);
    const std::vector<int> ports = host.free_ports(in.server_num + in.worker_num, 0);
    for (int i = 0; i < in.server_num + in.worker_num; ++i)
      (i < in.server_num ? servers : trainers).push_back(ip + ":" + std::to_string(ports[i]));
  }
  const int S = static_cast<int>(servers.size()), W = static_cast<int>(trainers.size());
  plan.endpoints = servers;
  plan.endpoints.insert(plan.endpoints.end(), trainers.begin(), trainers.end());
  plan.master = servers[0];
  // This node's processes: their global ranks (servers 0..S-1, then the trainers).
  std::vector<int> mine;
  for (int r = 0; r < S + W; ++r)
    if (ParseEndpoint("--servers/--workers", plan.endpoints[r]).host == ip) mine.push_back(r);
  plan.nproc_per_node = static_cast<int>(mine.size());
  plan.grace_period_s = in.grace_period_s;
  // A failed server or trainer stops the job and, under --max_restarts, starts all of it again:
  // keel train's servers and trainers resume from --save_dir's checkpoint (trainer 0 saved it,
  // pulling the servers' state; the servers load their blocks of it).
  plan.max_restarts = in.max_restarts;
  plan.stopped_limit_s =
      in.stopped_timeout_s > 0 ? in.stopped_timeout_s : std::max(1, in.comm_timeout_s);
  const char* token = Getenv(in.env, "KEEL_JOB_TOKEN");
  KEEL_ENFORCE(!listed || plan.nnodes == 1 || (token != nullptr && *token != '\0'),
               "a parameter-server job on ", plan.nnodes,
               " nodes needs KEEL_JOB_TOKEN set alike on every node (its processes prove with it "
               "that they belong to the job)");
  plan.token = token != nullptr && *token != '\0' ? token : host.random_token();
  if (in.given.count("cpu_math_threads")) {
    plan.cpu_math_threads = in.given.at("cpu_math_threads");
  } else if (Getenv(in.env, "FLAGS_cpu_math_threads") == nullptr) {
    plan.cpu_math_threads = std::to_string(std::max(1, host.cpu_count() / plan.nproc_per_node));
  }
  plan.worker_flags = WorkerFlags(in, host);
  plan.log_dir = flag_set("log_dir") ? in.log_dir : "log";
  KEEL_ENFORCE(!plan.log_dir.empty(), "--log_dir must not be empty");
  plan.command = in.command;
  plan.executable = host.resolve_executable(in.command[0], Getenv(in.env, "PATH"));
  // Trainer 0's output goes to the console, else this node's first trainer's (or server's).
  plan.console_local = 0;
  for (int local = 0; local < plan.nproc_per_node; ++local)
    if (mine[local] >= S) {
      plan.console_local = local;
      break;
    }
  std::set<std::string> drop = {"OMPI_COMM_WORLD_RANK",
                                "OMPI_COMM_WORLD_SIZE",
                                "OMPI_COMM_WORLD_LOCAL_RANK",
                                "OMPI_COMM_WORLD_LOCAL_SIZE",
                                "SLURM_PROCID",
                                "SLURM_LOCALID",
                                "KEEL_LAUNCH_FLAGS",
                                "PADDLE_TRAINER_ID",
                                "PADDLE_TRAINERS_NUM",
                                "PADDLE_TRAINER_ENDPOINTS",
                                "PADDLE_CURRENT_ENDPOINT",
                                "RANK",
                                "WORLD_SIZE",
                                "LOCAL_RANK",
                                "LOCAL_WORLD_SIZE",
                                "MASTER_ADDR",
                                "MASTER_PORT",
                                "TRAINING_ROLE",
                                "PADDLE_PSERVERS_IP_PORT_LIST",
                                "PADDLE_PORT",
                                "POD_IP",
                                "KEEL_JOB_TOKEN"};
  for (int local = 0; local < plan.nproc_per_node; ++local) {
    const int rank = mine[local];
    const bool server = rank < S;
    std::vector<std::pair<std::string, std::string>> set = {
        {"TRAINING_ROLE", server ? "PSERVER" : "TRAINER"},
        {"PADDLE_PSERVERS_IP_PORT_LIST", StrJoin(servers, ",")},
        {"PADDLE_TRAINERS_NUM", std::to_string(W)},
        {"PADDLE_TRAINER_ENDPOINTS", StrJoin(trainers, ",")},
        {"KEEL_JOB_TOKEN", plan.token}};
    if (server) {
      set.push_back({"POD_IP", ip});
      set.push_back({"PADDLE_PORT", servers[rank].substr(servers[rank].rfind(':') + 1)});
    } else {
      set.push_back({"PADDLE_TRAINER_ID", std::to_string(rank - S)});
      set.push_back({"POD_IP", ip});
    }
    if (!plan.cpu_math_threads.empty())
      set.push_back({"FLAGS_cpu_math_threads", plan.cpu_math_threads});
    std::vector<std::string> names;
    for (const auto& [name, value] : plan.worker_flags) {
      set.push_back({"FLAGS_" + name, value});
      names.push_back(name);
    }
    if (!names.empty()) set.push_back({"KEEL_LAUNCH_FLAGS", StrJoin(names, ",")});
    LaunchWorker w;
    w.local = local;
    w.rank = rank;
    w.role = server ? StrCat("server ", rank) : StrCat("trainer ", rank - S);
    for (const std::string& e : in.env) {
      const size_t eq = e.find('=');
      if (eq == std::string::npos || !drop.count(e.substr(0, eq))) w.env.push_back(e);
    }
    for (const auto& kv : set) w.env.push_back(kv.first + "=" + kv.second);
    w.log_path = (std::filesystem::path(plan.log_dir) / ((server ? "serverlog." : "workerlog.") +
                                                         std::to_string(server ? rank : rank - S)))
                     .string();
    plan.workers.push_back(std::move(w));
  }
  BindCpus(in, host, &plan);
  return plan;
}

}  // namespace

LaunchPlan MakeLaunchPlan(const LaunchInput& in, const LaunchHost& host) {
  if (in.server_num != 0 || in.worker_num != 0 || !in.servers.empty() || !in.workers.empty())
    return MakePsLaunchPlan(in, host);
  auto flag_set = [&](const char* name) { return in.set_flags.count(name) > 0; };
  KEEL_ENFORCE(!in.command.empty(),
               "no command to launch; usage: keel launch [flags] COMMAND [ARGS...], "
               "e.g. keel launch --nproc_per_node=2 keel train --steps=5");
  LaunchPlan plan;
  KEEL_ENFORCE(in.grace_period_s >= 0, "--grace_period_s must be >= 0, got ", in.grace_period_s);
  KEEL_ENFORCE(in.max_restarts >= 0, "--max_restarts must be >= 0, got ", in.max_restarts);
  KEEL_ENFORCE(in.stopped_timeout_s >= 0, "--stopped_timeout_s must be >= 0, got ",
               in.stopped_timeout_s);
  plan.grace_period_s = in.grace_period_s;
  plan.max_restarts = in.max_restarts;
  plan.stopped_limit_s =
      in.stopped_timeout_s > 0 ? in.stopped_timeout_s : std::max(1, in.comm_timeout_s);
  plan.sched_batch = SchedBatch(in, false);

  // Workers on this node.
  plan.gpus = SelectedGpus(in, in.given.count("gpu_comm_backend") ? in.given.at("gpu_comm_backend")
                                                                  : in.gpu_comm_backend);
  int ngpus = static_cast<int>(plan.gpus.size());
  plan.nproc_per_node = in.nproc_per_node;
  if (flag_set("nproc_per_node")) {
    KEEL_ENFORCE(plan.nproc_per_node > 0, "--nproc_per_node must be positive, got ",
                 plan.nproc_per_node);
    KEEL_ENFORCE(ngpus == 0 || ngpus == plan.nproc_per_node,
                 "--nproc_per_node=", plan.nproc_per_node, " but --selected_gpus='",
                 in.selected_gpus, "' lists ", ngpus, " GPU(s); GPU mode runs one worker per GPU");
  } else if (ngpus > 0) {
    plan.nproc_per_node = ngpus;
  }
  const int nproc = plan.nproc_per_node;

  // Nodes, and which one this is.
  std::vector<std::string> ips;
  if (!in.cluster_node_ips.empty()) {
    ips = SplitList("--cluster_node_ips", in.cluster_node_ips);
    for (size_t i = 0; i < ips.size(); ++i) {
      CheckHost("--cluster_node_ips", ips[i]);
      KEEL_ENFORCE(std::find(ips.begin(), ips.begin() + i, ips[i]) == ips.begin() + i,
                   "--cluster_node_ips='", in.cluster_node_ips, "' lists ", ips[i], " twice");
    }
  }
  if (!in.node_ip.empty()) CheckHost("--node_ip", in.node_ip);
  if (!in.master_addr.empty()) CheckHost("--master_addr", in.master_addr);
  plan.nnodes = in.nnodes;
  if (flag_set("nnodes")) {
    KEEL_ENFORCE(plan.nnodes > 0, "--nnodes must be positive, got ", plan.nnodes);
    KEEL_ENFORCE(ips.empty() || static_cast<int>(ips.size()) == plan.nnodes,
                 "--nnodes=", plan.nnodes, " but --cluster_node_ips='", in.cluster_node_ips,
                 "' lists ", ips.size(), " node ip(s)");
  } else if (!ips.empty()) {
    plan.nnodes = static_cast<int>(ips.size());
  }
  // Several nodes meet either by --cluster_node_ips (every node's ip known: Paddle's endpoints)
  // or at --master_addr:--master_port (torchrun's way: each node knows only rank 0's).
  const bool by_master = plan.nnodes > 1 && ips.empty() && !in.master_addr.empty();
  KEEL_ENFORCE(plan.nnodes == 1 || !ips.empty() || by_master, "--nnodes=", plan.nnodes,
               " needs --cluster_node_ips listing every node's ip in node-rank order, or "
               "--master_addr and --master_port of rank 0's node (the launcher does not "
               "discover other nodes)");
  bool rank_set = flag_set("node_rank");
  KEEL_ENFORCE(!by_master || rank_set, "a multi-node launch at --master_addr=", in.master_addr,
               " needs --node_rank to say which node this is (0..", plan.nnodes - 1, ")");
  KEEL_ENFORCE(!by_master || flag_set("master_port"),
               "a multi-node launch at --master_addr=", in.master_addr,
               " needs --master_port, the same on every node");
  plan.node_rank = in.node_rank;
  KEEL_ENFORCE(plan.node_rank >= 0 && plan.node_rank < plan.nnodes, "--node_rank=", plan.node_rank,
               " is out of range for --nnodes=", plan.nnodes, " (0..", plan.nnodes - 1, ")");
  if (!ips.empty()) {
    if (!in.node_ip.empty()) {
      auto it = std::find(ips.begin(), ips.end(), in.node_ip);
      KEEL_ENFORCE(it != ips.end(), "--node_ip=", in.node_ip, " is not in --cluster_node_ips='",
                   in.cluster_node_ips, "'");
      int index = static_cast<int>(it - ips.begin());
      KEEL_ENFORCE(!rank_set || index == plan.node_rank, "--node_rank=", plan.node_rank,
                   " but --node_ip=", in.node_ip, " is node ", index, " in --cluster_node_ips='",
                   in.cluster_node_ips, "'");
      plan.node_rank = index;
    } else {
      KEEL_ENFORCE(plan.nnodes == 1 || rank_set, "a multi-node launch (--nnodes=", plan.nnodes,
                   ") needs --node_rank or --node_ip to say which node this is");
    }
    KEEL_ENFORCE(in.master_addr.empty() || in.master_addr == ips[0],
                 "--master_addr=", in.master_addr, " but --cluster_node_ips='", in.cluster_node_ips,
                 "' puts rank 0 on ", ips[0]);
  } else if (!by_master) {
    KEEL_ENFORCE(in.master_addr.empty() || in.node_ip.empty() || in.master_addr == in.node_ip,
                 "--master_addr=", in.master_addr,
                 " but rank 0 runs on this node, --node_ip=", in.node_ip);
    ips.push_back(!in.node_ip.empty()       ? in.node_ip
                  : !in.master_addr.empty() ? in.master_addr
                                            : "127.0.0.1");
  }

  // Ports: local rank i gets base+i on every node, or free ports on a single node.
  int base = 0;
  if (flag_set("started_port")) {
    base = in.started_port;
    CheckPort("started_port", base);
  }
  if (flag_set("master_port")) {
    CheckPort("master_port", in.master_port);
    KEEL_ENFORCE(base == 0 || in.master_port == base, "--master_port=", in.master_port,
                 " but --started_port=", base, " gives rank 0 port ", base);
    if (plan.nnodes > 1) base = in.master_port;
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
  } else if (flag_set("master_port")) {
    ports = host.free_ports(nproc - 1, in.master_port);
    ports.insert(ports.begin(), in.master_port);
  } else {
    ports = host.free_ports(nproc, 0);
  }
  for (const std::string& ip : ips)
    for (int port : ports) plan.endpoints.push_back(ip + ":" + std::to_string(port));
  plan.master =
      by_master ? in.master_addr + ":" + std::to_string(in.master_port) : plan.endpoints[0];

  // One token per job: every node's launcher must be given the same one.
  const char* token = Getenv(in.env, "KEEL_JOB_TOKEN");
  if (token != nullptr && *token != '\0') {
    plan.token = token;
  } else {
    KEEL_ENFORCE(plan.nnodes == 1, "a multi-node launch (--nnodes=", plan.nnodes,
                 ") needs the same KEEL_JOB_TOKEN in every node's environment, e.g. "
                 "export KEEL_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')");
    plan.token = host.random_token();
  }

  // --cpu_math_threads given to the launcher is each worker's; else FLAGS_cpu_math_threads from
  // the environment; else the cores shared out.
  if (in.given.count("cpu_math_threads")) {
    plan.cpu_math_threads = in.given.at("cpu_math_threads");
  } else if (Getenv(in.env, "FLAGS_cpu_math_threads") == nullptr) {
    plan.cpu_math_threads = std::to_string(std::max(1, host.cpu_count() / nproc));
  }
  plan.worker_flags = WorkerFlags(in, host);
  plan.log_dir = flag_set("log_dir") ? in.log_dir : "log";
  KEEL_ENFORCE(!plan.log_dir.empty(), "--log_dir must not be empty");
  plan.command = in.command;
  plan.executable = host.resolve_executable(in.command[0], Getenv(in.env, "PATH"));

  for (int local = 0; local < nproc; ++local) {
    LaunchWorker w;
    w.local = local;
    w.rank = plan.rank(local);
    w.env = WorkerEnv(plan, in.env, local);
    w.log_path =
        (std::filesystem::path(plan.log_dir) / ("workerlog." + std::to_string(local))).string();
    plan.workers.push_back(std::move(w));
  }
  BindCpus(in, host, &plan);
  return plan;
}

}  // namespace cli
}  // namespace keel
