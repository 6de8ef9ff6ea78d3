// The rendezvous store: a small TCP key-value store that rank 0 serves and every rank uses to
// exchange addresses, NCCL ids and program fingerprints.
//
// Wire format: every message is a frame, a little-endian u32 length then that many bytes, at most
// kMaxFrameBytes. A connection opens with a hello frame "KEEL-STORE/1 <token>"; the server drops a
// connection whose token is not the job's, whose frame is oversized or whose request is malformed,
// and logs why. Requests: SET key value | GET key timeout_ms | ADD key delta | CHECK key | DEL key
// | RANK r (this connection is rank r's) | GET_ALIVE key timeout_ms (a GET that gives up as soon
// as a rank's connection has closed, naming the ranks gone).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace keel {

constexpr uint32_t kMaxFrameBytes = 64u << 20;

// The server side, run in one process of the job (rank 0).
class StoreServer {
 public:
  // Listens on host:port (port 0 picks a free one, see port()). Throws keel::Error naming the
  // endpoint when it cannot bind.
  StoreServer(const std::string& host, int port, std::string token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // Connections refused so far (wrong token, oversized or malformed traffic).
  int refused() const { return refused_.load(); }
  // Ranks whose connection (after a RANK request) has closed, for whatever reason.
  std::vector<int> gone() const;

 private:
  void AcceptLoop();
  void Serve(int fd, std::string peer);

  std::string token_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
  std::vector<int> gone_;  // ranks whose connection closed, in the order they closed
  std::vector<std::thread> workers_;
  std::vector<int> client_fds_;
};

// A client connection. Thread-safe: one request at a time.
class StoreClient {
 public:
  // Connects to host:port, retrying until `timeout` passes; then says hello with `token`. With
  // rank >= 0 the connection is that rank's: when it closes, GetUnlessPeerGone stops waiting.
  StoreClient(const std::string& host, int port, std::string token,
              std::chrono::milliseconds timeout, int rank = -1);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void Set(const std::string& key, const std::string& value);
  // Waits up to the store timeout for `key`; a keel::Error naming the key on timeout.
  std::string Get(const std::string& key);
  std::string Get(const std::string& key, std::chrono::milliseconds timeout);
  // Get, but fails at once (a keel::Error naming the ranks) once the store connection of any
  // rank has closed while `key` is absent: a peer that exited or was killed never sets it.
  std::string GetUnlessPeerGone(const std::string& key, std::chrono::milliseconds timeout);
  int64_t Add(const std::string& key, int64_t delta);
  bool Check(const std::string& key);
  void Delete(const std::string& key);
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string Request(const std::string& frame, std::chrono::milliseconds wait,
                      const std::string& what);

  int fd_ = -1;
  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
};

// "host:port" -> (host, port); a keel::Error naming `what` when malformed.
std::pair<std::string, int> ParseEndpoint(const std::string& endpoint, const std::string& what);

}  // namespace keel
