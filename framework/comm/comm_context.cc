#include "framework/comm/comm_context.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>

#include "framework/comm/collective_watch.h"
#include "framework/comm/launch_channel.h"
#include "framework/error.h"
#include "framework/runtime/device.h"
#include "framework/runtime/place.h"

DEFINE_string(cpu_comm_backend, "auto",
              "Collectives on CPU tensors: shm (shared memory; every rank of a ring on this "
              "host), gloo (TCP), or auto: shm where every rank is local, else gloo.");
DEFINE_string(gpu_comm_backend, "auto",
              "Collectives on CUDA tensors: nccl (one GPU per rank), host (staged through pinned "
              "host memory over the --cpu_comm_backend ring, so ranks may share a GPU), or auto: "
              "nccl when keel has NCCL and no two ranks of the ring share a GPU, else host.");

DEFINE_int32(shm_zero_copy_mb, 1024,
             "Shared-memory rings: MB of each rank's memory that its peers map. The fused gradient "
             "buffers go there, and their all-reduces read and write the ranks' buffers directly "
             "instead of copying through the ring (half the memory traffic). Pages are used only "
             "for the buffers placed there; buffers that do not fit copy. 0: off.");

namespace keel {

namespace {
NcclRingFactory g_nccl_rings = nullptr;
HostStagedRingFactory g_host_staged_rings = nullptr;
}  // namespace

void RegisterNcclRingFactory(NcclRingFactory factory) { g_nccl_rings = factory; }
void RegisterHostStagedRingFactory(HostStagedRingFactory factory) { g_host_staged_rings = factory; }

std::string ChooseGpuCommBackend(const std::string& flag, bool have_nccl,
                                 const std::vector<std::string>& gpus, int ring_id) {
  KEEL_ENFORCE(flag == "auto" || flag == "nccl" || flag == "host",
               "--gpu_comm_backend must be auto, nccl or host, got '", flag, "'");
  if (flag == "host") return "host";
  int shared_a = -1, shared_b = -1;
  for (size_t a = 0; a < gpus.size() && shared_a < 0; ++a)
    for (size_t b = a + 1; b < gpus.size(); ++b)
      if (gpus[a] == gpus[b]) {
        shared_a = static_cast<int>(a);
        shared_b = static_cast<int>(b);
        break;
      }
  if (flag == "auto") return have_nccl && shared_a < 0 ? "nccl" : "host";
  KEEL_ENFORCE(have_nccl,
               "--gpu_comm_backend=nccl, but this keel was built without NCCL (use "
               "--gpu_comm_backend=host)");
  KEEL_ENFORCE(shared_a < 0, "ring ", ring_id, ": ranks ", shared_a, " and ", shared_b,
               " share one GPU (", gpus[shared_a],
               "), which NCCL refuses (\"Duplicate GPU\"): "
               "with --selected_gpus listing a GPU twice use --gpu_comm_backend=host (or auto), "
               "not --gpu_comm_backend=nccl");
  return "nccl";
}

CommContext& CommContext::Get() {
  static CommContext* c = new CommContext;
  return *c;
}

void CommContext::Init(const CommConfig& cfg) {
  if (initialized()) {
    KEEL_ENFORCE(cfg.rank == config_.rank && cfg.nranks == config_.nranks &&
                     cfg.store_host == config_.store_host && cfg.store_port == config_.store_port,
                 "communication is already initialized as rank ", config_.rank, " of ",
                 config_.nranks, " with store ", config_.store_host, ":", config_.store_port);
    return;
  }
  KEEL_ENFORCE(cfg.nranks >= 1 && cfg.rank >= 0 && cfg.rank < cfg.nranks, "rank ", cfg.rank,
               " outside [0, ", cfg.nranks, ")");
  // Gloo writes to its sockets with write(2): a peer that dies would otherwise kill this process
  // with SIGPIPE, hiding the real failure. Ignored, a dead peer is an EPIPE that becomes a
  // keel::Error naming the collective. A handler the program installed itself is kept.
  struct sigaction old;
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL)
    std::signal(SIGPIPE, SIG_IGN);
  auto t0 = std::chrono::steady_clock::now();
  config_ = cfg;
  TellLauncher("rendezvous", cfg.rank);
  // Under keel launch the launcher serves the store on rank 0's port (launch_channel.h): the
  // store outlives every worker. Otherwise rank 0 serves it.
  if (cfg.rank == 0 && !LauncherServesStore(cfg.store_port)) {
    server_ = std::make_unique<StoreServer>(cfg.store_listen_all ? "0.0.0.0" : cfg.store_host,
                                            cfg.store_port, cfg.token, cfg.generation);
    config_.store_port = server_->port();
  }
  client_ =
      std::make_unique<StoreClient>(cfg.store_host, config_.store_port, cfg.token, cfg.timeout,
                                    StoreIdentity{cfg.rank, cfg.nranks, cfg.generation});
  // Each rank joins once. A second process with this rank (a RANK left in the environment, two
  // launchers given one node rank) is named at once instead of hanging or mixing up the rings.
  const std::string key =
      "keel/join/g" + std::to_string(cfg.generation) + "/rank" + std::to_string(cfg.rank);
  const std::string me = cfg.my_host + " pid " + std::to_string(::getpid());
  if (client_->Add(key, 1) > 1) {
    std::string first = client_->Get(key + "/who", std::chrono::milliseconds(5000));
    client_.reset();
    server_.reset();
    KEEL_THROW("rank ", cfg.rank, " of ", cfg.nranks, " joined the job twice: this process (", me,
               ") and ", first, " both have rank ", cfg.rank,
               "; every process needs its own rank (check RANK / PADDLE_TRAINER_ID and the "
               "launchers' --node_rank)");
  }
  client_->Set(key + "/who", me);
  // The collective watch posts through a connection of its own: the main one may be blocked in a
  // long wait (a store barrier, a ring's setup) that the watch has to end.
  CollectiveWatch::Get().Start(cfg.rank, cfg.nranks, [cfg, port = config_.store_port] {
    return std::make_unique<StoreClient>(cfg.store_host, port, cfg.token,
                                         std::min(cfg.timeout, std::chrono::milliseconds(10000)),
                                         StoreIdentity{cfg.rank, cfg.nranks, cfg.generation});
  });
  TellLauncher("joined", cfg.rank);
  LOG(INFO) << "rank " << cfg.rank << " of " << cfg.nranks << " joined store "
            << client_->endpoint() << " in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
}

void CommContext::SetTimeout(std::chrono::milliseconds timeout) {
  KEEL_ENFORCE(timeout.count() > 0, "communication timeout must be positive, got ", timeout.count(),
               " ms");
  config_.timeout = timeout;
}

StoreClient& CommContext::store(const std::string& user) {
  KEEL_ENFORCE(initialized(), user,
               ": communication is not initialized; call fleet::init (or run under keel launch)");
  return *client_;
}

void CommContext::CreateRing(int ring_id, int nranks, int rank, bool cuda, int device,
                             const std::string& group, const std::string& name, bool host_staged) {
  StoreClient& s = store("c_comm_init");
  const std::string shown = name.empty() ? "ring " + std::to_string(ring_id) : name;
  const std::string channel =
      "ring " + std::to_string(ring_id) + (group.empty() ? "" : " " + group);
  // Its waits are on the store: when the watch finds the ranks elsewhere, it shuts the connection.
  WatchedWait setup(channel, shown, /*exclusive=*/false);
  setup.SetInterrupt([&s] { s.Abort(); });
  std::shared_ptr<Communicator> comm;
  {
    WaitScope watched(&setup, 0);
    try {
      comm = Connect(ring_id, nranks, rank, cuda, device, group, shown, channel, host_staged);
    } catch (const Error& e) {
      throw Error(CollectiveWatch::Get().Explain(e.what()));
    }
  }
  comm->SetName(shown, channel);
  RingRegistry::Get().Put(ring_id, std::move(comm));
}

std::shared_ptr<Communicator> CommContext::Connect(int ring_id, int nranks, int rank, bool cuda,
                                                   int device, const std::string& group,
                                                   const std::string& name,
                                                   const std::string& channel, bool host_staged) {
  StoreClient& s = store("c_comm_init");
  CommOptions opts;
  opts.my_host = config_.my_host;
  opts.timeout = config_.timeout;
  // Unique per group and initialization round (the store is the job's own), so a re-created ring
  // never reads the addresses of an earlier one and sub-group rings never mix. No secret in it:
  // keys cross the wire and appear in error messages.
  const std::string tag = group.empty() ? std::string() : "/g" + group;
  int64_t round =
      s.Add("keel/ring" + std::to_string(ring_id) + tag + "/round/rank" + std::to_string(rank), 1);
  opts.prefix = "keel/rings" + tag + "/r" + std::to_string(round) + "/";
  auto t0 = std::chrono::steady_clock::now();
  const std::string& want = FLAGS_cpu_comm_backend;
  KEEL_ENFORCE(want == "auto" || want == "shm" || want == "gloo",
               "--cpu_comm_backend must be "
               "auto, shm or gloo, got '",
               want, "'");
  KEEL_ENFORCE(FLAGS_shm_zero_copy_mb >= 0, "--shm_zero_copy_mb must be >= 0, got ",
               FLAGS_shm_zero_copy_mb);
  KEEL_ENFORCE(want != "gloo" || gflags::GetCommandLineFlagInfoOrDie("shm_zero_copy_mb").is_default,
               "--shm_zero_copy_mb applies to shared-memory rings, but --cpu_comm_backend=gloo");
  opts.shm_shared_bytes = static_cast<size_t>(FLAGS_shm_zero_copy_mb) << 20;
  std::shared_ptr<Communicator> comm;
  std::string gpu_backend;
  if (cuda && host_staged) {
    gpu_backend = "host";
  } else if (cuda) {
    // Every rank publishes its GPU's identity, so all choose the same backend.
    const std::string key = opts.prefix + "gpu/rank";
    s.Set(key + std::to_string(rank), DeviceUuid(CUDAPlace(device)));
    std::vector<std::string> gpus;
    for (int r = 0; r < nranks; ++r) gpus.push_back(s.Get(key + std::to_string(r), opts.timeout));
    // (DeviceUuid opened libkeel_cuda, which registers the CUDA ring factories.)
    gpu_backend =
        ChooseGpuCommBackend(FLAGS_gpu_comm_backend, g_nccl_rings != nullptr, gpus, ring_id);
  }
  if (gpu_backend == "nccl") {
    comm = g_nccl_rings(ring_id, rank, nranks, device, s, opts);
  } else {
    std::unique_ptr<Communicator> host;
    if (want != "gloo") {
      std::string why_not;
      host = CreateShmCommunicator(ring_id, rank, nranks, s, opts, &why_not);
      KEEL_ENFORCE(host || want != "shm", "c_comm_init ring ", ring_id, " (rank ", rank, " of ",
                   nranks,
                   "): --cpu_comm_backend=shm, but shared memory cannot be used: ", why_not);
      if (!host) LOG(INFO) << name << ": shared memory not usable (" << why_not << "); using gloo";
    }
    if (!host) host = CreateGlooCommunicator(ring_id, rank, nranks, s, opts);
    host->SetName(name, channel);
    host->UseStoreMailbox(&s, opts.prefix + "ring" + std::to_string(ring_id) + "/p2p/",
                          opts.timeout);
    if (cuda) {
      KEEL_ENFORCE(g_host_staged_rings != nullptr, "ring ", ring_id,
                   ": the CUDA backend registered no host-staged rings");
      host = g_host_staged_rings(std::move(host), device);
    }
    comm = std::move(host);
  }
  LOG(INFO) << name << " (" << comm->backend() << ", rank " << rank << " of " << nranks
            << ") connected in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  return comm;
}

int64_t RingRegistry::InFlightNs() {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t longest = 0;
  for (auto& kv : rings_) longest = std::max(longest, kv.second->in_flight_ns());
  return longest;
}

void CommContext::Reset() {
  CollectiveWatch::Get().Stop();
  RingRegistry::Get().Clear();
  client_.reset();
  server_.reset();
  config_ = CommConfig();
}

}  // namespace keel
