#include "framework/ps/ps_transport.h"

#include "framework/ps/async_communicator.h"

#include <glog/logging.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "framework/comm/comm_context.h"
#include "framework/comm/gloo_store.h"
#include "framework/comm/store.h"
#include "framework/error.h"

namespace keel {
namespace ps {

namespace {

const char kAbortKey[] = "keel/ps/abort";
// How long the peer watcher's store connection may take to open.
constexpr std::chrono::milliseconds kWatchConnect{10000};

}  // namespace

uint64_t Slot(Kind kind, int block, int64_t step) {
  KEEL_ENFORCE(block >= 0 && block < (1 << 24), "parameter-server block index ", block,
               " outside [0, 2^24)");
  return static_cast<uint64_t>(kind) << 56 | static_cast<uint64_t>(block) << 32 |
         (static_cast<uint64_t>(step) & 0xffffffffu);
}

namespace {

struct BundleHeader {
  int64_t blocks = 0;
  int64_t slots = 0;  // a checksum of the blocks' slots, in order
};

// `blocks` (BundleBlock's or BundleSource's) in slot order, and their header.
template <typename Block>
BundleHeader SortBundle(std::vector<Block>* blocks) {
  std::sort(blocks->begin(), blocks->end(),
            [](const Block& a, const Block& b) { return a.slot < b.slot; });
  uint64_t sum = 1469598103934665603ull;
  for (const Block& b : *blocks) sum = (sum ^ static_cast<uint64_t>(b.slot)) * 1099511628211ull;
  return {static_cast<int64_t>(blocks->size()), static_cast<int64_t>(sum >> 1)};
}

}  // namespace

size_t BundleBytes(const std::vector<BundleBlock>& blocks) {
  size_t total = sizeof(BundleHeader);
  for (const BundleBlock& b : blocks) total += b.bytes;
  return total;
}

std::vector<char> PackBundle(std::vector<BundleSource> blocks) {
  const BundleHeader h = SortBundle(&blocks);
  size_t total = sizeof(h);
  for (const BundleSource& b : blocks) total += b.bytes;
  std::vector<char> message(total);
  char* p = message.data();
  std::memcpy(p, &h, sizeof(h));
  p += sizeof(h);
  for (const BundleSource& b : blocks) {
    if (b.bytes > 0) std::memcpy(p, b.data, b.bytes);
    p += b.bytes;
  }
  return message;
}

void UnpackBundle(const std::vector<char>& message, std::vector<BundleBlock> blocks,
                  const std::string& what) {
  const BundleHeader want = SortBundle(&blocks);
  BundleHeader got;
  KEEL_ENFORCE(message.size() == BundleBytes(blocks), what, ": a message of ", message.size(),
               " bytes for blocks of ", BundleBytes(blocks));
  std::memcpy(&got, message.data(), sizeof(got));
  KEEL_ENFORCE(
      got.blocks == want.blocks && got.slots == want.slots, what, ": the server sent ", got.blocks,
      " blocks, not the ", want.blocks,
      " this trainer asks for (or other ones): do the trainer and the servers run programs "
      "of one transpile?");
  const char* p = message.data() + sizeof(got);
  for (const BundleBlock& b : blocks) {
    if (b.bytes > 0) std::memcpy(b.data, p, b.bytes);
    p += b.bytes;
  }
}

Transport::Transfer::Transfer() = default;
// The buffer before the bytes: Gloo's thread may still be sending a copy a peer asked for after
// the server that posted it gave up (it read freed memory: ASan, a trainer killed under async).
Transport::Transfer::~Transfer() { buf.reset(); }

Transport& Transport::Get() {
  static Transport* t = new Transport;
  return *t;
}

std::string Transport::PeerName(int rank) const {
  if (rank < nservers_) return StrCat("server ", rank, " (rank ", rank, ")");
  return StrCat("trainer ", rank - nservers_, " (rank ", rank, ")");
}

void Transport::Connect(int rank, int nranks, int nservers) {
  std::lock_guard<std::mutex> lk(mu_);
  if (context_) {
    KEEL_ENFORCE(rank == rank_ && nranks == nranks_ && nservers == nservers_,
                 "parameter-server transport: already connected as rank ", rank_, " of ", nranks_,
                 " with ", nservers_, " servers");
    return;
  }
  KEEL_ENFORCE(nservers >= 1 && nranks > nservers && rank >= 0 && rank < nranks,
               "parameter-server transport: rank ", rank, " of ", nranks, " with ", nservers,
               " servers needs at least one server and one trainer");
  CommContext& cc = CommContext::Get();
  StoreClient& store = cc.store("parameter-server transport");
  rank_ = rank;
  nranks_ = nranks;
  nservers_ = nservers;
  timeout_ = cc.config().timeout;
  gloo::transport::tcp::attr attr;
  attr.hostname = cc.config().my_host;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    context->setTimeout(timeout_);
    GlooStoreAdapter adapter(store, "keel/ps/mesh/", timeout_);
    context->connectFullMesh(adapter, device);
    device_ = device;
    context_ = context;
  } catch (const std::exception& e) {
    KEEL_THROW("parameter-server transport: ", PeerName(rank), " could not connect to the ", nranks,
               " processes of the job within ", timeout_.count() / 1000.0,
               " s (--comm_timeout_s): ", e.what());
  }
  // The store connection that tells which peers exited (GonePeers), opened while the store is
  // surely up.
  {
    std::lock_guard<std::mutex> lk(watch_mu_);
    const CommConfig& cfg = cc.config();
    watch_store_ = std::make_unique<StoreClient>(
        cfg.store_host, cfg.store_port, cfg.token, std::min(timeout_, kWatchConnect),
        StoreIdentity{cfg.rank, cfg.nranks, cfg.generation});
  }
  watcher_ = std::thread([this] { WatchLoop(); });
  LOG(INFO) << "parameter-server transport: " << PeerName(rank) << " connected to " << nranks - 1
            << " peers in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
}

std::unique_ptr<Transport::Transfer> Transport::PostSend(int peer, uint64_t slot, const void* data,
                                                         size_t bytes, const std::string& what) {
  std::vector<char> copy(bytes);
  if (bytes > 0) std::memcpy(copy.data(), data, bytes);
  return PostSend(peer, slot, std::move(copy), what);
}

std::unique_ptr<Transport::Transfer> Transport::PostSend(int peer, uint64_t slot,
                                                         std::vector<char>&& bytes,
                                                         const std::string& what) {
  KEEL_ENFORCE(context_ != nullptr, what, ": the parameter-server transport is not connected");
  auto t = std::make_unique<Transfer>();
  t->owned = std::move(bytes);
  if (t->owned.empty()) t->owned.resize(1);  // Gloo needs a non-empty buffer
  t->peers = {peer};
  t->what = what;
  t->is_send = true;
  try {
    std::lock_guard<std::mutex> lk(post_mu_);
    t->buf = context_->createUnboundBuffer(t->owned.data(), t->owned.size());
    t->buf->send(peer, slot, 0, t->owned.size());
  } catch (const std::exception& e) {
    KEEL_THROW(what, ": sending to ", PeerName(peer), " failed: ", e.what(), AbortNote());
  }
  return t;
}

std::unique_ptr<Transport::Transfer> Transport::PostRecv(const std::vector<int>& peers,
                                                         uint64_t slot, void* data, size_t bytes,
                                                         const std::string& what) {
  KEEL_ENFORCE(context_ != nullptr, what, ": the parameter-server transport is not connected");
  auto t = std::make_unique<Transfer>();
  t->peers = peers;
  t->what = what;
  // Gloo needs a non-empty buffer: an empty block receives one byte of padding.
  if (bytes == 0) {
    t->owned.resize(1);
    data = t->owned.data();
    bytes = 1;
  }
  try {
    std::lock_guard<std::mutex> lk(post_mu_);
    t->buf = context_->createUnboundBuffer(data, bytes);
    if (peers.size() == 1) {
      t->buf->recv(peers[0], slot, 0, bytes);
    } else {
      t->buf->recv(peers, slot, 0, bytes);
    }
  } catch (const std::exception& e) {
    KEEL_THROW(what, ": receiving failed: ", e.what(), WhoIsGone(peers), AbortNote());
  }
  return t;
}

std::string Transport::GonePeers(const std::vector<int>& peers) {
  std::lock_guard<std::mutex> lk(watch_mu_);
  if (!watch_store_) return "";
  try {
    // A key nobody sets: the store answers at once that ranks are gone, or after 1 ms that it is
    // not there ("rank 2, 3 closed its store connection (exited)").
    watch_store_->GetUnlessPeerGone("keel/ps/watch/never", std::chrono::milliseconds(1));
  } catch (const Error& e) {
    const std::string msg = e.what();
    const size_t at = msg.find(": rank "), end = msg.find(" closed its store connection");
    if (at == std::string::npos || end == std::string::npos || end < at) {
      if (msg.find("did not appear") != std::string::npos) return "";
      // The store went with server 0. A transfer with it fails now; another one after 2 s (a
      // server whose server 0 ended normally may still be taking the trainers' last headers,
      // which the trainers posted to every server at once).
      const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count();
      if (store_gone_since_ms_ < 0) store_gone_since_ms_ = now;
      if (std::find(peers.begin(), peers.end(), 0) == peers.end() &&
          now - store_gone_since_ms_ < 2000)
        return "";
      return PeerName(0) + " is gone (the job's store it served is): " + msg;
    }
    std::string list = msg.substr(at + 7, end - at - 7), gone;
    for (char& c : list)
      if (c == ',') c = ' ';
    std::istringstream ranks(list);
    for (int r; ranks >> r;)
      if (std::find(peers.begin(), peers.end(), r) != peers.end())
        gone += (gone.empty() ? "" : ", ") + PeerName(r);
    if (!gone.empty()) return gone + " exited (its store connections closed)";
  }
  return "";
}

void Transport::WatchLoop() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<int> peers;
    {
      std::lock_guard<std::mutex> lk(active_mu_);
      if (!watch_store_) return;  // Reset
      for (const Watched* w : active_)
        peers.insert(peers.end(), w->t->peers.begin(), w->t->peers.end());
    }
    if (peers.empty()) continue;
    std::lock_guard<std::mutex> lk(active_mu_);
    for (Watched* w : active_) {
      if (!w->why.empty()) continue;
      w->why = GonePeers(w->t->peers);
      if (w->why.empty()) continue;
      if (w->t->is_send)
        w->t->buf->abortWaitSend();
      else
        w->t->buf->abortWaitRecv();
    }
  }
}

std::string Transport::WhoIsGone(const std::vector<int>& peers) {
  if (peers.size() < 2 || !CommContext::Get().initialized()) return "";
  // The store learns of a closed connection a moment after the peers do.
  for (int i = 0; i < 10; ++i) {
    const std::string why = GonePeers(peers);
    if (!why.empty()) return "; " + why;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

int Transport::Wait(Transfer& t) {
  int peer = -1;
  std::string names;
  for (int p : t.peers) names += (names.empty() ? "" : " or ") + PeerName(p);
  try {
    bool ok = false;
    // The watcher (WatchLoop) aborts the wait when a peer of it exits.
    Watched w{&t, ""};
    {
      std::lock_guard<std::mutex> lk(active_mu_);
      active_.push_back(&w);
    }
    struct Unwatch {
      Transport* self;
      Watched* w;
      ~Unwatch() {
        std::lock_guard<std::mutex> lk(self->active_mu_);
        self->active_.erase(std::find(self->active_.begin(), self->active_.end(), w));
      }
    };
    {
      Unwatch unwatch{this, &w};
      ok = t.is_send ? t.buf->waitSend(&peer, timeout_) : t.buf->waitRecv(&peer, timeout_);
    }
    KEEL_ENFORCE(ok || w.why.empty(), t.what, ": stopped ",
                 t.is_send ? "sending to " : "receiving from ", names, ": ", w.why, AbortNote());
    KEEL_ENFORCE(ok, t.what, ": aborted while ", t.is_send ? "sending to " : "receiving from ",
                 names, AbortNote());
    if (t.peers.size() > 1 && CommContext::Get().initialized()) {
      // Gloo fails a receive bound to one connection when it closes, not one from any of several:
      // such a receive may keep completing from the live peers while a dead one goes unnoticed,
      // so every 200 ms one asks the store after a wait which of the others exited. (After, and
      // not counting the peer it came from: a peer that sent its last message, say that it is
      // done, and exited has delivered it; asked before the wait, it would fail the receive.)
      const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count();
      if (now - last_gone_check_ms_.load() >= 200) {
        last_gone_check_ms_ = now;
        std::vector<int> others;
        for (int p : t.peers)
          if (p != peer) others.push_back(p);
        const std::string gone = GonePeers(others);
        KEEL_ENFORCE(gone.empty(), t.what, ": ", gone, AbortNote());
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    const bool timed_out = msg.find("imed out") != std::string::npos;
    if (timed_out)
      KEEL_THROW(t.what, ": ", names, " did not ", t.is_send ? "take it" : "send it", " within ",
                 timeout_.count() / 1000.0,
                 " s (--comm_timeout_s): it stopped, hangs, or runs a different program",
                 AbortNote(), " [", msg, "]");
    KEEL_THROW(t.what, ": the connection with ", names, " broke (it exited or was killed?): ", msg,
               WhoIsGone(t.peers), AbortNote());
  }
  return peer;
}

void Transport::BeginStepOnce() {
  std::lock_guard<std::mutex> lk(mu_);
  if (in_step_) return;
  KEEL_ENFORCE(!finished_, "send: this trainer already stopped (fleet::stop_worker)");
  in_step_ = true;
  const int64_t step = ++step_;
  Header h{step, step - 1};
  for (int s = 0; s < nservers_; ++s)
    sends_.push_back(PostSend(
        s, HeaderSlot(step), &h, sizeof(h),
        StrCat("trainer ", rank_ - nservers_, ": step ", step, "'s header to server ", s)));
}

void Transport::SetAsync(bool async, const std::string& op) {
  std::lock_guard<std::mutex> lk(mu_);
  KEEL_ENFORCE(async_set_ < 0 || async_set_ == static_cast<int>(async), "op ", op,
               ": mode=", async ? "async" : "sync",
               " but an earlier parameter-server op of this process ran ",
               async_ ? "async" : "sync", " (programs from different strategies?)");
  async_set_ = static_cast<int>(async);
  async_ = async;
}

void Transport::KeepSend(std::unique_ptr<Transfer> t) {
  std::lock_guard<std::mutex> lk(mu_);
  sends_.push_back(std::move(t));
}

void Transport::KeepRecv(std::unique_ptr<Transfer> t) {
  std::lock_guard<std::mutex> lk(mu_);
  recvs_.push_back(std::move(t));
}

void Transport::WaitSends() {
  std::vector<std::unique_ptr<Transfer>> sends;
  {
    std::lock_guard<std::mutex> lk(mu_);
    sends.swap(sends_);
    in_step_ = false;
  }
  for (auto& t : sends) Wait(*t);
}

void Transport::AddBundleBlock(int server, int slot, void* data, size_t bytes, std::string what) {
  std::lock_guard<std::mutex> lk(mu_);
  bundle_[server].push_back({slot, static_cast<char*>(data), bytes});
  bundle_what_.emplace(server, std::move(what));  // the first block's
}

void Transport::WaitRecvs() {
  std::vector<std::unique_ptr<Transfer>> recvs;
  std::map<int, std::vector<BundleBlock>> bundle;
  std::map<int, std::string> what;
  {
    std::lock_guard<std::mutex> lk(mu_);
    recvs.swap(recvs_);
    bundle.swap(bundle_);
    what.swap(bundle_what_);
  }
  // Each server's bundle, received whole, then its blocks copied to where the recv ops said.
  std::vector<std::pair<int, std::unique_ptr<Transfer>>> bundles;
  for (const auto& [server, blocks] : bundle) {
    std::vector<char>& buf = bundle_bytes_[server];
    buf.resize(BundleBytes(blocks));
    bundles.emplace_back(
        server, PostRecv({server}, Slot(Kind::kBundle, 0, step_.load()), buf.data(), buf.size(),
                         StrCat("recv of ", blocks.size(), " parameter blocks (", what[server],
                                ", ...) after step ", step_.load(), " from ", PeerName(server))));
  }
  for (auto& t : recvs) Wait(*t);
  for (auto& [server, t] : bundles) {
    Wait(*t);
    UnpackBundle(bundle_bytes_[server], bundle[server], t->what);
  }
}

AsyncCommunicator& Transport::communicator() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!communicator_) communicator_ = std::make_unique<AsyncCommunicator>(this);
  return *communicator_;
}

void Transport::StartCommunicating(int queue_steps, int max_merge, int max_staleness) {
  communicator().Start(queue_steps, max_merge, max_staleness);
  communicating_ = true;
}

int64_t Transport::NextPushStep() {
  std::lock_guard<std::mutex> lk(mu_);
  KEEL_ENFORCE(!finished_, "send: this trainer already stopped (fleet::stop_worker)");
  return ++step_;
}

std::unique_ptr<Transport::Transfer> Transport::PostPushHeader(int server, int64_t step,
                                                               int64_t bytes) {
  Header h{step, step - 1};
  h.count = bytes;  // the push's message that follows (ps::PushSection's)
  return PostSend(
      server, HeaderSlot(step), &h, sizeof(h),
      StrCat("trainer ", rank_ - nservers_, ": push ", step, "'s header to server ", server));
}

void Transport::RequestState() {
  KEEL_ENFORCE(context_ && rank_ >= nservers_ && !finished_,
               "parameter-server checkpoint: only a running trainer can ask the servers");
  if (communicating_) communicator().Flush();
  WaitSends();
  WaitRecvs();
  Header h{kSave, step_.load()};
  std::vector<std::unique_ptr<Transfer>> asks;
  for (int s = 0; s < nservers_; ++s)
    asks.push_back(PostSend(s, HeaderSlot(step_ + 1), &h, sizeof(h),
                            StrCat("trainer ", rank_ - nservers_, ": asking server ", s,
                                   " for its state (checkpoint)")));
  for (auto& t : asks) Wait(*t);
}

void Transport::AbortRecv(Transfer& t) {
  if (t.buf) t.buf->abortWaitRecv();
}

void Transport::FinishTrainer() {
  if (!context_ || finished_ || rank_ < nservers_) return;
  if (communicating_) {
    AsyncCommunicator& c = communicator();
    c.Flush();
    LOG(INFO) << PeerName(rank_) << ": the communicator pushed " << c.submitted() << " step(s) in "
              << c.pushes() << " push(es)";
  }
  WaitSends();
  WaitRecvs();
  finished_ = true;
  Header h{kDone, step_.load()};
  std::vector<std::unique_ptr<Transfer>> done;
  for (int s = 0; s < nservers_; ++s) {
    const std::string what = StrCat("trainer ", rank_ - nservers_, ": telling server ", s,
                                    " that it stopped after ", step_.load(), " steps");
    done.push_back(PostSend(s, HeaderSlot(step_ + 1), &h, sizeof(h), what));
    if (async_) done.push_back(PostSend(s, PrefetchHeaderSlot(), &h, sizeof(h), what));
  }
  for (auto& t : done) Wait(*t);
}

void Transport::PostAbort(const std::string& why) {
  try {
    CommContext::Get().store("parameter-server transport").Set(kAbortKey, why);
  } catch (const std::exception& e) {
    LOG(WARNING) << "parameter-server transport: could not post the abort: " << e.what();
  }
}

std::string Transport::AbortNote() const {
  try {
    StoreClient& s = CommContext::Get().store("parameter-server transport");
    if (s.Check(kAbortKey)) return "; the job was stopped: " + s.Get(kAbortKey);
  } catch (const std::exception&) {
    // The store went with the process that served it: nothing to quote.
  }
  return "";
}

void Transport::Reset() {
  std::unique_ptr<AsyncCommunicator> communicator;
  {
    std::lock_guard<std::mutex> lk(mu_);
    communicator.swap(communicator_);
    communicating_ = false;
  }
  communicator.reset();  // its thread ends before the context goes
  std::lock_guard<std::mutex> lk(mu_);
  sends_.clear();
  recvs_.clear();
  bundle_.clear();
  bundle_what_.clear();
  bundle_bytes_.clear();
  context_.reset();
  device_.reset();
  rank_ = -1;
  nranks_ = nservers_ = 0;
  step_ = 0;
  in_step_ = finished_ = false;
  async_set_ = -1;
  async_ = false;
  geo_runs_ = 0;
  {
    std::lock_guard<std::mutex> al(active_mu_);
    std::lock_guard<std::mutex> wl(watch_mu_);
    watch_store_.reset();  // the watcher sees it and returns
  }
  if (watcher_.joinable()) watcher_.join();
}

}  // namespace ps
}  // namespace keel
