#include "fleet/fleet.h"

#include <arpa/inet.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "executor/executor_io.h"
#include "fleet/model_parallel_checkpoint.h"
#include "fleet/ps_checkpoint.h"
#include "fleet/transpile.h"
#include "framework/base/endpoint.h"
#include "framework/comm/collective_watch.h"
#include "framework/comm/comm_context.h"
#include "framework/comm/communicator.h"
#include "framework/comm/ring_model.h"
#include "framework/comm/store.h"
#include "framework/io/checkpoint.h"
#include "framework/op/op_registry.h"
#include "framework/profiler/profiler.h"
#include "framework/ps/ps_transport.h"
#include "transpiler/amp_weight_copy_pass.h"
#include "transpiler/gradient_merge_pass.h"
#include "transpiler/local_sgd_pass.h"
#include "transpiler/ps_pass.h"
#include "transpiler/sharding_pass.h"

DECLARE_string(cpu_comm_backend);

namespace keel {
namespace fleet {

namespace {

// Puts this process's trace timestamps on rank 0's clock: each rank in turn measures a round trip
// to rank 0 through the store and takes rank 0's time at its middle (error: half the round trip,
// tens of microseconds on one host). Every rank calls it (init, when --profile is set). Several
// rounds; the one with the shortest round trip (least time for a rank to be descheduled in)
// gives the offset.
void AlignProfilerClock(StoreClient& store, int rank, int nranks) {
  constexpr int kRounds = 8;
  if (nranks <= 1) return;
  const std::string prefix = "keel/profiler/clock/";
  try {
    if (rank == 0) {
      for (int r = 1; r < nranks; ++r)
        for (int round = 0; round < kRounds; ++round) {
          const std::string k = prefix + std::to_string(r) + "/" + std::to_string(round);
          store.Set(k + "/turn", "");
          store.Get(k + "/ping");  // waits for rank r
          store.Set(k + "/pong", std::to_string(profiler::internal::NowNs()));
        }
      return;
    }
    int64_t best_rtt = -1, best_offset = 0;
    for (int round = 0; round < kRounds; ++round) {
      const std::string k = prefix + std::to_string(rank) + "/" + std::to_string(round);
      store.Get(k + "/turn");  // rank 0 is ready to answer at once
      const int64_t sent = profiler::internal::NowNs();
      store.Set(k + "/ping", "");
      const int64_t theirs = std::stoll(store.Get(k + "/pong"));
      const int64_t back = profiler::internal::NowNs();
      if (best_rtt < 0 || back - sent < best_rtt) {
        best_rtt = back - sent;
        best_offset = theirs - (sent + back) / 2;
      }
    }
    profiler::SetClockOffsetNs(best_offset);
    VLOG(1) << "profiler: clock offset to rank 0 " << best_offset << " ns, round trip " << best_rtt
            << " ns";
  } catch (const Error& e) {
    KEEL_THROW("profiler: aligning rank ", rank, "'s clock with rank 0's: ", e.what());
  }
}

struct FleetState {
  bool initialized = false;
  Role role;
  Program* main = nullptr;
  Program* startup = nullptr;
  int barrier_round = 0;
  // Persistables the transpiler added to main (LocalSGD's snapshots and counters): checkpoints
  // leave them out, and `rebuild[main program id]` (startup's ops that write only them) makes
  // them again on load.
  std::set<std::string> pass_made;
  std::map<uint64_t, std::unique_ptr<Program>> rebuild;
  int check_round = 0;           // CheckSameOnEveryRank calls so far: each has its own keys
  uint64_t calls = 0;            // FleetCalls so far: their numbers for the collective watch
  std::set<uint64_t> minimized;  // Program::id() of every program minimize() rewrote
  bool eager_ring = false;       // the ring of fleet::all_reduce exists
  // Under sharding: the owner of each optimizer state var of main (transpiler/sharding_pass.h),
  // by main program id. A checkpoint gathers the others' state to rank 0; a load drops it.
  std::map<uint64_t, ShardedStateOwners> sharded_state;
  // Parameter-server mode: the single-device main program (what a checkpoint holds) and the
  // plan that split it, by the trainer's main program id.
  std::map<uint64_t, std::pair<std::shared_ptr<Program>, transpiler::PsPlan>> ps_programs;
  // Data-parallel replicas of each minimized main program (by id), when not the world size
  // (tensor-parallel groups and pipelines hold one replica over several ranks).
  std::map<uint64_t, int> dp_replicas;
};

// The ring of collectives outside programs (fleet::all_reduce); programs use small ids.
constexpr int kEagerRingId = std::numeric_limits<int>::max();

FleetState& State() {
  static FleetState* s = new FleetState;
  return *s;
}

// One of fleet's collective calls (barrier_worker, all_reduce and the metrics, the program and
// ring configuration checks), which every rank makes in the same order from the thread that runs
// its programs. While it waits, the collective watch knows it by `api` and its number; collectives
// made inside it are posted under its name. A failure the watch explains (the ranks are in calls
// that cannot complete together) is rethrown as the watch's report (Rethrow).
class FleetCall {
 public:
  explicit FleetCall(std::string api)
      : call_(std::move(api)), scope_(&call_), wait_("fleet", "fleet's calls", /*exclusive=*/true) {
    // Its own waits are on the store (barriers, checks, the eager ring's setup).
    wait_.SetInterrupt([] {
      if (CommContext::Get().initialized()) CommContext::Get().store("fleet").Abort();
    });
    wait_.Begin(++State().calls);
  }
  ~FleetCall() { wait_.End(); }
  FleetCall(const FleetCall&) = delete;
  FleetCall& operator=(const FleetCall&) = delete;

  // Throws the watch's report when it explains `e`, else `e` with `context` before it.
  [[noreturn]] void Rethrow(const Error& e, const std::string& context = "") const {
    const std::string why = CollectiveWatch::Get().Explain(e.what());
    if (why != e.what()) throw Error(call_.Name() + ": " + why);
    if (context.empty()) throw e;
    throw Error(context + e.what());
  }

 private:
  NamedCall call_;
  CollectiveCall::Scope scope_;
  WatchedWait wait_;
};

std::set<std::string> PersistableNames(const Program& p) {
  std::set<std::string> names;
  for (const VarDesc* v : p.global_block().AllVars())
    if (v->persistable()) names.insert(v->name());
  return names;
}

void RecordPassMadeVars(const std::set<std::string>& before, const Program& main,
                        const Program& startup) {
  FleetState& st = State();
  for (const std::string& n : PersistableNames(main))
    if (!before.count(n)) st.pass_made.insert(n);
  if (st.pass_made.empty()) return;
  std::unique_ptr<Program>& rebuild = st.rebuild[main.id()];
  // startup's ops whose every output is pass-made (e.g. snapshot = assign(parameter)), so that
  // after a load they compute from the loaded values.
  rebuild = startup.Clone();
  Block& b = rebuild->global_block();
  for (size_t i = b.num_ops(); i-- > 0;) {
    bool only_pass_made = false;
    for (const std::string& out : b.op(i)->OutputArgumentNames()) {
      only_pass_made = st.pass_made.count(out) > 0;
      if (!only_pass_made) break;
    }
    if (!only_pass_made) b.RemoveOp(i);
  }
}

std::set<std::string> PassMadeVarsOf(const Program& p) {
  std::set<std::string> skip;
  // A parameter-server program's checkpoint holds the single-device program's persistables: the
  // others (a trainer's blocks, GEO's snapshots; a server's blocks) are made by the pass.
  auto ps = State().ps_programs.find(p.id());
  if (ps != State().ps_programs.end()) {
    const Block& original = ps->second.first->global_block();
    for (const std::string& n : PersistableNames(p))
      if (!original.FindVar(n) || !original.FindVar(n)->persistable()) skip.insert(n);
    return skip;
  }
  for (const std::string& n : State().pass_made)
    if (p.global_block().FindVar(n)) skip.insert(n);
  return skip;
}

// The local address that routes to `peer` (no gethostname: an explicit, routable address).
std::string LocalAddressTowards(const std::string& peer, int port) {
  if (peer == "127.0.0.1" || peer == "localhost") return "127.0.0.1";
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (::getaddrinfo(peer.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    KEEL_THROW("cannot resolve the master address '", peer, "' (MASTER_ADDR / endpoints)");
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string ip = "127.0.0.1";
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof(me);
    char buf[INET_ADDRSTRLEN];
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
        ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf)))
      ip = buf;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return ip;
}

std::chrono::milliseconds CommTimeout() {
  return CommContext::Get().initialized()
             ? CommContext::Get().config().timeout
             : std::chrono::milliseconds(
                   static_cast<int64_t>(DistributedStrategy().comm_timeout_s) * 1000);
}

// A barrier through the store: the store names the ranks that never arrived, and fails at once
// when one of them closed its store connection (exited). At most `timeout` (the comm timeout).
void StoreBarrier(const std::string& name, std::chrono::milliseconds timeout = CommTimeout()) {
  const Role& r = State().role;
  if (r.world_size <= 1) return;
  FleetCall call("fleet::" + name);
  StoreClient& s = CommContext::Get().store(name);
  std::string key = "keel/barrier/" + name + "/" + std::to_string(State().barrier_round++);
  try {
    s.Barrier(key, r.world_size, timeout);
  } catch (const Error& e) {
    call.Rethrow(e, StrCat(name, ": rank ", r.rank, " of ", r.world_size,
                           " waited for the other workers (at most ", timeout.count() / 1000.0,
                           " s, FLAGS_comm_timeout_s): "));
  }
}

// Every rank publishes `text` (its fingerprint first) under keys of this check; rank 0 compares
// everyone's with its own, the others compare with rank 0's. `describe` words a mismatch.
void CheckSameOnEveryRank(
    const std::string& api, const std::string& what, const std::string& fp, const std::string& text,
    const std::function<std::string(int other, const std::string& their_fp,
                                    const std::string& their_text)>& describe) {
  const Role& r = role();
  if (r.world_size <= 1) return;
  FleetCall call(api);
  StoreClient& s = CommContext::Get().store("fleet: " + what + " check");
  const std::string prefix =
      "keel/check/" + std::to_string(State().check_round++) + "/" + what + "/";
  s.Set(prefix + std::to_string(r.rank), fp + "\n" + text);
  auto compare = [&](int other) {
    std::string theirs;
    try {
      theirs = s.GetUnlessPeerGone(prefix + std::to_string(other), CommTimeout());
    } catch (const Error& e) {
      call.Rethrow(e, StrCat("fleet: rank ", r.rank, " waited for rank ", other, " to compare the ",
                             what, ": "));
    }
    size_t nl = theirs.find('\n');
    std::string their_fp = theirs.substr(0, nl);
    if (their_fp == fp) return;
    KEEL_THROW(describe(other, their_fp, nl == std::string::npos ? "" : theirs.substr(nl + 1)));
  };
  if (r.rank == 0) {
    for (int other = 1; other < r.world_size; ++other) compare(other);
  } else {
    compare(0);
  }
}

// A program as ranks must agree on it: every attribute its op's schema declares per-rank (a
// ring's rank, device and group are each rank's own) at the schema's default, whatever the op;
// in the startup program also the seeds, since initializers may draw differently (every parameter
// is then broadcast from rank 0). Nothing else may differ.
std::unique_ptr<Program> ForComparison(const Program& program, bool startup) {
  std::unique_ptr<Program> p = program.Clone();
  if (startup) p->set_random_seed(0);
  for (int b = 0; b < p->num_blocks(); ++b)
    for (auto& op : p->block(b).ops()) {
      if (startup && op->HasAttr("seed")) op->SetAttr("seed", 0);
      const OpSchema* schema = OpRegistry::Find(op->type());
      if (schema == nullptr) continue;
      for (const AttrDef& a : schema->attrs())
        if (a.per_rank && op->HasAttr(a.name)) op->SetAttr(a.name, a.default_value);
    }
  return p;
}

// What rings are made of beyond the programs: ranks that disagree here would hang in ring setup.
std::string RingConfiguration() { return "cpu_comm_backend=" + FLAGS_cpu_comm_backend; }

// First line where two program texts differ, as "line N: <a> | <b>".
std::string FirstDifference(const std::string& a, const std::string& b) {
  std::istringstream ia(a), ib(b);
  std::string la, lb;
  for (int line = 1;; ++line) {
    bool ga = static_cast<bool>(std::getline(ia, la));
    bool gb = static_cast<bool>(std::getline(ib, lb));
    if (!ga && !gb) return "no difference";
    if (!ga || !gb || la != lb)
      return "line " + std::to_string(line) + ":\n    this rank: " + (ga ? la : "<end>") +
             "\n    other:     " + (gb ? lb : "<end>");
  }
}

}  // namespace

void init(const RoleMaker& role_maker) {
  FleetState& st = State();
  st.role = role_maker.Generate();
  st.initialized = true;
  const Role& r = st.role;
  LOG(INFO) << "fleet: " << r.ToString();
  profiler::SetRank(r.rank, r.world_size);
  if (r.world_size <= 1) return;
  CommConfig cfg;
  cfg.rank = r.rank;
  cfg.nranks = r.world_size;
  cfg.store_host = r.master_addr;
  cfg.store_port = r.master_port;
  if (!r.current_endpoint.empty()) {
    cfg.my_host = ParseEndpoint("PADDLE_CURRENT_ENDPOINT", r.current_endpoint).host;
  } else {
    cfg.my_host = LocalAddressTowards(r.master_addr, r.master_port);
  }
  cfg.token = JobTokenFromEnvironment(r.world_size);
  cfg.generation = RestartGenerationFromEnvironment();
  cfg.store_listen_all = r.num_nodes() > 1;
  DistributedStrategy defaults;
  cfg.timeout = std::chrono::milliseconds(static_cast<int64_t>(defaults.comm_timeout_s) * 1000);
  CommContext::Get().Init(cfg);
  // With --profile, trace timestamps on rank 0's clock, so the ranks' traces line up.
  if (profiler::Requested())
    AlignProfilerClock(CommContext::Get().store("profiler"), cfg.rank, cfg.nranks);
  // Before any ring exists (a program's or fleet::all_reduce's): ranks that disagree on how rings
  // are made would wait for each other in ring setup until the comm timeout.
  const std::string config = RingConfiguration();
  CheckSameOnEveryRank("fleet::init (comparing the ring configuration)", "ring configuration",
                       config, config,
                       [&](int other, const std::string& theirs, const std::string&) {
                         return StrCat("the ring configuration differs between ranks: rank ",
                                       r.rank, " has ", config, ", rank ", other, " has ", theirs,
                                       " (every rank must pass the same flags)");
                       });
}

bool initialized() { return State().initialized; }

const Role& role() {
  KEEL_ENFORCE(State().initialized, "fleet::init has not been called");
  return State().role;
}

int worker_index() { return role().trainer_id(); }
int worker_num() { return role().is_ps() ? role().trainer_num : role().world_size; }
bool is_first_worker() { return !role().is_server() && worker_index() == 0; }

bool is_server() { return role().is_server(); }
bool is_worker() { return !role().is_server(); }
int server_num() { return role().server_num; }
int server_index() {
  KEEL_ENFORCE(role().is_server(), "fleet::server_index: this process is not a parameter server");
  return role().rank;
}

void run_server(Executor& exe, const std::string& load_dir) {
  KEEL_ENFORCE(initialized() && role().is_server(),
               "fleet::run_server: this process is not a parameter server (TRAINING_ROLE=PSERVER)");
  exe.Run(startup_program());
  if (!load_dir.empty()) LoadPsServerState(exe, load_dir, main_program());
  exe.Run(main_program());  // listen_and_serv: returns when every trainer stopped
}

void stop_worker() {
  KEEL_ENFORCE(initialized() && role().is_ps() && !role().is_server(),
               "fleet::stop_worker: this process is not a parameter-server trainer");
  ps::Transport::Get().FinishTrainer();
}

TensorParallelConfig tensor_parallel_config(const DistributedStrategy& strategy) {
  strategy.Validate(role());
  return TensorParallelConfigFor(strategy, role());
}

Place worker_place() {
  const Role& r = role();
  return r.selected_gpus.empty() ? CPUPlace() : CUDAPlace(r.selected_gpus[0]);
}

namespace {
void AllReduceAs(Tensor* tensor, ReduceOp op, const std::string& api);
}  // namespace

void barrier_worker() {
  if (role().is_ps()) {
    // The trainers meet on their own ring (the servers are in listen_and_serv).
    KEEL_ENFORCE(!role().is_server(),
                 "fleet::barrier_worker on a parameter server: the trainers meet (call it on "
                 "the trainers)");
    Tensor t(DType::kFloat64, DDim({1}));
    *t.data<double>() = 0;
    AllReduceAs(&t, ReduceOp::kSum, "fleet::barrier_worker");
    return;
  }
  StoreBarrier("barrier_worker");
}

namespace {

// Fleet's eager ring, a CPU ring over every rank, set up on first use (inside a FleetCall). In
// parameter-server mode it spans the trainers only (group "trainers"): the servers are in their
// loop, and the trainers' metrics are theirs.
Communicator& EagerRing(const std::string& api) {
  const Role& r = role();
  FleetState& st = State();
  if (!st.eager_ring) {
    if (r.is_ps())
      CommContext::Get().CreateRing(kEagerRingId, r.trainer_num, r.trainer_id(), /*cuda=*/false, 0,
                                    "trainers", "fleet's eager ring of the trainers");
    else
      CommContext::Get().CreateRing(kEagerRingId, r.world_size, r.rank, /*cuda=*/false, 0, "",
                                    "fleet's eager ring");
    st.eager_ring = true;
  }
  return RingRegistry::Get().At(kEagerRingId, api);
}

// fleet::all_reduce as the user called it (`api`: fleet::all_reduce or one of the metrics).
void AllReduceAs(Tensor* tensor, ReduceOp op, const std::string& api) {
  KEEL_ENFORCE(tensor != nullptr && tensor->initialized(), api, ": the tensor holds no data");
  const Role& r = role();
  KEEL_ENFORCE(!r.is_server(), api,
               " on a parameter server: it reduces over the trainers (call it on the trainers)");
  if ((r.is_ps() ? r.trainer_num : r.world_size) <= 1) return;
  FleetCall call(api);
  try {
    Communicator& comm = EagerRing(api);
    if (tensor->place().is_cpu()) {
      comm.AllReduce(tensor, op);
    } else {
      Tensor host = tensor->Clone(CPUPlace());
      comm.AllReduce(&host, op);
      tensor->CopyFrom(host);
    }
  } catch (const Error& e) {
    call.Rethrow(e, api + ": ");
  }
}

// GradAllReduceOptions::group_bytes for `strategy` (DistributedStrategy::fuse_by_ring_model):
// from rank 0's cached ring model, else from one every rank measures now on fleet's eager ring
// (a CPU ring of the backend the gradients' rings use). 0 when the strategy does not group that
// way or the gradients' rings are not CPU rings.
double FusionGroupBytes(const DistributedStrategy& s, const Role& r) {
  if (r.world_size <= 1 || !s.fuse_all_reduce_ops || !s.fuse_by_ring_model || s.paddle_fuse.given ||
      s.use_local_sgd || s.gradient_merge)
    return 0;
  if (!r.selected_gpus.empty()) {
    LOG(INFO) << "fleet: fusion groups fill up to fuse_grad_size_in_MB / _num: the ring model "
                 "(fuse_by_ring_model) is measured on CPU rings only";
    return 0;
  }
  const std::string api = "fleet: measuring the ring for fusion groups";
  FleetCall call(api);
  try {
    Communicator& comm = EagerRing(api);
    const std::string path =
        r.rank == 0 ? RingModelCachePath(comm.backend(), r.world_size, r.num_nodes()) : "";
    std::optional<RingModel> cached = r.rank == 0 ? LoadRingModel(path) : std::nullopt;
    Tensor t(DType::kFloat64, DDim({3}));  // rank 0's cached model: {found, alpha, beta}
    t.data<double>()[0] = cached ? 1 : 0;
    t.data<double>()[1] = cached ? cached->alpha_s : 0;
    t.data<double>()[2] = cached ? cached->beta_s_per_byte : 0;
    comm.Broadcast(&t, 0);
    RingModel m{t.data<double>()[1], t.data<double>()[2]};
    const bool found = t.data<double>()[0] > 0;
    if (!found) {
      m = MeasureRingModel(comm);
      if (r.rank == 0) SaveRingModel(path, m);
    }
    const double bytes = GroupBytesFor(m);
    LOG(INFO) << "fleet: ring model (" << comm.backend() << ", "
              << (!found        ? std::string("measured")
                  : r.rank == 0 ? "cached in " + path
                                : std::string("rank 0's cache"))
              << "): " << m.alpha_s * 1e6 << " us latency, " << 1e-9 / m.beta_s_per_byte
              << " GB/s; fused gradient groups close at " << bytes / 1024 << " KiB";
    return bytes;
  } catch (const Error& e) {
    call.Rethrow(e, api + ": ");
  }
}

}  // namespace

void all_reduce(Tensor* tensor, ReduceOp op) { AllReduceAs(tensor, op, "fleet::all_reduce"); }

void internal::EagerBroadcast(Tensor* tensor, int root, const std::string& api) {
  KEEL_ENFORCE(tensor != nullptr && tensor->initialized() && tensor->place().is_cpu(), api,
               ": a broadcast needs a CPU tensor holding data");
  if (role().world_size <= 1) return;
  FleetCall call(api);
  try {
    EagerRing(api).Broadcast(tensor, root);
  } catch (const Error& e) {
    call.Rethrow(e, api + ": ");
  }
}

namespace metrics {
namespace {
double Reduce(double local, ReduceOp op, const char* api) {
  Tensor t(DType::kFloat64, DDim({1}));
  *t.data<double>() = local;
  AllReduceAs(&t, op, api);
  return *t.data<double>();
}
}  // namespace

double sum(double local) { return Reduce(local, ReduceOp::kSum, "fleet::metrics::sum"); }
double max(double local) { return Reduce(local, ReduceOp::kMax, "fleet::metrics::max"); }
double min(double local) { return Reduce(local, ReduceOp::kMin, "fleet::metrics::min"); }

double acc(double correct, double total) {
  Tensor t(DType::kFloat64, DDim({2}));
  t.data<double>()[0] = correct;
  t.data<double>()[1] = total;
  AllReduceAs(&t, ReduceOp::kSum, "fleet::metrics::acc");
  return t.data<double>()[1] > 0 ? t.data<double>()[0] / t.data<double>()[1] : 0.0;
}
}  // namespace metrics

DistributedOptimizer::DistributedOptimizer(std::unique_ptr<optimizer::Optimizer> opt,
                                           DistributedStrategy strategy)
    : opt_(std::move(opt)), strategy_(std::move(strategy)) {}

std::vector<ParamGrad> DistributedOptimizer::minimize(Var loss, Program* startup,
                                                      const std::set<std::string>& no_grad_set) {
  if (!State().initialized) init();
  const Role& r = State().role;
  strategy_.ApplyFlagOverrides();
  strategy_.Validate(r);
  DistributedStrategy::RequireImplemented(strategy_);
  LOG(INFO) << "fleet: " << strategy_.ToString();
  if (!startup) startup = &default_startup_program();
  Program& main = *loss.block()->program();
  KEEL_ENFORCE(!State().minimized.count(main.id()),
               "distributed_optimizer(...).minimize was already called on this program (loss '",
               loss.name(),
               "'): a program is minimized once; build another program for another "
               "optimizer");
  std::vector<ParamGrad> pg;
  if (strategy_.recompute) opt_->set_recompute(strategy_.recompute_configs.checkpoints);
  if (strategy_.amp) {
    amp::AmpConfig config = strategy_.amp_configs;
    config.place = worker_place().kind;
    amp_ = std::make_shared<amp::MixedPrecisionOptimizer>(*opt_, std::move(config));
    pg = amp_->minimize(loss, startup, no_grad_set);
  } else {
    pg = opt_->backward(loss, no_grad_set);
    opt_->apply_gradients(pg, startup);
  }
  State().minimized.insert(main.id());
  // Gradient merge on any number of workers, before the data-parallel passes (fleet/transpile.h).
  // Its buffers and counter are not pass-made: checkpoints hold them.
  fleet::TranspileGradientMerge(main, *startup, strategy_);
  fleet::TranspileSyncBatchNorm(main, *startup, strategy_);     // any number of workers
  fleet::TranspileFuseGemmEpilogue(main, *startup, strategy_);  // any number of workers
  if (r.is_ps()) {
    // Parameter-server mode (transpiler/ps_pass.h): every process built the same single-device
    // programs (compared here, before they become a trainer's or a server's), then each takes
    // its own part.
    CommContext::Get().SetTimeout(
        std::chrono::milliseconds(static_cast<int64_t>(strategy_.comm_timeout_s) * 1000));
    CheckProgramsMatch(*ForComparison(main, false), "main program");
    CheckProgramsMatch(*ForComparison(*startup, true), "startup program");
    std::shared_ptr<Program> original = main.Clone();
    transpiler::PsPlan plan = transpiler::PlanParameterServer(main, r.server_num);
    fleet::TranspileParameterServer(main, *startup, strategy_, r);
    State().ps_programs[main.id()] = {std::move(original), std::move(plan)};
  } else if (r.world_size > 1) {
    CommContext::Get().SetTimeout(
        std::chrono::milliseconds(static_cast<int64_t>(strategy_.comm_timeout_s) * 1000));
    std::set<std::string> before = PersistableNames(main);
    const bool sharding = strategy_.sharding;
    // Under sharding each rank's programs hold only its own updates, and pipeline stages their
    // own stage: the ranks compare the programs before that rewrite, which decides the rest
    // from the world size alone.
    const bool compare_before = sharding || strategy_.pipeline;
    if (compare_before) {
      CheckProgramsMatch(*ForComparison(main, false), "main program");
      CheckProgramsMatch(*ForComparison(*startup, true), "startup program");
    }
    // Model-parallel checkpoints hold the programs before the passes (model_parallel_checkpoint.h).
    const bool model_parallel = strategy_.pipeline || strategy_.tensor_parallel;
    std::unique_ptr<Program> whole_main = model_parallel ? main.Clone() : nullptr,
                             whole_startup = model_parallel ? startup->Clone() : nullptr;
    ShardedStateOwners owners;
    fleet::TranspileCollective(main, *startup, strategy_, r, FusionGroupBytes(strategy_, r),
                               &owners);
    if (sharding) State().sharded_state[main.id()] = std::move(owners);
    if (model_parallel) {
      RecordModelParallelLayout(main, std::move(whole_main), *whole_startup, strategy_, r);
      State().dp_replicas[main.id()] = TopologyFor(strategy_, r).dp_degree();
    }
    RecordPassMadeVars(before, main, *startup);
    if (!compare_before) {
      CheckProgramsMatch(*ForComparison(main, false), "main program");
      CheckProgramsMatch(*ForComparison(*startup, true), "startup program");
    }
  } else {
    // One worker: AMP O1's kept weight copies are the only pass (their copies, pass-made, are
    // not in checkpoints and are made again from the weights after a load).
    std::set<std::string> before = PersistableNames(main);
    fleet::TranspileCollective(main, *startup, strategy_, r);
    RecordPassMadeVars(before, main, *startup);
  }
  // A weight given a kept 16-bit copy (AMP O1) has no float32 gradient var any more: its copy's
  // gradient, which the update reads, stands for it.
  for (const transpiler::WeightCopy& wc : transpiler::FindWeightCopies(main))
    for (ParamGrad& p : pg)
      if (p.first == wc.weight) p.second = wc.grad;
  // A gradient whose op adds it into gradient merge's buffer (FuseGradAccumulationPass) has no
  // var of its own any more: the buffer, which holds the merge cycle's sum so far, stands for it.
  for (ParamGrad& p : pg)
    if (main.global_block().FindVar(p.second) == nullptr &&
        main.global_block().FindVar(p.second + "@GRAD_MERGED") != nullptr)
      p.second += "@GRAD_MERGED";
  State().main = &main;
  State().startup = startup;
  AttachExecutionStrategy(main, strategy_.exec_strategy);  // the executor running main uses it
  return pg;
}

Program& main_program() {
  KEEL_ENFORCE(State().main, "fleet::main_program: call distributed_optimizer(...).minimize first");
  return *State().main;
}

Program& startup_program() {
  KEEL_ENFORCE(State().startup,
               "fleet::startup_program: call distributed_optimizer(...).minimize first");
  return *State().startup;
}

void CheckProgramsMatch(const Program& program, const std::string& what) {
  const Role& r = role();
  if (r.world_size <= 1) return;
  const std::string text = program.ToText();
  const std::string fp = FingerprintHex(program.Fingerprint());
  CheckSameOnEveryRank("fleet::CheckProgramsMatch (" + what + ")", what, fp, text,
                       [&](int other, const std::string& their_fp, const std::string& theirs) {
                         return StrCat("the ", what, " differs between ranks: rank ", r.rank,
                                       " has fingerprint ", fp, ", rank ", other, " has ", their_fp,
                                       "; first difference at ", FirstDifference(text, theirs),
                                       "\n  (every rank must build the same program)");
                       });
}

ShardedStateOnRankZero::ShardedStateOnRankZero(Executor& exe, const Program& program)
    : scope_(&exe.scope()) {
  if (!initialized() || role().world_size <= 1) return;
  auto it = State().sharded_state.find(program.id());
  if (it == State().sharded_state.end()) return;
  // Each owner broadcasts its state on the data-parallel group's ring 0 (the sharding pass's), in
  // name order on every rank of the group, to the group's first rank: rank 0 without model
  // parallelism, else the holder the model-parallel gather reads (model_parallel_checkpoint.h).
  const int me = it->second.my_index;
  Communicator& ring =
      RingRegistry::Get().At(0, "fleet::save_persistables (gathering sharded state)");
  for (const auto& [name, owner] : it->second.index) {
    const VarDesc* v = program.global_block().MustFindVar(name);
    Tensor t;
    if (owner == me) {
      const Variable* var = scope_->FindVar(name);
      KEEL_ENFORCE(var != nullptr && var->tensor().initialized(), "sharding: rank ", role().rank,
                   " owns optimizer state '", name, "' but its scope holds none (run startup)");
      t = var->tensor().Clone(exe.place());
    } else {
      t = Tensor(v->dtype(), v->dims(), exe.place());
    }
    ring.Broadcast(&t, owner);
    if (me == 0 && owner != 0) {
      *scope_->Var(name)->mutable_tensor() = std::move(t);
      gathered_.push_back(name);
    }
  }
}

ShardedStateOnRankZero::~ShardedStateOnRankZero() {
  for (const std::string& name : gathered_) scope_->EraseVar(name);
}

void DropUnownedState(Scope& scope, const Program& program) {
  if (!initialized() || role().world_size <= 1) return;
  auto it = State().sharded_state.find(program.id());
  if (it == State().sharded_state.end()) return;
  for (const auto& [name, owner] : it->second.index)
    if (owner != it->second.my_index) scope.EraseVar(name);
}

// A model-parallel program fleet's minimize did not make has no recorded layout: its stages or
// shards cannot be gathered into one process's inference model (docs/tensor-parallel.md).
void RefuseTensorParallel(const Program& p, const char* api) {
  for (int b = 0; b < p.num_blocks(); ++b)
    for (const auto& op : p.block(b).ops())
      KEEL_ENFORCE(!OpRegistry::Traits(op->type()).shards_model, "fleet::", api,
                   ": the program is model-parallel (op ", op->type(),
                   ") but fleet's minimize did not make it, so its stages or tensor-parallel "
                   "shards cannot be gathered into one process's model (train it under "
                   "DistributedStrategy.tensor_parallel or .pipeline through fleet)");
}

void save_persistables(Executor& exe, const std::string& dirname, const Program* program) {
  const Program& p = program ? *program : main_program();
  if (initialized() && role().is_ps()) return SavePsCheckpoint(exe, dirname, p);
  // Under sharding, pipelines and tensor parallelism every rank calls this (rank 0 gathers the
  // rest); otherwise rank 0 alone may, as in Paddle's collective fleet: there is no barrier, and
  // the others' next collective waits for rank 0 (at most FLAGS_comm_timeout_s) while it writes.
  CheckpointOnRankZero gathered(exe, p);
  if (!initialized() || role().rank == 0)
    keel::save_persistables(gathered.scope(), dirname, gathered.program(), gathered.skip());
}

void load_persistables(Executor& exe, const std::string& dirname, const Program* program) {
  const Program& p = program ? *program : main_program();
  KEEL_ENFORCE(!initialized() || !role().is_server(),
               "fleet::load_persistables on a parameter server: a server loads its blocks of a "
               "checkpoint with fleet::run_server(exe, dir)");
  LoadThisRanksPart(exe, p,
                    [&](Scope& scope, const Place& place, const Program& prog,
                        const std::set<std::string>& skip) {
                      keel::load_persistables(scope, place, dirname, prog, skip);
                    });
  rebuild_pass_made_vars(exe, p);
}

std::set<std::string> pass_made_vars(const Program& program) { return PassMadeVarsOf(program); }

const Program* ps_single_device_program(const Program& program) {
  auto it = State().ps_programs.find(program.id());
  return it == State().ps_programs.end() ? nullptr : it->second.first.get();
}

const transpiler::PsPlan* ps_plan(const Program& program) {
  auto it = State().ps_programs.find(program.id());
  return it == State().ps_programs.end() ? nullptr : &it->second.second;
}

void ps_program_for_test(const Program& main, Program* test) {
  const transpiler::PsPlan* plan = ps_plan(main);
  if (plan == nullptr) return;
  const Block& b = main.global_block();
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const OpDesc& op = *b.op(i);
    if (op.type() != "distributed_lookup_table") continue;
    transpiler::RewriteDistributedLookups(*test, *plan, op.Attr<int>("pserver_num"),
                                          op.Attr<int>("mode"));
    return;
  }
}

void rebuild_pass_made_vars(Executor& exe, const Program& program, int64_t steps_done) {
  // Between two merge steps each data-parallel replica's merge buffers hold its own gradients,
  // and a checkpoint replica 0's: no replica of a multi-replica job could continue from it. (The
  // ranks of one tensor-parallel group hold shards of one replica's buffers, which a checkpoint
  // joins.)
  auto replicas = State().dp_replicas.find(program.id());
  const int dp = replicas != State().dp_replicas.end() ? replicas->second : role().world_size;
  if (initialized() && dp > 1 && transpiler::FindGradientMerge(program)) {
    const int64_t runs = transpiler::GradientMergeRunsAccumulated(exe.scope());
    KEEL_ENFORCE(runs == 0, "gradient merge: the checkpoint was taken ", runs,
                 " run(s) into an accumulation, when the merged gradients are each data-parallel "
                 "replica's own and it holds one replica's; with ",
                 dp,
                 " replicas resume from a checkpoint taken on a merge step (after a multiple of "
                 "gradient_merge_configs.k_steps runs)");
  }
  // Under sharding a checkpoint holds every owner's state: keep this rank's own.
  DropUnownedState(exe.scope(), program);
  auto it = State().rebuild.find(program.id());
  if (PassMadeVarsOf(program).empty() || it == State().rebuild.end()) return;
  exe.Run(*it->second);
  if (steps_done >= 0) transpiler::ResumeLocalSGDCounters(program, exe.scope(), steps_done);
}

void save_inference_model(Executor& exe, const std::string& dirname,
                          const std::vector<std::string>& feeds,
                          const std::vector<std::string>& targets, const Program* program) {
  const Program& p = program ? *program : main_program();
  // A pipeline or tensor-parallel program minimize made is gathered into the single-device
  // program (every rank calls this); one made otherwise cannot be.
  if (!IsModelParallel(p)) RefuseTensorParallel(p, "save_inference_model");
  KEEL_ENFORCE(!initialized() || !role().is_server(),
               "fleet::save_inference_model on a parameter server: trainer 0 saves (call it on "
               "the trainers)");
  if (!IsModelParallel(p)) {
    // Rank 0, or in parameter-server mode trainer 0 (its parameters are the servers' values).
    if (!initialized() || (role().is_ps() ? role().trainer_id() == 0 : role().rank == 0)) {
      // AMP O1's kept weight copies: the model reads the float32 weights through casts again.
      std::unique_ptr<Program> restored = p.Clone();
      transpiler::RestoreWeightCasts(*restored);
      keel::save_inference_model(dirname, feeds, targets, exe, *restored);
    }
    return;
  }
  CheckpointOnRankZero gathered(exe, p);
  if (role().rank != 0) return;
  keel::save_inference_model(dirname, feeds, targets, gathered.scope(),
                             *OneProcessInferenceProgram(gathered.program(), feeds, targets));
}

void reset() {
  ForgetModelParallelLayouts();
  CommContext::Get().Reset();
  State() = FleetState();
}

}  // namespace fleet
}  // namespace keel
