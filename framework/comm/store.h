// The rendezvous store: a small TCP key-value store that every rank uses to exchange addresses,
// NCCL ids and program fingerprints, served by keel launch on rank 0's node (it outlives every
// worker) or, without the launcher, by rank 0. The code: store_wire.{h,cc} (the wire
// format below), store_server.cc and store_client.cc.
//
// Wire format: every message is a frame, a little-endian u32 length then that many bytes. A
// connection opens with a handshake that proves knowledge of the job token without sending it:
//   client: hello (at most kMaxHelloBytes) "KEEL-STORE/3\n<client nonce>\n<generation>\n<rank>\n
//           <nranks>"
//   server: kChallenge + its own random nonce
//   client: HMAC-SHA256(token, "client" role, hello, server nonce)
//   server: kOk + HMAC-SHA256(token, "server" role, hello, server nonce); or a refusal code
//           (wrong proof; another restart generation), then it hangs up.
// The client checks the server's proof too: a process that took rank 0's port without the token
// cannot pose as the store. The whole handshake must complete within kHelloTimeoutMs of the
// connect. Until it does a connection costs the server one fd and no thread: the acceptor
// reads handshakes itself, holds at most kMaxPendingConnections of them (a new one evicts the
// oldest) and survives fd exhaustion (EMFILE/ENFILE) with backoff, so a flood of strangers
// neither exhausts the process nor keeps the job's ranks out (a client whose connection was
// dropped before the handshake retries until its timeout). Frames after the handshake are capped
// at kMaxFrameBytes and their buffers grow as bytes arrive, never ahead of them. Keys carry no
// secret either. Requests:
// SET key value | GET key timeout_ms | ADD key delta | CHECK key | DEL key |
// BARRIER key nranks timeout_ms | GET_ALIVE key timeout_ms (a GET that gives up as soon as a
// rank's connections have all closed, naming the ranks gone).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace keel {

constexpr uint32_t kMaxFrameBytes = 64u << 20;
constexpr uint32_t kMaxHelloBytes = 4096;
constexpr int kHelloTimeoutMs = 5000;
constexpr int kMaxPendingConnections = 64;

// Who a client is, sent in its hello. rank -1: not a rank of the job (a tool, a test).
struct StoreIdentity {
  int rank = -1;
  int nranks = 0;
  // The launcher's restart count (KEEL_RESTART_COUNT): a worker of restart N is refused by the
  // store of an earlier round (still shutting down) and retries until the new one serves.
  int64_t generation = 0;
};

// The server side, run in one process of the job (rank 0).
class StoreServer {
 public:
  // Listens on host:port (port 0 picks a free one, see port()). Throws keel::Error naming the
  // endpoint when it cannot bind. With `listen_fd` >= 0 it serves on that socket instead, already
  // bound and listening (keel launch's, launch_channel.h), and closes it when done.
  StoreServer(const std::string& host, int port, std::string token, int64_t generation = 0,
              int listen_fd = -1);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // Connections refused so far (wrong token proof, no or bad handshake, oversized or malformed
  // traffic, evicted while unauthenticated).
  int refused() const { return refused_.load(); }
  // Unauthenticated connections held now, and authenticated ones open now.
  int pending() const { return pending_count_.load(); }
  int clients() const { return client_count_.load(); }
  // Ranks whose every store connection has closed (they exited), in rank order.
  std::vector<int> gone() const;

 private:
  struct Pending;
  void AcceptLoop();
  // Reads what `p` sent and answers its handshake; true when it is done (accepted, handed to a
  // thread, or refused).
  bool ReadHandshake(Pending& p);
  // The hello or the proof (p.stage) is complete in p.buf; true when `p` is done.
  bool Answer(Pending& p);
  void Serve(int fd, std::string peer, StoreIdentity who);
  void Refuse(const std::string& peer, const std::string& why);
  // "ranks 1, 3 of 4 have no store connection (rank 3's closed 2.5 s ago)" or "".
  std::string RankStatus(int nranks);

  std::string token_;
  int64_t generation_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};  // the destructor wakes the acceptor through this pipe
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::atomic<int> pending_count_{0}, client_count_{0};
  std::thread acceptor_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
  struct Barrier {
    std::set<int> arrived;
    bool done = false;
    int replied = 0;  // ranks other than 0 whose answer was written
  };
  std::map<std::string, Barrier> barriers_;
  struct RankConnections {
    int open = 0;
    std::chrono::steady_clock::time_point closed_at;
  };
  std::map<int, RankConnections> ranks_;  // by rank, for every rank that ever connected
  int nranks_seen_ = 0;
  std::vector<std::thread> workers_;
  std::vector<int> client_fds_;

  // Refusal logging is rate-limited: a flood is summarized, not logged line by line.
  std::mutex log_mu_;
  int logged_refusals_ = 0, unlogged_refusals_ = 0;
  std::chrono::steady_clock::time_point last_summary_;
};

// A client connection. Thread-safe: one request at a time.
class StoreClient {
 public:
  // Connects to host:port and proves it knows `token` (store.h's handshake), retrying (refused
  // connections, a server not yet up, a dropped handshake, a store of an earlier restart
  // generation) until `timeout` passes. A refused proof fails at once, and so does a server that
  // cannot prove it knows the token (another process holds the port): a keel::Error naming the
  // endpoint.
  StoreClient(const std::string& host, int port, std::string token,
              std::chrono::milliseconds timeout, StoreIdentity identity = {});
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void Set(const std::string& key, const std::string& value);
  // Waits up to the store timeout for `key`; a keel::Error naming the key, and the ranks that
  // have no store connection, on timeout.
  std::string Get(const std::string& key);
  std::string Get(const std::string& key, std::chrono::milliseconds timeout);
  // As Get, but gives up at once, naming them, when a rank's store connection has closed.
  std::string GetUnlessPeerGone(const std::string& key, std::chrono::milliseconds timeout);
  int64_t Add(const std::string& key, int64_t delta);
  bool Check(const std::string& key);
  void Delete(const std::string& key);
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Waits until ranks 0..nranks-1 have all called Barrier(key) (this client must have a rank).
  // Fails at once when a rank that has not arrived loses its store connection (it exited), and
  // after `timeout` naming the ranks that never arrived.
  void Barrier(const std::string& key, int nranks, std::chrono::milliseconds timeout);

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& endpoint() const { return endpoint_; }
  // From another thread: makes a request blocked on this connection fail now (shutdown(2)).
  void Abort();

 private:
  std::string Request(const std::string& frame, std::chrono::milliseconds wait,
                      const std::string& what);

  int fd_ = -1;
  std::atomic<int> abort_fd_{-1};  // fd_ for Abort, which runs without mu_
  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
};

// The job token for a job of `world_size` ranks, from the environment: KEEL_JOB_TOKEN (keel launch
// sets a random one), else one derived from OpenMPI's per-job random key
// (OMPI_MCA_orte_precondition_transports, which mpirun gives every rank and nobody outside the
// job can read). A multi-rank job with neither is refused (a keel::Error saying how to set
// KEEL_JOB_TOKEN): a fixed default would let anyone who reaches the port into the job's keys.
// One worker needs no token ("" is returned).
std::string JobTokenFromEnvironment(int world_size);
// KEEL_RESTART_COUNT (set by keel launch --max_restarts), 0 when unset.
int64_t RestartGenerationFromEnvironment();

}  // namespace keel
