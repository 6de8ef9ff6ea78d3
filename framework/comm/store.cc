#include "framework/comm/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "framework/error.h"

namespace keel {

namespace {

constexpr char kHello[] = "KEEL-STORE/1 ";
enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kDel = 5, kRank = 6, kGetAlive = 7 };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kBad = 2, kGone = 3 };

void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLE(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Reads exactly n bytes; false on EOF, error or when `deadline_ms` (-1: none) passes.
bool ReadAll(int fd, char* buf, size_t n, int64_t deadline_ms = -1) {
  auto start = std::chrono::steady_clock::now();
  size_t got = 0;
  while (got < n) {
    if (deadline_ms >= 0) {
      int64_t left = deadline_ms - std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - start)
                                       .count();
      if (left <= 0) return false;
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
    }
    ssize_t k = ::recv(fd, buf + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    got += static_cast<size_t>(k);
  }
  return true;
}

bool WriteAll(int fd, const char* buf, size_t n) {
  size_t sent = 0;
  while (sent < n) {
    ssize_t k = ::send(fd, buf + sent, n - sent, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    sent += static_cast<size_t>(k);
  }
  return true;
}

bool WriteFrame(int fd, const std::string& payload) {
  std::string f;
  f.reserve(4 + payload.size());
  PutU32(&f, static_cast<uint32_t>(payload.size()));
  f += payload;
  return WriteAll(fd, f.data(), f.size());
}

// Reads one frame; returns an error description (empty on success).
std::string ReadFrame(int fd, std::string* out, int64_t deadline_ms = -1) {
  char len[4];
  if (!ReadAll(fd, len, 4, deadline_ms)) return "connection closed or timed out";
  uint32_t n = static_cast<uint32_t>(GetLE(len, 4));
  if (n > kMaxFrameBytes)
    return "frame of " + std::to_string(n) + " bytes exceeds the cap of " +
           std::to_string(kMaxFrameBytes);
  out->resize(n);
  if (n && !ReadAll(fd, &(*out)[0], n, deadline_ms)) return "connection closed mid-frame";
  return "";
}

// A cursor over a request payload that refuses to read past the end.
struct Reader {
  const std::string& s;
  size_t pos = 0;
  bool ok = true;
  uint64_t Int(int n) {
    if (pos + n > s.size()) {
      ok = false;
      return 0;
    }
    uint64_t v = GetLE(s.data() + pos, n);
    pos += n;
    return v;
  }
  std::string Bytes(size_t n) {
    if (pos + n > s.size()) {
      ok = false;
      return "";
    }
    std::string v = s.substr(pos, n);
    pos += n;
    return v;
  }
  std::string Key() { return Bytes(Int(4)); }
};

std::string KeyField(const std::string& key) {
  std::string s;
  PutU32(&s, static_cast<uint32_t>(key.size()));
  return s + key;
}

}  // namespace

std::pair<std::string, int> ParseEndpoint(const std::string& ep, const std::string& what) {
  size_t colon = ep.rfind(':');
  KEEL_ENFORCE(colon != std::string::npos && colon > 0 && colon + 1 < ep.size(), what, ": '", ep,
               "' is not host:port");
  std::string host = ep.substr(0, colon), port_s = ep.substr(colon + 1);
  int port = 0;
  for (char c : port_s) {
    KEEL_ENFORCE(c >= '0' && c <= '9' && port_s.size() <= 5, what, ": port '", port_s,
                 "' of '", ep, "' is not a number");
    port = port * 10 + (c - '0');
  }
  KEEL_ENFORCE(port > 0 && port < 65536, what, ": port ", port, " of '", ep,
               "' is outside 1..65535");
  return {host, port};
}

// ---------------------------------------------------------------- server

StoreServer::StoreServer(const std::string& host, int port, std::string token)
    : token_(std::move(token)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  KEEL_ENFORCE(listen_fd_ >= 0, "store: socket(): ", std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  // Loopback endpoints listen on loopback only; any other host listens on all interfaces.
  addr.sin_addr.s_addr = (host == "127.0.0.1" || host == "localhost") ? htonl(INADDR_LOOPBACK)
                                                                      : htonl(INADDR_ANY);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 512) != 0) {
    int err = errno;
    ::close(listen_fd_);
    KEEL_THROW("store: cannot listen on ", host, ":", port, ": ", std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

StoreServer::~StoreServer() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

void StoreServer::AcceptLoop() {
  while (!stop_) {
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stop_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char ip[INET_ADDRSTRLEN] = "?";
    ::inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
    std::string who = std::string(ip) + ":" + std::to_string(ntohs(peer.sin_port));
    std::lock_guard<std::mutex> lk(mu_);
    client_fds_.push_back(fd);
    workers_.emplace_back([this, fd, who] { Serve(fd, who); });
  }
}

void StoreServer::Serve(int fd, std::string peer) {
  auto refuse = [&](const std::string& why) {
    ++refused_;
    LOG(WARNING) << "store: refused connection from " << peer << ": " << why;
  };
  std::string frame;
  // The hello must come promptly; a silent peer is dropped after 10 s.
  std::string err = ReadFrame(fd, &frame, 10000);
  if (!err.empty()) {
    refuse("no hello (" + err + ")");
  } else if (frame != kHello + token_) {
    refuse(frame.compare(0, sizeof(kHello) - 1, kHello) == 0 ? "wrong job token"
                                                             : "not a keel store client");
  } else if (WriteFrame(fd, std::string(1, kOk))) {
    int rank = -1;  // whose connection this is, once a RANK request said so
    struct MarkGone {  // however the loop ends, a rank's closed connection is recorded
      StoreServer* server;
      const int& rank;
      ~MarkGone() {
        if (rank < 0) return;
        {
          std::lock_guard<std::mutex> lk(server->mu_);
          server->gone_.push_back(rank);
        }
        server->cv_.notify_all();
      }
    } mark_gone{this, rank};
    for (;;) {
      err = ReadFrame(fd, &frame);
      if (!err.empty()) {
        if (err.find("exceeds") != std::string::npos) refuse(err);
        break;
      }
      Reader r{frame};
      uint8_t op = static_cast<uint8_t>(r.Int(1));
      std::string key = r.Key();
      std::string reply(1, kOk);
      if (!r.ok) {
        refuse("malformed request");
        break;
      }
      if (op == kSet) {
        // Reply before the value becomes visible: a set may release rank 0 (this process) from a
        // barrier, and rank 0 may then exit; the setter must have its reply by then.
        std::string value = r.Bytes(frame.size() - r.pos);
        if (!WriteFrame(fd, reply)) break;
        {
          std::lock_guard<std::mutex> lk(mu_);
          data_[key] = std::move(value);
        }
        cv_.notify_all();
        continue;
      } else if (op == kGet || op == kGetAlive) {
        uint64_t wait_ms = r.Int(8);
        if (!r.ok) {
          refuse("malformed GET");
          break;
        }
        const bool alive = op == kGetAlive;
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] {
          return stop_ || data_.count(key) > 0 || (alive && !gone_.empty());
        });
        if (data_.count(key)) {
          reply += data_[key];
        } else if (alive && !gone_.empty()) {
          reply[0] = static_cast<char>(kGone);
          for (int g : gone_) PutU32(&reply, static_cast<uint32_t>(g));
        } else {
          reply[0] = static_cast<char>(kTimeout);
        }
      } else if (op == kRank) {
        if (key.empty() || key.size() > 9 ||
            key.find_first_not_of("0123456789") != std::string::npos) {
          refuse("malformed RANK");
          break;
        }
        rank = std::stoi(key);
      } else if (op == kAdd) {
        int64_t delta = static_cast<int64_t>(r.Int(8));
        if (!r.ok) {
          refuse("malformed ADD");
          break;
        }
        int64_t v;
        {
          std::lock_guard<std::mutex> lk(mu_);
          std::string& cur = data_[key];
          v = (cur.size() == 8 ? static_cast<int64_t>(GetLE(cur.data(), 8)) : 0) + delta;
          cur.clear();
          PutU64(&cur, static_cast<uint64_t>(v));
        }
        PutU64(&reply, static_cast<uint64_t>(v));
        if (!WriteFrame(fd, reply)) break;
        cv_.notify_all();  // after the reply, as for set
        continue;
      } else if (op == kCheck) {
        std::lock_guard<std::mutex> lk(mu_);
        reply.push_back(data_.count(key) ? 1 : 0);
      } else if (op == kDel) {
        std::lock_guard<std::mutex> lk(mu_);
        data_.erase(key);
      } else {
        refuse("unknown request code " + std::to_string(op));
        break;
      }
      if (!WriteFrame(fd, reply)) break;
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  ::close(fd);
  client_fds_.erase(std::remove(client_fds_.begin(), client_fds_.end(), fd), client_fds_.end());
}

std::vector<int> StoreServer::gone() const {
  std::lock_guard<std::mutex> lk(mu_);
  return gone_;
}

// ---------------------------------------------------------------- client

StoreClient::StoreClient(const std::string& host, int port, std::string token,
                         std::chrono::milliseconds timeout, int rank)
    : endpoint_(host + ":" + std::to_string(port)), timeout_(timeout) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  KEEL_ENFORCE(gai == 0 && res, "store ", endpoint_, ": cannot resolve host '", host,
               "': ", ::gai_strerror(gai));
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error = "no attempt";
  auto backoff = std::chrono::milliseconds(20);
  while (true) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KEEL_ENFORCE(fd_ >= 0, "store: socket(): ", std::strerror(errno));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    last_error = std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    if (std::chrono::steady_clock::now() + backoff > deadline)
      KEEL_THROW("store ", endpoint_, ": could not connect within ", timeout.count() / 1000.0,
                 " s (", last_error, "); is rank 0 running and is the endpoint right?");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::string reply;
  KEEL_ENFORCE(WriteFrame(fd_, kHello + token) &&
                   ReadFrame(fd_, &reply, timeout.count()).empty() && reply.size() == 1 &&
                   reply[0] == kOk,
               "store ", endpoint_, ": the server refused this client (a different job token? ",
               "every rank must have the same KEEL_JOB_TOKEN)");
  if (rank >= 0) {
    std::string f(1, static_cast<char>(kRank));
    f += KeyField(std::to_string(rank));
    Request(f, std::chrono::milliseconds(0), "rank announcement");
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string StoreClient::Request(const std::string& frame, std::chrono::milliseconds wait,
                                 const std::string& what) {
  std::lock_guard<std::mutex> lk(mu_);
  KEEL_ENFORCE(fd_ >= 0, "store ", endpoint_, ": connection is closed");
  std::string reply;
  // The reply may take `wait` (a blocking GET) plus some slack for the network.
  std::string err;
  if (!WriteFrame(fd_, frame)) err = std::strerror(errno);
  else err = ReadFrame(fd_, &reply, wait.count() + 10000);
  if (!err.empty() || reply.empty()) {
    ::close(fd_);
    fd_ = -1;
    KEEL_THROW("store ", endpoint_, ": ", what, " failed: ",
               err.empty() ? "empty reply" : err, " (did rank 0 exit?)");
  }
  return reply;
}

void StoreClient::Set(const std::string& key, const std::string& value) {
  std::string f(1, static_cast<char>(kSet));
  f += KeyField(key) + value;
  Request(f, std::chrono::milliseconds(0), "set '" + key + "'");
}

std::string StoreClient::Get(const std::string& key) { return Get(key, timeout_); }

std::string StoreClient::Get(const std::string& key, std::chrono::milliseconds timeout) {
  std::string f(1, static_cast<char>(kGet));
  f += KeyField(key);
  PutU64(&f, static_cast<uint64_t>(timeout.count()));
  std::string r = Request(f, timeout, "get '" + key + "'");
  KEEL_ENFORCE(r[0] == kOk, "store ", endpoint_, ": key '", key, "' did not appear within ",
               timeout.count() / 1000.0, " s (a rank that never arrived?)");
  return r.substr(1);
}

std::string StoreClient::GetUnlessPeerGone(const std::string& key,
                                           std::chrono::milliseconds timeout) {
  std::string f(1, static_cast<char>(kGetAlive));
  f += KeyField(key);
  PutU64(&f, static_cast<uint64_t>(timeout.count()));
  std::string r = Request(f, timeout, "get '" + key + "'");
  if (r[0] == kGone) {
    std::string ranks;
    for (size_t p = 1; p + 4 <= r.size(); p += 4)
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(GetLE(r.data() + p, 4));
    KEEL_THROW("store ", endpoint_, ": waiting for key '", key, "', but the store connection of ",
               "rank ", ranks, " has closed (the process exited or was killed)");
  }
  KEEL_ENFORCE(r[0] == kOk, "store ", endpoint_, ": key '", key, "' did not appear within ",
               timeout.count() / 1000.0, " s (a rank that never arrived?)");
  return r.substr(1);
}

int64_t StoreClient::Add(const std::string& key, int64_t delta) {
  std::string f(1, static_cast<char>(kAdd));
  f += KeyField(key);
  PutU64(&f, static_cast<uint64_t>(delta));
  std::string r = Request(f, std::chrono::milliseconds(0), "add '" + key + "'");
  KEEL_ENFORCE(r.size() == 9, "store ", endpoint_, ": malformed reply to add");
  return static_cast<int64_t>(GetLE(r.data() + 1, 8));
}

bool StoreClient::Check(const std::string& key) {
  std::string f(1, static_cast<char>(kCheck));
  f += KeyField(key);
  std::string r = Request(f, std::chrono::milliseconds(0), "check '" + key + "'");
  return r.size() == 2 && r[1] == 1;
}

void StoreClient::Delete(const std::string& key) {
  std::string f(1, static_cast<char>(kDel));
  f += KeyField(key);
  Request(f, std::chrono::milliseconds(0), "delete '" + key + "'");
}

void StoreClient::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto& k : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    Get(k, std::max(left, std::chrono::milliseconds(0)));
  }
}

}  // namespace keel
