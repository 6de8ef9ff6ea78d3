// The rendezvous store's server: the acceptor thread that answers handshakes and sheds strangers,
// and a thread per accepted client that serves its requests (store.h).
#include "framework/comm/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "framework/base/strings.h"
#include "framework/comm/store_wire.h"
#include "framework/error.h"

namespace keel {

using store_wire::GetLE;
using store_wire::kAdd;
using store_wire::kBadGeneration;
using store_wire::kBadToken;
using store_wire::kBarrier;
using store_wire::kChallenge;
using store_wire::kCheck;
using store_wire::kDel;
using store_wire::kGet;
using store_wire::kGetAlive;
using store_wire::kOk;
using store_wire::kPeerGone;
using store_wire::kProofBytes;
using store_wire::kSet;
using store_wire::kTimeout;
using store_wire::ParseHello;
using store_wire::Proof;
using store_wire::Prover;
using store_wire::PutU64;
using store_wire::RandomBytes;
using store_wire::Reader;
using store_wire::ReadFrame;
using store_wire::SameProof;
using store_wire::Status;
using store_wire::WriteFrame;

namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// How many unauthenticated connections the server may hold: kMaxPendingConnections, and never
// more than a quarter of the process's fd limit (less the clients), so that strangers cannot take
// the fds the process needs for its own files.
int PendingCap(int clients) {
  rlimit rl;
  int cap = kMaxPendingConnections;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    cap = std::min<int64_t>(cap, static_cast<int64_t>(rl.rlim_cur) / 4 - clients - 3);
  return std::max(cap, 2);
}

void SetNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

}  // namespace

struct StoreServer::Pending {
  int fd = -1;
  std::string peer;
  Clock::time_point accepted;
  std::string buf;  // what arrived of the current frame, length prefix included
  // 0: reading the hello; 1: the challenge is sent, reading the client's proof.
  int stage = 0;
  std::string hello, server_nonce;
  StoreIdentity id;
};

StoreServer::StoreServer(const std::string& host, int port, std::string token, int64_t generation,
                         int listen_fd)
    : token_(std::move(token)), generation_(generation), last_summary_(Clock::now()) {
  if (listen_fd >= 0) {
    listen_fd_ = listen_fd;  // a socket the launcher bound and listens on
    SetNonBlocking(listen_fd_, true);
  } else {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    KEEL_ENFORCE(listen_fd_ >= 0, "store: socket(): ", std::strerror(errno));
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    // Loopback endpoints listen on loopback only; any other host listens on all interfaces.
    addr.sin_addr.s_addr =
        (host == "127.0.0.1" || host == "localhost") ? htonl(INADDR_LOOPBACK) : htonl(INADDR_ANY);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 512) != 0) {
      int err = errno;
      ::close(listen_fd_);
      KEEL_THROW("store: cannot listen on ", host, ":", port, ": ", std::strerror(err),
                 err == EADDRINUSE ? StrCat(" (another process holds port ", port,
                                            "; rank 0 serves the rendezvous store there)")
                                   : std::string());
    }
  }
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  if (::pipe2(wake_fd_, O_CLOEXEC | O_NONBLOCK) != 0) {
    int err = errno;
    ::close(listen_fd_);
    KEEL_THROW("store: pipe(): ", std::strerror(err));
  }
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

StoreServer::~StoreServer() {
  stop_ = true;
  char c = 1;
  (void)!::write(wake_fd_[1], &c, 1);
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  ::close(wake_fd_[0]);
  ::close(wake_fd_[1]);
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

void StoreServer::Refuse(const std::string& peer, const std::string& why) {
  ++refused_;
  std::lock_guard<std::mutex> lk(log_mu_);
  // The first refusals are logged one by one; after that a summary every 10 s at most.
  if (logged_refusals_ < 10) {
    ++logged_refusals_;
    LOG(WARNING) << "store: refused connection from " << peer << ": " << why;
    return;
  }
  ++unlogged_refusals_;
  if (MsSince(last_summary_) >= 10000) {
    LOG(WARNING) << "store: refused " << unlogged_refusals_ << " more connection(s) (last from "
                 << peer << ": " << why << ")";
    unlogged_refusals_ = 0;
    last_summary_ = Clock::now();
  }
}

void StoreServer::AcceptLoop() {
  std::deque<Pending> pending;  // oldest first
  auto drop = [&](std::deque<Pending>::iterator it, const std::string& why) {
    ::close(it->fd);
    Refuse(it->peer, why);
    return pending.erase(it);
  };
  // Kept open so that at fd exhaustion one can be freed to accept and shed a connection.
  int reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int backoff_ms = 0;
  Clock::time_point resume_accept = Clock::now();
  std::vector<pollfd> fds;
  while (!stop_) {
    const bool accepting = Clock::now() >= resume_accept;
    fds.clear();
    fds.push_back({wake_fd_[0], POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    int64_t timeout = -1;
    if (!pending.empty())
      timeout = std::max<int64_t>(0, kHelloTimeoutMs - MsSince(pending.front().accepted));
    if (!accepting) {
      int64_t left =
          std::chrono::duration_cast<std::chrono::milliseconds>(resume_accept - Clock::now())
              .count();
      timeout =
          timeout < 0 ? std::max<int64_t>(left, 0) : std::min(timeout, std::max<int64_t>(left, 0));
    }
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(timeout));
    if (stop_) break;
    if (n < 0 && errno != EINTR) {
      PLOG(ERROR) << "store: poll";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    // Hellos first (their fds index into `pending` as it was when polled).
    if (n > 0) {
      size_t i = 2;
      for (auto it = pending.begin(); it != pending.end(); ++i) {
        if (fds[i].revents == 0) {
          ++it;
          continue;
        }
        if (ReadHandshake(*it)) {
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto it = pending.begin(); it != pending.end();) {
      if (MsSince(it->accepted) >= kHelloTimeoutMs) {
        it = drop(it, StrCat("no complete handshake within ", kHelloTimeoutMs / 1000, " s"));
      } else {
        ++it;
      }
    }
    pending_count_ = static_cast<int>(pending.size());
    if (n <= 0 || !accepting || !(fds[1].revents & POLLIN)) continue;
    for (int accepted = 0; accepted < 64 && !stop_; ++accepted) {
      sockaddr_in peer{};
      socklen_t len = sizeof(peer);
      int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len,
                         SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK) break;
        if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
        // Out of fds or memory: shed the oldest stranger, or one connection of the backlog
        // through the reserve fd, and pause accepting so the loop does not spin.
        if (!pending.empty()) {
          drop(pending.begin(), StrCat("shed at ", std::strerror(err)));
        } else if (reserve_fd >= 0) {
          ::close(reserve_fd);
          int shed = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (shed >= 0) {
            ::close(shed);
            Refuse("?", StrCat("shed at ", std::strerror(err)));
          }
          reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
        backoff_ms = std::min(std::max(backoff_ms * 2, 10), 500);
        resume_accept = Clock::now() + std::chrono::milliseconds(backoff_ms);
        LOG_EVERY_N(WARNING, 100) << "store: accept failed (" << std::strerror(err)
                                  << "); backing off " << backoff_ms << " ms";
        break;
      }
      backoff_ms = 0;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      char ip[INET_ADDRSTRLEN] = "?";
      ::inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
      std::string who = std::string(ip) + ":" + std::to_string(ntohs(peer.sin_port));
      const int cap = PendingCap(client_count_.load());
      while (static_cast<int>(pending.size()) >= cap)
        drop(pending.begin(),
             StrCat("evicted: more than ", cap, " connections waiting to say hello"));
      Pending p;
      p.fd = fd;
      p.peer = who;
      p.accepted = Clock::now();
      pending.push_back(std::move(p));
    }
    pending_count_ = static_cast<int>(pending.size());
  }
  for (Pending& p : pending) ::close(p.fd);
  pending_count_ = 0;
  if (reserve_fd >= 0) ::close(reserve_fd);
}

bool StoreServer::ReadHandshake(Pending& p) {
  char buf[1024];
  while (true) {
    ssize_t k = ::recv(p.fd, buf, sizeof(buf), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (k <= 0) {
      ::close(p.fd);
      Refuse(p.peer, "closed before a complete handshake");
      return true;
    }
    p.buf.append(buf, static_cast<size_t>(k));
    if (p.buf.size() >= 4) {
      uint32_t n = static_cast<uint32_t>(GetLE(p.buf.data(), 4));
      const uint32_t cap = p.stage == 0 ? kMaxHelloBytes : kProofBytes;
      if (n > cap || p.buf.size() > 4 + static_cast<size_t>(n)) {
        ::close(p.fd);
        Refuse(p.peer, n > cap ? StrCat(p.stage == 0 ? "hello" : "proof", " of ", n,
                                        " bytes exceeds the cap of ", cap)
                               : std::string("sent more than its handshake before the reply"));
        return true;
      }
      if (p.buf.size() == 4 + static_cast<size_t>(n)) {
        if (Answer(p)) return true;
        p.buf.clear();  // the proof comes next
      }
    }
  }
}

bool StoreServer::Answer(Pending& p) {
  const int fd = p.fd;
  auto refuse = [&](Status code, const std::string& why, const std::string& extra = "") {
    Refuse(p.peer, why);  // counted before the client can see the answer
    SetNonBlocking(fd, false);
    WriteFrame(fd, std::string(1, static_cast<char>(code)) + extra);
    ::close(fd);
    return true;
  };
  if (p.stage == 0) {
    p.hello = p.buf.substr(4);
    if (!ParseHello(p.hello, &p.id)) {
      ::close(fd);
      Refuse(p.peer, "not a keel store client");
      return true;
    }
    // The challenge: 21 bytes on a fresh connection fit its socket buffer, so this nonblocking
    // send completes (or the connection is dropped).
    p.server_nonce = RandomBytes(store_wire::kNonceBytes);
    std::string frame;
    store_wire::PutU32(&frame, static_cast<uint32_t>(1 + p.server_nonce.size()));
    frame += static_cast<char>(kChallenge);
    frame += p.server_nonce;
    if (::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(frame.size())) {
      ::close(fd);
      Refuse(p.peer, "could not send the challenge");
      return true;
    }
    p.stage = 1;
    return false;
  }
  const StoreIdentity id = p.id;
  if (!SameProof(p.buf.substr(4), Proof(token_, Prover::kClient, p.hello, p.server_nonce)))
    return refuse(kBadToken, "wrong job token (its proof does not match)");
  if (id.generation != generation_) {
    std::string g;
    PutU64(&g, static_cast<uint64_t>(generation_));
    return refuse(kBadGeneration,
                  StrCat("restart generation ", id.generation, ", this store serves ", generation_),
                  g);
  }
  SetNonBlocking(fd, false);
  if (!WriteFrame(fd,
                  std::string(1, kOk) + Proof(token_, Prover::kServer, p.hello, p.server_nonce))) {
    ::close(fd);
    return true;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (id.rank >= 0) {
    ++ranks_[id.rank].open;
    nranks_seen_ = std::max(nranks_seen_, id.nranks);
  }
  client_fds_.push_back(fd);
  ++client_count_;
  std::string peer = p.peer;
  workers_.emplace_back([this, fd, peer, id] { Serve(fd, peer, id); });
  return true;
}

std::string StoreServer::RankStatus(int nranks) {
  // Under mu_.
  if (nranks <= 0) nranks = nranks_seen_;
  std::vector<int> never, closed;
  std::string detail;
  for (int r = 0; r < nranks; ++r) {
    auto it = ranks_.find(r);
    if (it == ranks_.end()) {
      never.push_back(r);
    } else if (it->second.open == 0) {
      closed.push_back(r);
      if (detail.empty())
        detail =
            StrCat(" (rank ", r, "'s closed ", MsSince(it->second.closed_at) / 1000.0, " s ago)");
    }
  }
  std::string s;
  if (!never.empty())
    s += StrCat("rank(s) ", StrJoin(never, ", "), " never connected to the store");
  if (!closed.empty())
    s += StrCat(s.empty() ? "" : "; ", "rank(s) ", StrJoin(closed, ", "),
                " closed their store connection", detail);
  return s;
}

void StoreServer::Serve(int fd, std::string peer, StoreIdentity who) {
  std::string frame;
  for (;;) {
    std::string err = ReadFrame(fd, &frame);
    if (!err.empty()) {
      if (err.find("exceeds") != std::string::npos) Refuse(peer, err);
      break;
    }
    Reader r{frame};
    uint8_t op = static_cast<uint8_t>(r.Int(1));
    std::string key = r.Key();
    std::string reply(1, kOk);
    if (!r.ok) {
      Refuse(peer, "malformed request");
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
        Refuse(peer, "malformed GET");
        break;
      }
      // GET_ALIVE also gives up as soon as a rank's store connection has closed.
      const bool alive = op == kGetAlive;
      std::unique_lock<std::mutex> lk(mu_);
      auto gone = [&] {
        std::string g;
        for (const auto& [rank, rc] : ranks_)
          if (rc.open == 0) g += (g.empty() ? "" : ", ") + std::to_string(rank);
        return g;
      };
      bool found = cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] {
        return stop_ || data_.count(key) > 0 || (alive && !gone().empty());
      });
      if (found && data_.count(key)) {
        reply += data_[key];
      } else if (alive && !gone().empty()) {
        reply[0] = static_cast<char>(kPeerGone);
        reply += "rank " + gone() + " closed its store connection (exited)";
      } else {
        reply[0] = static_cast<char>(kTimeout);
        reply += RankStatus(0);
      }
    } else if (op == kAdd) {
      int64_t delta = static_cast<int64_t>(r.Int(8));
      if (!r.ok) {
        Refuse(peer, "malformed ADD");
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
    } else if (op == kBarrier) {
      int nranks = static_cast<int>(r.Int(4));
      uint64_t wait_ms = r.Int(8);
      if (!r.ok || nranks <= 0 || who.rank < 0 || who.rank >= nranks) {
        Refuse(peer, "malformed BARRIER (or from a client without a rank)");
        break;
      }
      std::unique_lock<std::mutex> lk(mu_);
      Barrier& b = barriers_[key];
      b.arrived.insert(who.rank);
      if (static_cast<int>(b.arrived.size()) >= nranks) b.done = true;
      cv_.notify_all();
      // A rank that has not arrived and whose every store connection closed has exited.
      auto gone = [&]() -> int {
        for (int j = 0; j < nranks; ++j) {
          if (b.arrived.count(j)) continue;
          auto it = ranks_.find(j);
          if (it != ranks_.end() && it->second.open == 0) return j;
        }
        return -1;
      };
      int dead = -1;
      cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] {
        if (stop_ || b.done) return true;
        dead = gone();
        return dead >= 0;
      });
      if (b.done) {
        // Rank 0 serves this store and may exit as soon as it leaves the barrier: it is answered
        // only after every other rank's answer is written, so nobody waits on a dead server.
        if (who.rank == 0) {
          cv_.wait_for(lk, std::chrono::milliseconds(10000),
                       [&] { return stop_ || b.replied >= nranks - 1; });
        } else {
          lk.unlock();
          if (!WriteFrame(fd, reply)) break;
          lk.lock();
          ++b.replied;
          cv_.notify_all();
          continue;
        }
      } else {
        std::vector<int> missing;
        for (int j = 0; j < nranks; ++j)
          if (!b.arrived.count(j)) missing.push_back(j);
        reply[0] = static_cast<char>(dead >= 0 ? kPeerGone : kTimeout);
        reply += dead >= 0 ? StrCat("rank ", dead,
                                    " closed its store connection (exited or was killed) before "
                                    "arriving; still missing: rank(s) ",
                                    StrJoin(missing, ", "))
                           : StrCat("rank(s) ", StrJoin(missing, ", "), " never arrived");
        std::string status = RankStatus(nranks);
        if (!status.empty() && dead < 0) reply += " (" + status + ")";
      }
    } else {
      Refuse(peer, "unknown request code " + std::to_string(op));
      break;
    }
    if (!WriteFrame(fd, reply)) break;
  }
  std::lock_guard<std::mutex> lk(mu_);
  ::close(fd);
  client_fds_.erase(std::remove(client_fds_.begin(), client_fds_.end(), fd), client_fds_.end());
  --client_count_;
  if (who.rank >= 0) {
    RankConnections& rc = ranks_[who.rank];
    if (--rc.open == 0) rc.closed_at = Clock::now();
  }
  cv_.notify_all();  // barriers waiting on this rank fail now
}

std::vector<int> StoreServer::gone() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int> out;
  for (const auto& [rank, rc] : ranks_)
    if (rc.open == 0) out.push_back(rank);
  return out;
}

}  // namespace keel
