#include "fleet/role_maker.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <set>
#include <utility>

#include "framework/base/endpoint.h"
#include "framework/base/strings.h"
#include "framework/error.h"

extern char** environ;

DEFINE_string(selected_gpus, "",
              "GPU mode: the GPUs of this job (keel launch: one worker per listed GPU, e.g. "
              "0,1,2,3); a worker's own GPU (set by keel launch as FLAGS_selected_gpus).");

namespace keel {
namespace fleet {
namespace {

using Env = std::map<std::string, std::string>;

// The variables of one rank/size convention (torchrun, OpenMPI, Slurm).
struct RankVars {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: Slurm, whose local size has two spellings
};

constexpr RankVars kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr RankVars kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr RankVars kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr};

const std::vector<std::string> kPaddleVars = {"PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM",
                                              "PADDLE_TRAINER_ENDPOINTS",
                                              "PADDLE_CURRENT_ENDPOINT"};
const std::vector<std::string> kTorchrunVars = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
// A torchrun environment is recognised by its rank variables; MASTER_ADDR/MASTER_PORT are also the
// rendezvous variables of OpenMPI and Slurm jobs, so they alone make no convention.
const std::vector<std::string> kTorchrunTriggers = {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                    "LOCAL_WORLD_SIZE"};
const std::vector<std::string> kOpenMpiVars = {kOpenMpi.rank, kOpenMpi.size, kOpenMpi.local_rank,
                                               kOpenMpi.local_size};
const std::vector<std::string> kSlurmVars = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                             "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
// SLURM_NTASKS and SLURM_*TASKS_PER_NODE describe the allocation and are set in salloc shells too;
// only the per-task variables make this process a Slurm task.
const std::vector<std::string> kSlurmTriggers = {"SLURM_PROCID", "SLURM_LOCALID"};

const std::string* Find(const Env& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

bool AnySet(const Env& env, const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return env.count(n) > 0; });
}

// "A=1, B=x" for the names of `names` that are set, "none" when none is.
std::string Present(const Env& env, const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    if (const std::string* v = Find(env, n)) out += (out.empty() ? "" : ", ") + n + "=" + *v;
  }
  return out.empty() ? "none" : out;
}

// Throws unless every name in `required` is set, naming the missing and the present variables.
// `why` follows the missing names; `fix` ends the message (default: all or none).
void RequireAll(const Env& env, const std::string& source, const std::vector<std::string>& all,
                const std::vector<std::string>& required, const std::string& why = "",
                const std::string& fix = "") {
  std::vector<std::string> missing;
  for (const auto& n : required)
    if (!env.count(n)) missing.push_back(n);
  if (missing.empty()) return;
  KEEL_THROW("incomplete ", source, " environment: missing ", StrJoin(missing, ", "), why,
             "; present: ", Present(env, all), ". ",
             fix.empty() ? StrCat("Set all of ", StrJoin(required, ", "),
                                  " or none of them (keel does not guess the rest).")
                         : fix);
}

// Strict decimal integer: optional '-', digits, nothing else; must fit an int and be >= min.
int ParseInt(const std::string& name, const std::string& value, int min) {
  long long v = 0;
  const char* b = value.data();
  const char* e = b + value.size();
  auto [p, ec] = std::from_chars(b, e, v);
  KEEL_ENFORCE(!value.empty() && ec == std::errc() && p == e && value[0] != '+', name, "='", value,
               "' is not an integer");
  KEEL_ENFORCE(v >= min, name, "=", value, " must be ",
               min == 1 ? "a positive integer" : "a non-negative integer");
  KEEL_ENFORCE(v <= 0x7fffffff, name, "=", value, " is too large");
  return static_cast<int>(v);
}

int ParseVar(const Env& env, const std::string& name, int min) {
  return ParseInt(name, env.at(name), min);
}

// FLAGS_selected_gpus: "0,1" -> {0, 1}; "" -> {}. One GPU per rank, so no duplicates.
std::vector<int> ParseSelectedGpus(const Env& env) {
  const std::string* v = Find(env, "FLAGS_selected_gpus");
  if (!v || v->empty()) return {};
  std::vector<int> gpus;
  for (const auto& item : StrSplit(*v, ',')) {
    int id = ParseInt(StrCat("FLAGS_selected_gpus='", *v, "': entry"), item, 0);
    KEEL_ENFORCE(std::find(gpus.begin(), gpus.end(), id) == gpus.end(), "FLAGS_selected_gpus='", *v,
                 "' lists GPU ", id, " twice; NCCL allows one GPU per rank");
    gpus.push_back(id);
  }
  return gpus;
}

// Checks `endpoints` (one per rank, distinct, valid, the ranks of a host contiguous and every host
// running as many) and fills endpoints, current endpoint, master and local rank/size of `role`.
// `name` labels the list in errors (an env variable, or "endpoints").
void ApplyEndpoints(const std::string& name, const std::vector<std::string>& endpoints,
                    Role* role) {
  const std::string list = StrJoin(endpoints, ",");
  KEEL_ENFORCE(static_cast<int>(endpoints.size()) == role->world_size, name, "='", list, "' has ",
               endpoints.size(), " endpoints but the world size is ", role->world_size,
               "; give one host:port per rank");
  std::vector<HostPort> hps;
  std::set<std::string> seen;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    hps.push_back(ParseEndpoint(StrCat(name, "[", i, "]"), endpoints[i]));
    KEEL_ENFORCE(seen.insert(endpoints[i]).second, name, "='", list, "' lists ", endpoints[i],
                 " twice; each rank needs its own host:port");
  }
  // Runs of equal hosts: each host one run, all runs of the same length (node = rank / local).
  std::vector<std::pair<std::string, int>> runs;
  for (const auto& hp : hps) {
    if (runs.empty() || runs.back().first != hp.host) runs.push_back({hp.host, 0});
    ++runs.back().second;
  }
  std::set<std::string> hosts;
  for (const auto& run : runs) {
    KEEL_ENFORCE(hosts.insert(run.first).second, name, "='", list, "': the ranks of host ",
                 run.first, " are not contiguous; keel numbers ranks node by node");
    KEEL_ENFORCE(run.second == runs[0].second, name, "='", list, "': host ", runs[0].first,
                 " runs ", runs[0].second, " ranks but host ", run.first, " runs ", run.second,
                 "; keel needs the same number of ranks on every host");
  }
  role->endpoints = endpoints;
  role->current_endpoint = endpoints[role->rank];
  role->master_addr = hps[0].host;
  role->master_port = hps[0].port;
  role->local_world_size = runs[0].second;
  role->local_rank = role->rank % role->local_world_size;
}

// MASTER_ADDR/MASTER_PORT into `role`; both required when `required` (world_size > 1).
void ReadMaster(const Env& env, const std::string& source, const std::vector<std::string>& vars,
                bool required, const std::string& hint, Role* role) {
  if (required) {
    RequireAll(env, source, vars, {"MASTER_ADDR", "MASTER_PORT"},
               StrCat(" (with ", role->world_size,
                      " ranks, the rendezvous store is served on MASTER_ADDR:MASTER_PORT)", hint),
               "Set MASTER_ADDR to rank 0's address and MASTER_PORT to a free port there.");
  }
  if (const std::string* addr = Find(env, "MASTER_ADDR")) {
    CheckHost("MASTER_ADDR", *addr);
    role->master_addr = *addr;
  }
  if (const std::string* port = Find(env, "MASTER_PORT"))
    role->master_port = ParsePort("MASTER_PORT", *port);
}

// Slurm's tasks per node: SLURM_NTASKS_PER_NODE ("4") or SLURM_TASKS_PER_NODE ("4(x2)" or
// "4(x2),4"); both, when set, must agree. 0 when neither is set.
int SlurmTasksPerNode(const Env& env) {
  int per_node = 0;
  if (const std::string* v = Find(env, "SLURM_TASKS_PER_NODE")) {
    for (const auto& item : StrSplit(*v, ',')) {
      size_t paren = item.find('(');
      std::string count = item.substr(0, paren);
      if (paren != std::string::npos) {
        std::string rep = item.substr(paren);
        KEEL_ENFORCE(rep.size() >= 4 && rep.compare(0, 2, "(x") == 0 && rep.back() == ')',
                     "SLURM_TASKS_PER_NODE='", *v, "' is not like '4(x2),3'");
        ParseInt(StrCat("SLURM_TASKS_PER_NODE='", *v, "': repeat count"),
                 rep.substr(2, rep.size() - 3), 1);
      }
      int n = ParseInt(StrCat("SLURM_TASKS_PER_NODE='", *v, "': entry"), count, 1);
      KEEL_ENFORCE(per_node == 0 || n == per_node, "SLURM_TASKS_PER_NODE='", *v,
                   "': nodes run different numbers of tasks; keel needs the same number on "
                   "every node");
      per_node = n;
    }
  }
  if (const std::string* v = Find(env, "SLURM_NTASKS_PER_NODE")) {
    int n = ParseInt("SLURM_NTASKS_PER_NODE", *v, 1);
    KEEL_ENFORCE(per_node == 0 || n == per_node,
                 "contradictory environment: SLURM_NTASKS_PER_NODE=", *v,
                 " but SLURM_TASKS_PER_NODE=", env.at("SLURM_TASKS_PER_NODE"));
    per_node = n;
  }
  return per_node;
}

// torchrun, OpenMPI or Slurm as the source.
Role FromRankVars(const Env& env, const RankVars& c, const std::vector<std::string>& own_vars) {
  std::vector<std::string> vars = own_vars;
  if (std::find(vars.begin(), vars.end(), "MASTER_ADDR") == vars.end()) {
    vars.push_back("MASTER_ADDR");
    vars.push_back("MASTER_PORT");
  }
  RequireAll(env, c.source, vars, {c.rank, c.size});
  Role role;
  role.source = c.source;
  role.world_size = ParseVar(env, c.size, 1);
  role.rank = ParseVar(env, c.rank, 0);
  KEEL_ENFORCE(role.rank < role.world_size, c.rank, "=", role.rank, " is out of range [0, ", c.size,
               "=", role.world_size, ")");

  // Local size: absent means one node (local = global).
  std::string local_size_label;
  int local_size = 0;
  if (c.local_size) {
    if (env.count(c.local_size)) {
      local_size = ParseVar(env, c.local_size, 1);
      local_size_label = StrCat(c.local_size, "=", local_size);
    }
  } else {
    local_size = SlurmTasksPerNode(env);
    local_size_label = Present(env, {"SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  }
  if (local_size == 0) {
    local_size = role.world_size;
    local_size_label = StrCat(c.size, "=", role.world_size, " (no local size set: one node)");
  }
  KEEL_ENFORCE(role.world_size % local_size == 0, c.size, "=", role.world_size,
               " is not a multiple of ", local_size_label,
               "; keel needs the same number of ranks on every node");
  role.local_world_size = local_size;
  role.local_rank = role.rank % local_size;
  if (env.count(c.local_rank)) {
    int local_rank = ParseVar(env, c.local_rank, 0);
    KEEL_ENFORCE(local_rank < local_size, c.local_rank, "=", local_rank, " is out of range [0, ",
                 local_size_label, ")");
    KEEL_ENFORCE(local_rank == role.local_rank, c.local_rank, "=", local_rank, " does not match ",
                 c.rank, "=", role.rank, " with ", local_size_label,
                 ": keel numbers ranks node by node (rank = node * local size + local rank), so "
                 "the local rank must be ",
                 role.local_rank);
  }
  std::string hint;
  if (std::strcmp(c.source, "slurm") == 0) {
    hint =
        "; if this process was not started by srun (e.g. it runs directly in an sbatch "
        "script), SLURM_NTASKS describes the allocation, not this process: start it with srun "
        "or keel launch";
  }
  ReadMaster(env, c.source, vars, role.world_size > 1, hint, &role);
  return role;
}

enum class VarKind { kRank, kSize, kHost, kPort };

// A torchrun variable that is set alongside Paddle's must be well formed and say the same.
void CheckAgrees(const Env& env, const std::string& var, VarKind kind,
                 const std::string& paddle_what, const std::string& paddle_value) {
  const std::string* v = Find(env, var);
  if (!v) return;
  std::string value = *v;
  switch (kind) {
    case VarKind::kRank:
      value = std::to_string(ParseInt(var, *v, 0));
      break;
    case VarKind::kSize:
      value = std::to_string(ParseInt(var, *v, 1));
      break;
    case VarKind::kHost:
      CheckHost(var, *v);
      break;
    case VarKind::kPort:
      value = std::to_string(ParsePort(var, *v));
      break;
  }
  KEEL_ENFORCE(value == paddle_value, "contradictory environment: ", var, "=", *v, " but ",
               paddle_what, "=", paddle_value,
               " (when both Paddle's and torchrun's variables are set they must agree)");
}

Role FromPaddle(const Env& env) {
  Role role;
  role.source = "paddle";
  if (!env.count("PADDLE_TRAINERS_NUM") && env.count("PADDLE_TRAINER_ENDPOINTS")) {
    // Paddle derives the world size from the endpoint list when PADDLE_TRAINERS_NUM is absent.
    RequireAll(env, "paddle", kPaddleVars, {"PADDLE_TRAINER_ID"});
    role.world_size = static_cast<int>(StrSplit(env.at("PADDLE_TRAINER_ENDPOINTS"), ',').size());
  } else {
    RequireAll(env, "paddle", kPaddleVars, {"PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM"});
    role.world_size = ParseVar(env, "PADDLE_TRAINERS_NUM", 1);
  }
  role.rank = ParseVar(env, "PADDLE_TRAINER_ID", 0);
  KEEL_ENFORCE(role.rank < role.world_size, "PADDLE_TRAINER_ID=", role.rank,
               " is out of range [0, PADDLE_TRAINERS_NUM=", role.world_size, ")");
  if (role.world_size > 1) {
    RequireAll(env, "paddle", kPaddleVars, {"PADDLE_TRAINER_ID", "PADDLE_TRAINER_ENDPOINTS"},
               StrCat(" (needed when PADDLE_TRAINERS_NUM=", role.world_size, " > 1)"));
  }
  const std::string* current = Find(env, "PADDLE_CURRENT_ENDPOINT");
  if (current) ParseEndpoint("PADDLE_CURRENT_ENDPOINT", *current);
  if (const std::string* list = Find(env, "PADDLE_TRAINER_ENDPOINTS")) {
    ApplyEndpoints("PADDLE_TRAINER_ENDPOINTS", StrSplit(*list, ','), &role);
    KEEL_ENFORCE(!current || *current == role.current_endpoint,
                 "contradictory environment: PADDLE_CURRENT_ENDPOINT=", current ? *current : "",
                 " but PADDLE_TRAINER_ENDPOINTS[", role.rank, "]=", role.current_endpoint,
                 " (PADDLE_TRAINER_ID=", role.rank, ")");
  } else if (current) {
    ApplyEndpoints("PADDLE_CURRENT_ENDPOINT", {*current}, &role);  // a single worker
  } else {
    ReadMaster(env, "paddle", kTorchrunVars, false, "", &role);
  }

  // keel launch also sets torchrun's variables: each one present must agree.
  const bool have_endpoints = !role.endpoints.empty();
  CheckAgrees(env, "RANK", VarKind::kRank, "PADDLE_TRAINER_ID", std::to_string(role.rank));
  CheckAgrees(env, "WORLD_SIZE", VarKind::kSize, "PADDLE_TRAINERS_NUM",
              std::to_string(role.world_size));
  const std::string derived =
      have_endpoints ? " (from the hosts in PADDLE_TRAINER_ENDPOINTS)" : " (a single worker)";
  CheckAgrees(env, "LOCAL_RANK", VarKind::kRank, "the local rank" + derived,
              std::to_string(role.local_rank));
  CheckAgrees(env, "LOCAL_WORLD_SIZE", VarKind::kSize, "the local world size" + derived,
              std::to_string(role.local_world_size));
  if (have_endpoints) {
    CheckAgrees(env, "MASTER_ADDR", VarKind::kHost, "the host of PADDLE_TRAINER_ENDPOINTS[0]",
                role.master_addr);
    CheckAgrees(env, "MASTER_PORT", VarKind::kPort, "the port of PADDLE_TRAINER_ENDPOINTS[0]",
                std::to_string(role.master_port));
  }
  return role;
}

// The invariants every role satisfies (see the header); `what` prefixes the errors.
void CheckRole(const Role& r, const std::string& what) {
  KEEL_ENFORCE(r.world_size >= 1, what, ": world_size=", r.world_size, " must be >= 1");
  KEEL_ENFORCE(r.rank >= 0 && r.rank < r.world_size, what, ": rank=", r.rank,
               " is out of range [0, world_size=", r.world_size, ")");
  KEEL_ENFORCE(r.local_world_size >= 1 && r.world_size % r.local_world_size == 0, what,
               ": world_size=", r.world_size,
               " is not a multiple of local_world_size=", r.local_world_size);
  KEEL_ENFORCE(r.local_rank >= 0 && r.local_rank < r.local_world_size, what,
               ": local_rank=", r.local_rank,
               " is out of range [0, local_world_size=", r.local_world_size, ")");
  KEEL_ENFORCE(r.local_rank == r.rank % r.local_world_size, what, ": local_rank=", r.local_rank,
               " does not match rank=", r.rank, " with local_world_size=", r.local_world_size,
               " (ranks are numbered node by node)");
  CheckHost(what + ": master_addr", r.master_addr);
  KEEL_ENFORCE(r.master_port >= (r.world_size > 1 ? 1 : 0) && r.master_port <= 65535, what,
               ": master_port=", r.master_port, " must be in 1..65535 when world_size > 1");
  if (!r.endpoints.empty()) {
    Role derived = r;
    ApplyEndpoints(what + ": endpoints", r.endpoints, &derived);
    KEEL_ENFORCE(r.current_endpoint == derived.current_endpoint &&
                     r.master_addr == derived.master_addr && r.master_port == derived.master_port &&
                     r.local_world_size == derived.local_world_size,
                 what, ": endpoints='", StrJoin(r.endpoints, ","),
                 "' give current_endpoint=", derived.current_endpoint, ", master ",
                 derived.store_endpoint(), ", local_world_size=", derived.local_world_size,
                 " but the role says ", r.current_endpoint.empty() ? "(none)" : r.current_endpoint,
                 ", ", r.store_endpoint(), ", ", r.local_world_size);
  }
  std::set<int> gpus;
  for (int g : r.selected_gpus) {
    KEEL_ENFORCE(g >= 0 && gpus.insert(g).second, what, ": selected_gpus has ", g,
                 g < 0 ? ", a negative id" : " twice; NCCL allows one GPU per rank");
  }
}

}  // namespace

std::string Role::store_endpoint() const { return StrCat(master_addr, ":", master_port); }

std::string Role::ToString() const {
  const std::string gpus = StrJoin(selected_gpus, ",");
  return StrCat(
      "rank ", rank, "/", world_size, " local ", local_rank, "/", local_world_size, " node ",
      node_rank(), "/", num_nodes(), " source=", source, " store=", store_endpoint(),
      current_endpoint.empty() ? "" : " endpoint=" + current_endpoint,
      " gpus=", gpus.empty() ? "none" : gpus,
      is_ps() ? StrCat(" ", is_server() ? "server " : "trainer ", is_server() ? rank : trainer_id(),
                       " of ", is_server() ? server_num : trainer_num)
              : "");
}

CloudRoleMaker::CloudRoleMaker(bool is_collective) : is_collective_(is_collective) {}

Role CloudRoleMaker::FromPsEnv(const Env& env) {
  const std::vector<std::string> vars = {"TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST",
                                         "PADDLE_TRAINERS_NUM"};
  RequireAll(env, "parameter-server", vars, vars,
             " (CloudRoleMaker(is_collective=false) reads Paddle's parameter-server variables; "
             "keel launch --server_num=S --worker_num=W sets them)");
  Role role;
  role.source = "paddle";
  role.training_role = env.at("TRAINING_ROLE");
  KEEL_ENFORCE(role.training_role == "TRAINER" || role.training_role == "PSERVER",
               "TRAINING_ROLE=", role.training_role, " must be TRAINER or PSERVER");
  role.server_endpoints = StrSplit(env.at("PADDLE_PSERVERS_IP_PORT_LIST"), ',');
  std::set<std::string> seen;
  for (size_t i = 0; i < role.server_endpoints.size(); ++i) {
    ParseEndpoint(StrCat("PADDLE_PSERVERS_IP_PORT_LIST[", i, "]"), role.server_endpoints[i]);
    KEEL_ENFORCE(seen.insert(role.server_endpoints[i]).second, "PADDLE_PSERVERS_IP_PORT_LIST='",
                 env.at("PADDLE_PSERVERS_IP_PORT_LIST"), "' lists ", role.server_endpoints[i],
                 " twice");
  }
  role.server_num = static_cast<int>(role.server_endpoints.size());
  role.trainer_num = ParseVar(env, "PADDLE_TRAINERS_NUM", 1);
  role.world_size = role.server_num + role.trainer_num;
  std::vector<std::string> trainers;
  if (const std::string* list = Find(env, "PADDLE_TRAINER_ENDPOINTS")) {
    trainers = StrSplit(*list, ',');
    KEEL_ENFORCE(static_cast<int>(trainers.size()) == role.trainer_num,
                 "PADDLE_TRAINER_ENDPOINTS='", *list, "' has ", trainers.size(),
                 " endpoints but PADDLE_TRAINERS_NUM=", role.trainer_num);
    for (size_t i = 0; i < trainers.size(); ++i)
      ParseEndpoint(StrCat("PADDLE_TRAINER_ENDPOINTS[", i, "]"), trainers[i]);
  }
  if (role.is_server()) {
    RequireAll(env, "parameter-server", {"POD_IP", "PADDLE_PORT"}, {"POD_IP", "PADDLE_PORT"},
               " (a PSERVER's endpoint is POD_IP:PADDLE_PORT)");
    role.current_endpoint = StrCat(env.at("POD_IP"), ":", ParseVar(env, "PADDLE_PORT", 1));
    auto it = std::find(role.server_endpoints.begin(), role.server_endpoints.end(),
                        role.current_endpoint);
    KEEL_ENFORCE(it != role.server_endpoints.end(), "POD_IP:PADDLE_PORT=", role.current_endpoint,
                 " is not in PADDLE_PSERVERS_IP_PORT_LIST='",
                 env.at("PADDLE_PSERVERS_IP_PORT_LIST"), "'");
    role.rank = static_cast<int>(it - role.server_endpoints.begin());
  } else {
    RequireAll(env, "parameter-server", {"PADDLE_TRAINER_ID"}, {"PADDLE_TRAINER_ID"},
               " (a TRAINER's id)");
    const int id = ParseVar(env, "PADDLE_TRAINER_ID", 0);
    KEEL_ENFORCE(id < role.trainer_num, "PADDLE_TRAINER_ID=", id,
                 " is out of range [0, PADDLE_TRAINERS_NUM=", role.trainer_num, ")");
    role.rank = role.server_num + id;
    if (!trainers.empty()) role.current_endpoint = trainers[id];
  }
  const HostPort master =
      ParseEndpoint("PADDLE_PSERVERS_IP_PORT_LIST[0]", role.server_endpoints[0]);
  role.master_addr = master.host;
  role.master_port = master.port;
  role.selected_gpus = ParseSelectedGpus(env);
  return role;
}

Role CloudRoleMaker::Generate() const {
  Env env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  // --selected_gpus given to the program (keel::Init also applies FLAGS_selected_gpus from the
  // environment to the flag) is this worker's GPU.
  gflags::CommandLineFlagInfo info;
  if (gflags::GetCommandLineFlagInfo("selected_gpus", &info) && !info.is_default)
    env["FLAGS_selected_gpus"] = FLAGS_selected_gpus;
  return is_collective_ ? FromEnv(env) : FromPsEnv(env);
}

Role CloudRoleMaker::FromEnv(const Env& env) {
  Role role;
  if (AnySet(env, kPaddleVars) || AnySet(env, kTorchrunTriggers)) {
    role = AnySet(env, kPaddleVars) ? FromPaddle(env) : FromRankVars(env, kTorchrun, kTorchrunVars);
    // A scheduler's task variables beside a launcher's describe the process that started the
    // launcher (`srun torchrun`, `mpirun keel launch`): that process runs world / its size
    // workers. A world that is no multiple of the scheduler's, or one as large with another
    // rank, is a contradiction, e.g. a RANK left in the environment of an mpirun job.
    const char* launcher = role.source == "paddle" ? "PADDLE_TRAINER_ID" : "RANK";
    const char* launcher_size = role.source == "paddle" ? "PADDLE_TRAINERS_NUM" : "WORLD_SIZE";
    for (const RankVars* c : {&kOpenMpi, &kSlurm}) {
      if (!env.count(c->rank) || !env.count(c->size)) continue;
      const int rank = ParseVar(env, c->rank, 0), size = ParseVar(env, c->size, 1);
      const bool contradiction =
          role.world_size % size != 0 || (role.world_size == size && role.rank != rank);
      KEEL_ENFORCE(!contradiction, "contradictory environment: ", launcher, "=", role.rank, " and ",
                   launcher_size, "=", role.world_size, " but ", c->rank, "=", rank, " and ",
                   c->size, "=", size, " (", c->source,
                   "): under a scheduler that starts one launcher per node the world is a "
                   "multiple of its tasks, and with one worker per task the ranks agree. Unset "
                   "the variables that do not describe this job");
    }
  } else if (AnySet(env, kOpenMpiVars)) {
    role = FromRankVars(env, kOpenMpi, kOpenMpiVars);
  } else if (AnySet(env, kSlurmTriggers)) {
    role = FromRankVars(env, kSlurm, kSlurmVars);
  } else {
    ReadMaster(env, "none", kTorchrunVars, false, "", &role);  // one worker, rank 0
  }
  role.selected_gpus = ParseSelectedGpus(env);
  return role;
}

UserDefinedRoleMaker::UserDefinedRoleMaker(int rank, int world_size,
                                           std::vector<std::string> endpoints) {
  role_.source = "user";
  role_.rank = rank;
  role_.world_size = world_size;
  KEEL_ENFORCE(world_size >= 1, "UserDefinedRoleMaker: world_size=", world_size, " must be >= 1");
  KEEL_ENFORCE(rank >= 0 && rank < world_size, "UserDefinedRoleMaker: rank=", rank,
               " is out of range [0, world_size=", world_size, ")");
  if (!endpoints.empty()) {
    ApplyEndpoints("UserDefinedRoleMaker: endpoints", endpoints, &role_);
  } else {
    KEEL_ENFORCE(world_size == 1, "UserDefinedRoleMaker: world_size=", world_size,
                 " needs endpoints (one host:port per rank), or a Role with master_addr and "
                 "master_port");
  }
}

UserDefinedRoleMaker::UserDefinedRoleMaker(Role role) : role_(std::move(role)) {
  role_.source = "user";
  if (!role_.endpoints.empty()) {
    // Fields left at their defaults are derived from the endpoints; CheckRole refuses the rest
    // when they differ.
    const Role defaults;
    Role derived = role_;
    KEEL_ENFORCE(role_.world_size >= 1 && role_.rank >= 0 && role_.rank < role_.world_size,
                 "UserDefinedRoleMaker: rank=", role_.rank,
                 " is out of range [0, world_size=", role_.world_size, ")");
    ApplyEndpoints("UserDefinedRoleMaker: endpoints", role_.endpoints, &derived);
    if (role_.current_endpoint.empty()) role_.current_endpoint = derived.current_endpoint;
    if (role_.master_addr == defaults.master_addr && role_.master_port == defaults.master_port) {
      role_.master_addr = derived.master_addr;
      role_.master_port = derived.master_port;
    }
    if (role_.local_rank == defaults.local_rank &&
        role_.local_world_size == defaults.local_world_size) {
      role_.local_rank = derived.local_rank;
      role_.local_world_size = derived.local_world_size;
    }
  }
  CheckRole(role_, "UserDefinedRoleMaker");
}

}  // namespace fleet
}  // namespace keel
