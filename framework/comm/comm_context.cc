#include "framework/comm/comm_context.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <chrono>
#include <csignal>

#include "framework/error.h"

DEFINE_string(cpu_comm_backend, "auto",
              "Collectives on CPU tensors: shm (shared memory; every rank of a ring on this "
              "host), gloo (TCP), or auto: shm where every rank is local, else gloo.");

namespace keel {

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
  if (cfg.rank == 0) {
    server_ = std::make_unique<StoreServer>(cfg.store_host, cfg.store_port, cfg.token);
    config_.store_port = server_->port();
  }
  // The connection carries our rank: when it closes, peers waiting at a barrier learn it at once.
  client_ = std::make_unique<StoreClient>(cfg.store_host, config_.store_port, cfg.token,
                                          cfg.timeout, cfg.rank);
  LOG(INFO) << "rank " << cfg.rank << " of " << cfg.nranks << " joined store "
            << client_->endpoint() << " in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
            << " s";
}

StoreClient& CommContext::store(const std::string& user) {
  KEEL_ENFORCE(initialized(), user,
               ": communication is not initialized; call fleet::init (or run under keel launch)");
  return *client_;
}

void CommContext::CreateRing(int ring_id, int nranks, int rank, bool cuda, int device,
                             const std::string& group) {
  StoreClient& s = store("c_comm_init");
  CommOptions opts;
  opts.my_host = config_.my_host;
  opts.timeout = config_.timeout;
  // Unique per job (token), group and initialization round, so a re-created ring never reads the
  // addresses of an earlier one and sub-group rings never mix.
  const std::string tag = group.empty() ? std::string() : "/g" + group;
  int64_t round = s.Add("keel/ring" + std::to_string(ring_id) + tag + "/round/rank" +
                            std::to_string(rank), 1);
  opts.prefix = config_.token + tag + "/r" + std::to_string(round) + "/";
  auto t0 = std::chrono::steady_clock::now();
  const std::string& want = FLAGS_cpu_comm_backend;
  KEEL_ENFORCE(want == "auto" || want == "shm" || want == "gloo", "--cpu_comm_backend must be "
               "auto, shm or gloo, got '", want, "'");
  std::shared_ptr<Communicator> comm;
  if (cuda) {
    comm = CreateNcclCommunicator(ring_id, rank, nranks, device, s, opts);
  } else {
    if (want != "gloo") {
      std::string why_not;
      comm = CreateShmCommunicator(ring_id, rank, nranks, s, opts, &why_not);
      KEEL_ENFORCE(comm || want != "shm", "c_comm_init ring ", ring_id, " (rank ", rank, " of ",
                   nranks, "): --cpu_comm_backend=shm, but shared memory cannot be used: ",
                   why_not);
      if (!comm)
        LOG(INFO) << "ring " << ring_id << ": shared memory not usable (" << why_not
                  << "); using gloo";
    }
    if (!comm) comm = CreateGlooCommunicator(ring_id, rank, nranks, s, opts);
  }
  LOG(INFO) << "ring " << ring_id << " (" << comm->backend() << ", rank " << rank << " of "
            << nranks << ") connected in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
            << " s";
  RingRegistry::Get().Put(ring_id, std::move(comm));
}

void CommContext::Reset() {
  RingRegistry::Get().Clear();
  client_.reset();
  server_.reset();
  config_ = CommConfig();
}

}  // namespace keel
