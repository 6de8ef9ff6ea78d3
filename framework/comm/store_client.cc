// The rendezvous store's client (a connection that retries until the server answers its hello,
// then one request at a time), and the job identity a rank says hello with (store.h).
#include "framework/comm/store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "framework/comm/store_wire.h"
#include "framework/error.h"

namespace keel {

using store_wire::GetLE;
using store_wire::HelloPayload;
using store_wire::kAdd;
using store_wire::kBad;
using store_wire::kBadGeneration;
using store_wire::kBadToken;
using store_wire::kBarrier;
using store_wire::kChallenge;
using store_wire::kCheck;
using store_wire::kDel;
using store_wire::KeyField;
using store_wire::kGet;
using store_wire::kGetAlive;
using store_wire::kNonceBytes;
using store_wire::kOk;
using store_wire::kPeerGone;
using store_wire::kProofBytes;
using store_wire::kSet;
using store_wire::Proof;
using store_wire::Prover;
using store_wire::PutU32;
using store_wire::PutU64;
using store_wire::RandomBytes;
using store_wire::ReadFrame;
using store_wire::SameProof;
using store_wire::WriteFrame;

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

StoreClient::StoreClient(const std::string& host, int port, std::string token,
                         std::chrono::milliseconds timeout, StoreIdentity identity)
    : endpoint_(host + ":" + std::to_string(port)), timeout_(timeout) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  KEEL_ENFORCE(gai == 0 && res, "store ", endpoint_, ": cannot resolve host '", host,
               "': ", ::gai_strerror(gai));
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  auto backoff = std::chrono::milliseconds(20);
  while (true) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {  // out of fds or buffers for a moment: retried like a refused connect
      int err = errno;
      KEEL_ENFORCE(err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM,
                   "store: socket(): ", std::strerror(err));
      last_error = StrCat("socket(): ", std::strerror(err));
    } else if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      int one = 1;
      ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      const int64_t left = std::max<int64_t>(
          1000,
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      // A fresh nonce per attempt: the server's proof answers this very hello.
      const std::string hello = HelloPayload(RandomBytes(kNonceBytes), identity);
      std::string challenge, reply;
      bool answered = WriteFrame(fd_, hello) && ReadFrame(fd_, &challenge, left, 64).empty() &&
                      !challenge.empty();
      if (answered && challenge[0] == kChallenge && challenge.size() == 1 + kNonceBytes) {
        const std::string server_nonce = challenge.substr(1);
        answered = WriteFrame(fd_, Proof(token, Prover::kClient, hello, server_nonce)) &&
                   ReadFrame(fd_, &reply, left, 64).empty() && !reply.empty();
        if (answered && reply[0] == kOk) {
          if (reply.size() == 1 + kProofBytes &&
              SameProof(reply.substr(1), Proof(token, Prover::kServer, hello, server_nonce))) {
            abort_fd_ = fd_;
            break;
          }
          ::close(fd_);
          fd_ = -1;
          KEEL_THROW("store ", endpoint_,
                     ": the process answering there does not know the job token (it accepted "
                     "this client's proof without proving its own): another program holds rank "
                     "0's port ",
                     port, "; nothing was sent to it but a one-time proof");
        }
      } else if (answered) {
        reply = challenge;  // a refusal before the proof (or not a keel store at all)
      }
      if (answered) {
        ::close(fd_);
        fd_ = -1;
        KEEL_ENFORCE(reply[0] != kBadToken, "store ", endpoint_,
                     ": the server refused this client's proof of the job token (every rank "
                     "must have the same KEEL_JOB_TOKEN; or another job's store holds port ",
                     port, ")");
        if (reply[0] == kBadGeneration && reply.size() == 9) {
          last_error =
              StrCat("it serves restart generation ", GetLE(reply.data() + 1, 8),
                     ", this worker is generation ", identity.generation, " (KEEL_RESTART_COUNT)");
        } else {
          last_error = "refused (not a keel store of this version?)";
        }
      } else {
        last_error = "connection dropped before the handshake completed (server busy?)";
        ::close(fd_);
        fd_ = -1;
      }
    } else {
      last_error = std::strerror(errno);
      ::close(fd_);
      fd_ = -1;
    }
    if (Clock::now() + backoff > deadline)
      KEEL_THROW("store ", endpoint_, ": could not connect within ", timeout.count() / 1000.0,
                 " s (", last_error, "); is rank 0 running and is the endpoint right?");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::Abort() {
  int fd = abort_fd_.load();
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

std::string StoreClient::Request(const std::string& frame, std::chrono::milliseconds wait,
                                 const std::string& what) {
  std::lock_guard<std::mutex> lk(mu_);
  KEEL_ENFORCE(fd_ >= 0, "store ", endpoint_, ": connection is closed");
  std::string reply;
  // The reply may take `wait` (a blocking GET) plus some slack for the network.
  std::string err;
  if (!WriteFrame(fd_, frame))
    err = std::strerror(errno);
  else
    err = ReadFrame(fd_, &reply, wait.count() + 10000);
  if (!err.empty() || reply.empty()) {
    abort_fd_ = -1;
    ::close(fd_);
    fd_ = -1;
    KEEL_THROW("store ", endpoint_, ": ", what, " failed: ", err.empty() ? "empty reply" : err,
               " (did the store's process exit: rank 0, or keel launch, which serves it there?)");
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
  KEEL_ENFORCE(
      r[0] == kOk, "store ", endpoint_, ": key '", key, "' did not appear within ",
      timeout.count() / 1000.0, " s",
      r.size() > 1 ? StrCat(" (", r.substr(1), ")") : std::string(" (a rank that never arrived?)"));
  return r.substr(1);
}

std::string StoreClient::GetUnlessPeerGone(const std::string& key,
                                           std::chrono::milliseconds timeout) {
  std::string f(1, static_cast<char>(kGetAlive));
  f += KeyField(key);
  PutU64(&f, static_cast<uint64_t>(timeout.count()));
  std::string r = Request(f, timeout, "get '" + key + "'");
  KEEL_ENFORCE(r[0] != kPeerGone, "store ", endpoint_, ": stopped waiting for key '", key,
               "': ", r.substr(1));
  KEEL_ENFORCE(
      r[0] == kOk, "store ", endpoint_, ": key '", key, "' did not appear within ",
      timeout.count() / 1000.0, " s",
      r.size() > 1 ? StrCat(" (", r.substr(1), ")") : std::string(" (a rank that never arrived?)"));
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
  auto deadline = Clock::now() + timeout;
  for (auto& k : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    Get(k, std::max(left, std::chrono::milliseconds(0)));
  }
}

void StoreClient::Barrier(const std::string& key, int nranks, std::chrono::milliseconds timeout) {
  std::string f(1, static_cast<char>(kBarrier));
  f += KeyField(key);
  PutU32(&f, static_cast<uint32_t>(nranks));
  PutU64(&f, static_cast<uint64_t>(timeout.count()));
  std::string r = Request(f, timeout, "barrier '" + key + "'");
  if (r[0] == kOk) return;
  KEEL_ENFORCE(r[0] != kBad, "store ", endpoint_, ": barrier '", key,
               "' was refused (this client has no rank)");
  KEEL_THROW(
      "store barrier '", key, "': ",
      r[0] == kPeerGone ? std::string() : StrCat("waited ", timeout.count() / 1000.0, " s; "),
      r.substr(1));
}

// ---------------------------------------------------------------- job identity

std::string JobTokenFromEnvironment(int world_size) {
  const char* token = std::getenv("KEEL_JOB_TOKEN");
  if (token != nullptr && *token != '\0') {
    KEEL_ENFORCE(std::strlen(token) < kMaxHelloBytes / 2 && !std::strchr(token, '\n'),
                 "KEEL_JOB_TOKEN must be one line of fewer than ", kMaxHelloBytes / 2,
                 " characters");
    return token;
  }
  if (world_size <= 1) return "";
  const char* ompi = std::getenv("OMPI_MCA_orte_precondition_transports");
  if (ompi != nullptr && std::strlen(ompi) >= 16) {
    const char* job = std::getenv("OMPI_MCA_ess_base_jobid");
    return StrCat("ompi:", ompi, ":", job ? job : "");
  }
  KEEL_THROW("a job of ", world_size,
             " ranks needs a job token that only its ranks know: set KEEL_JOB_TOKEN to the same "
             "secret on every rank, e.g. export KEEL_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom "
             "| tr -d ' \\n') (keel launch sets one itself; mpirun jobs derive one from OpenMPI's "
             "per-job key). Without it anyone who reaches the rendezvous port could read and "
             "write the job's keys.");
}

int64_t RestartGenerationFromEnvironment() {
  const char* v = std::getenv("KEEL_RESTART_COUNT");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  long long n = std::strtoll(v, &end, 10);
  KEEL_ENFORCE(end && *end == '\0' && n >= 0, "KEEL_RESTART_COUNT='", v,
               "' is not a non-negative integer");
  return n;
}

}  // namespace keel
