// Gloo backend: CPU tensors over TCP. Our store is adapted to gloo::rendezvous::Store so that
// connectFullMesh's waits honour our timeout (Debian's Gloo snapshot otherwise waits a fixed 30 s).
// Every collective is marked active for the collective watch while it runs; when the watch finds
// a mismatch it fails the ring's pending operations (AbortContext) and wakes the waits on the
// collective's buffers (Interrupt). The watch also asks this ring, while a collective has waited
// past --collective_check_s, whether Gloo has failed one of its connections (BrokenConnection):
// Gloo fails what waits on a broken connection except a send it had begun writing (a peer killed
// mid-transfer), whose wait would otherwise last the whole comm timeout. Draining the queued
// point-to-point sends (at exit) asks it too. A barrier's buffers are Gloo's own: its one-byte
// transfers are never half-written, but one queued behind a half-written send is not woken.
//
// Point-to-point (Send / Recv) goes over the ring's own connections with Gloo's unbound buffers,
// not through the store: a transfer is a fixed-size header (dtype, dims) and the tensor's bytes,
// each under a slot built from (tag, ordinal), so a receive only ever pairs with the send of the
// same peer, tag and ordinal. Gloo's send of an unbound buffer returns at once, but moves the
// bytes only once the peer posts the matching receive, so the buffer must live until then: Send
// copies the tensor into an entry of a queue that this communicator owns, and a thread of its own
// (the reaper) waits for the queued sends in order and frees them. A send that nobody receives
// within the comm timeout fails the ring (Gloo closes its connections), naming the transfer; a
// receive that waits past the timeout does too. At exit and when the ring is destroyed, the queue
// is drained first (bounded by the timeout), so that the last transfers of a run are not lost.
#include <glog/logging.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <thread>

#include "framework/base/strings.h"
#include "framework/comm/communicator.h"
#include "framework/comm/gloo_store.h"
#include "framework/comm/store.h"
#include "framework/error.h"

namespace keel {

namespace {

template <typename T>
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// The 16-bit floats: Gloo has no bfloat16, so both reduce through keel's ReduceElem (float32).
template <typename T, ReduceOp kOp>
void HalfReduce(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if constexpr (kOp == ReduceOp::kSum) {
    SumHalfInto(out, x, y, n);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = ReduceElem(kOp, x[i], y[i]);
  }
}

template <typename T>
ReduceFn<T> PickReduce(ReduceOp op) {
  if constexpr (kIsHalf<T>) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return &HalfReduce<T, ReduceOp::kSum>;
      case ReduceOp::kProd:
        return &HalfReduce<T, ReduceOp::kProd>;
      case ReduceOp::kMax:
        return &HalfReduce<T, ReduceOp::kMax>;
      case ReduceOp::kMin:
        return &HalfReduce<T, ReduceOp::kMin>;
    }
    return &HalfReduce<T, ReduceOp::kSum>;
  } else {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return &gloo::sum<T>;
      case ReduceOp::kProd:
        return &gloo::product<T>;
      case ReduceOp::kMax:
        return &gloo::max<T>;
      case ReduceOp::kMin:
        return &gloo::min<T>;
    }
    return &gloo::sum<T>;
  }
}

class GlooCommunicator;
void AddLiveRing(GlooCommunicator* c);  // for DrainLiveRings, at exit

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(int ring_id, int rank, int nranks, StoreClient& store, const CommOptions& o)
      : Communicator(ring_id, rank, nranks), timeout_(o.timeout) {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.my_host;
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      context_ = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
      context_->setTimeout(o.timeout);
      GlooStoreAdapter adapter(store, o.prefix + "ring" + std::to_string(ring_id) + "/", o.timeout);
      context_->connectFullMesh(adapter, device_);
      PostProbes();
      AddLiveRing(this);
      watch_.SetInterrupt([this] { Interrupt(); });
      watch_.SetProbe([this] { return BrokenConnection(); });
    } catch (const Error& e) {
      KEEL_THROW("gloo ring ", ring_id, " (rank ", rank, " of ", nranks,
                 "): setup failed: ", e.what());
    } catch (const std::exception& e) {
      KEEL_THROW("gloo ring ", ring_id, " (rank ", rank, " of ", nranks, ") on ", o.my_host,
                 ": setup failed: ", e.what());
    }
  }
  ~GlooCommunicator() override;
  const char* backend() const override { return "gloo"; }

  void Send(const Tensor& t, int peer, int tag) override;
  void Recv(Tensor* t, int peer, int tag) override;
  // Waits (at most the comm timeout) until the peers received every queued send.
  void DrainSends();
  // Completes every peer's probe of this rank when this rank leaves the ring cleanly (at exit,
  // or when the ring goes): no collective or receive of the ring in progress, none failed, no
  // send left in the queue. Its connections then close without being taken for failed ones. A
  // peer whose connection failed already is skipped; the bytes get a second, all peers together,
  // to go. After it the ring takes no more transfers.
  void SayGoodbye() {
    uint32_t idle = 0;
    if (!use_.compare_exchange_strong(idle, kLeft, std::memory_order_acq_rel)) return;
    if (failed_.load(std::memory_order_acquire) || probes_.empty()) return;
    {
      std::lock_guard<std::mutex> lk(send_mu_);
      if (!pending_.empty() || !send_error_.empty()) return;
    }
    static char bye = 0;
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sent;
    for (int r = 0; r < nranks_; ++r) {
      if (r == rank_) continue;
      try {
        auto buf = context_->createUnboundBuffer(&bye, 1);
        buf->send(r, kProbeSlot);
        sent.push_back(std::move(buf));
      } catch (const std::exception& e) {
        VLOG(1) << name_ << ": no goodbye to rank " << r << ": " << e.what();
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (auto& buf : sent) {
      try {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        buf->waitSend(std::max(left, std::chrono::milliseconds(1)));
      } catch (const std::exception& e) {
        VLOG(1) << name_ << ": a goodbye was not sent: " << e.what();
      }
    }
  }

  void AllReduce(Tensor* t, ReduceOp op) override {
    CountAllReduce(*t);
    Run(std::string("allreduce_") + ReduceOpName(op), [&] {
      VisitReduceDType(t->dtype(), [&](auto v) {
        using T = decltype(v);
        if constexpr (std::is_same_v<T, bool>) {
          KEEL_THROW("allreduce of bool tensors is not supported; cast to int32");
        } else {
          gloo::AllreduceOptions opts(context_);
          LiveBuffers live(this);
          T* p = t->data<T>();
          opts.setOutput<T>(live.Add(p, t->nbytes()));
          opts.setReduceFunction(PickReduce<T>(op));
          opts.setTimeout(timeout_);
          opts.setTag(static_cast<uint32_t>(seq_));
          gloo::allreduce(opts);
          if (op == ReduceOp::kAvg) {
            for (int64_t i = 0; i < t->numel(); ++i) p[i] = DivideElem(p[i], nranks_);
          }
        }
      });
    });
  }

  void Broadcast(Tensor* t, int root) override {
    KEEL_ENFORCE(root >= 0 && root < nranks_, "broadcast root ", root, " outside [0, ", nranks_,
                 ")");
    Run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      LiveBuffers live(this);
      opts.setOutput<uint8_t>(live.Add(t->raw_data(), t->nbytes()));
      opts.setRoot(root);
      opts.setTimeout(timeout_);
      opts.setTag(static_cast<uint32_t>(seq_));
      gloo::broadcast(opts);
    });
  }

  void AllGather(const Tensor& in, Tensor* out) override {
    AllocateGathered(in, out);
    Run("allgather", [&] {
      gloo::AllgatherOptions opts(context_);
      LiveBuffers live(this);
      opts.setInput<uint8_t>(live.Add(const_cast<void*>(in.raw_data()), in.nbytes()));
      opts.setOutput<uint8_t>(live.Add(out->raw_data(), out->nbytes()));
      opts.setTimeout(timeout_);
      opts.setTag(static_cast<uint32_t>(seq_));
      gloo::allgather(opts);
    });
  }

  void ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) override {
    KEEL_ENFORCE(in.dims().size() >= 1 && in.dims()[0] % nranks_ == 0, "reduce_scatter: dim 0 of ",
                 in.dims().str(), " must divide by ", nranks_, " ranks");
    // Gloo's snapshot has no reduce-scatter collective: all-reduce a copy, keep our slice.
    Tensor full = in.Clone();
    AllReduce(&full, op);
    int64_t rows = in.dims()[0] / nranks_;
    Tensor mine = full.Slice(rank_ * rows, (rank_ + 1) * rows);
    out->Resize(mine.dims());
    out->mutable_data(in.dtype(), in.place());
    out->CopyFrom(mine);
  }

  void Barrier() override {
    Run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout_);
      opts.setTag(static_cast<uint32_t>(seq_));
      gloo::barrier(opts);
    });
  }

 private:
  template <typename F>
  void Run(const std::string& what, F&& f) {
    CommTimer timer(&comm_ns_);
    ++seq_;
    KEEL_ENFORCE(!dead_.size(), Where(what), ": the ring is dead after an earlier failure (", dead_,
                 ")");
    InUse busy(this, [&] { return Where(what); });
    WaitScope watched(&watch_, seq_);
    try {
      f();
    } catch (const Error& e) {
      KEEL_THROW(Where(what), ": ", CollectiveWatch::Get().Explain(e.what()));
    } catch (const std::exception& e) {
      std::string msg = e.what();
      // Ended by the collective watch here, or by a peer that found the mismatch and left (which
      // closes its connections: the report, not the probe, says why).
      const std::string explained = CollectiveWatch::Get().Explain(msg);
      if (explained != msg) {
        KEEL_THROW(Where(what), ": ", MarkDead(explained));
      }
      const std::string broken = watch_.broken();
      if (!broken.empty()) {
        KEEL_THROW(Where(what), ": ", MarkDead("failed: " + broken));
      }
      bool timeout =
          msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos;
      MarkDead(msg);
      if (timeout)
        KEEL_THROW(Where(what), ": timed out after ", timeout_.count() / 1000.0,
                   " s (a peer crashed, stopped or runs another program?): ", msg);
      KEEL_THROW(Where(what), ": failed (a peer crashed or stopped?): ", msg);
    }
    // Gloo's waits return, unfinished, when the watch interrupts them.
    if (interrupted_.load(std::memory_order_acquire)) {
      const std::string broken = watch_.broken();
      KEEL_THROW(
          Where(what), ": ",
          MarkDead(CollectiveWatch::Get().Explain(
              broken.empty() ? "interrupted by the collective watch" : "failed: " + broken)));
    }
  }

  // The ring is dead after a failed collective: later ones fail at once, and it says no goodbye.
  const std::string& MarkDead(std::string why) {
    dead_ = std::move(why);
    failed_.store(true, std::memory_order_release);
    return dead_;
  }

  // A collective (Run), a receive or a send of this ring in progress: SayGoodbye sends nothing
  // meanwhile, and none starts after it.
  class InUse {
   public:
    // what(): the transfer, as errors name it (made only when it fails).
    template <typename What>
    InUse(GlooCommunicator* c, What&& what) : c_(c) {
      if (c_->use_.fetch_add(1, std::memory_order_acq_rel) & kLeft) {
        c_->use_.fetch_sub(1, std::memory_order_acq_rel);
        KEEL_THROW(what(), ": this rank has left the ring (it is going, or the process exits)");
      }
    }
    ~InUse() { c_->use_.fetch_sub(1, std::memory_order_acq_rel); }
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;

   private:
    GlooCommunicator* c_;
  };

  // The unbound buffers of the collective in progress. Created here rather than by Gloo's
  // options so that an interrupt can wake the waits on them: when a connection fails, Gloo's tcp
  // transport fails the pending operations on it but not a send it had begun writing, whose wait
  // then lasts the whole comm timeout. Declared after the options, so that it forgets the buffers
  // before the options free them.
  class LiveBuffers {
   public:
    explicit LiveBuffers(GlooCommunicator* c) : c_(c) {}
    ~LiveBuffers() {
      std::lock_guard<std::mutex> lk(c_->live_mu_);
      c_->live_.clear();
    }
    LiveBuffers(const LiveBuffers&) = delete;
    LiveBuffers& operator=(const LiveBuffers&) = delete;
    std::unique_ptr<gloo::transport::UnboundBuffer> Add(void* ptr, size_t bytes) {
      auto buf = c_->context_->createUnboundBuffer(ptr, bytes);
      std::lock_guard<std::mutex> lk(c_->live_mu_);
      c_->live_.push_back(buf.get());
      return buf;
    }

   private:
    GlooCommunicator* c_;
  };

  // The collective watch's interrupt: fails the ring's connections (AbortContext) and wakes the
  // waits on the collective's buffers. Called again at each look while the collective runs (an
  // abort wakes one wait). Under the wait's lock, while the collective is in progress.
  void Interrupt() {
    interrupted_.store(true, std::memory_order_release);
    AbortContext();
    std::lock_guard<std::mutex> lk(live_mu_);
    for (gloo::transport::UnboundBuffer* buf : live_) {
      buf->abortWaitSend();
      buf->abortWaitRecv();
    }
  }

  // One receive per peer, posted when the ring connects, on a slot nobody sends to: when a
  // connection fails, Gloo fails the operations pending on it, this one too.
  void PostProbes() {
    probe_bytes_.resize(static_cast<size_t>(nranks_));
    probes_.resize(static_cast<size_t>(nranks_));
    for (int r = 0; r < nranks_; ++r) {
      if (r == rank_) continue;
      probes_[r] = context_->createUnboundBuffer(&probe_bytes_[r], 1);
      probes_[r]->recv(r, kProbeSlot);
    }
  }

  // The watch's probe: the ring's connections (to the peers in `only`, when given) that Gloo has
  // failed, or "". A wait on a probe that is aborted first returns at once, or throws the
  // connection's error; a probe whose peer said goodbye (SayGoodbye) has completed instead, so a
  // peer that left the ring cleanly is not taken for a failed one.
  std::string BrokenConnection(const std::vector<bool>* only = nullptr) {
    std::lock_guard<std::mutex> lk(probe_mu_);  // the watch's thread, and DrainSends
    std::vector<int> failed;
    std::string first;
    for (int r = 0; r < nranks_; ++r) {
      if (probes_[r] == nullptr || (only != nullptr && !(*only)[r])) continue;
      try {
        probes_[r]->abortWaitRecv();
        probes_[r]->waitRecv(nullptr, timeout_);
      } catch (const std::exception& e) {
        failed.push_back(r);
        if (first.empty()) first = e.what();
      }
    }
    if (failed.empty()) return "";
    // A wait of this process that timed out closes every connection of the ring.
    if (first.find("Application timeout") != std::string::npos)
      return "this rank closed the ring's connections when one of its waits ran out the comm "
             "timeout: " +
             first;
    return StrCat(failed.size() == 1 ? "the connection to rank " : "the connections to ranks ",
                  StrJoin(failed, ", "),
                  " failed (a process ended, or the network failed): ", first);
  }

  // Gloo has no call that wakes a thread blocked in a collective, but a receive that times out
  // fails every pending operation of its context and closes its connections (so the peers' waits
  // on this ring end too): post one that nobody answers and let it time out. Called by the
  // collective watch's thread while a collective of this ring runs; the ring is dead after it.
  void AbortContext() {
    constexpr uint64_t kAbortSlot = uint64_t{0xfe} << 56;  // no collective uses this prefix
    char byte = 0;
    // Posted to a peer whose connection already failed, the receive throws at once and closes
    // nothing: try the next peer (the rank before a dead one would otherwise keep its sound
    // connections, and a collective it was woken from could go on over them with stale data).
    for (int d = 1; d < nranks_; ++d) {
      try {
        auto buf = context_->createUnboundBuffer(&byte, 1);
        buf->recv((rank_ + d) % nranks_, kAbortSlot);
        buf->waitRecv(std::chrono::milliseconds(1));
      } catch (const std::exception& e) {
        VLOG(1) << "gloo ring " << ring_id_ << " aborted: " << e.what();
        if (std::string(e.what()).find("Timed out") != std::string::npos) return;
      }
    }
  }

  // Point-to-point: see the top of the file.
  struct P2PHeader {
    static constexpr int kMaxDims = 30;
    uint32_t magic = 0, dtype = 0, ndims = 0, pad = 0;
    int64_t dims[kMaxDims] = {};
  };
  struct PendingSend {
    P2PHeader header;
    Tensor data;
    std::unique_ptr<gloo::transport::UnboundBuffer> header_buf, data_buf;
    int peer = 0, tag = 0;
    uint64_t n = 0;
  };
  static uint64_t P2PSlot(bool data, int tag, uint64_t n) {
    // 0xfd: a prefix no collective (and not AbortContext) uses; the ordinal wraps at 2^24, but
    // Gloo also keeps the transfers of one slot and peer in order.
    return (uint64_t{0xfd} << 56) | (uint64_t{data} << 55) |
           ((static_cast<uint64_t>(tag) & 0x7fffffff) << 24) | (n & 0xffffff);
  }
  void AnnounceNativeP2P();
  void ReapSends();
  // Waits for one send of `buf` (the reaper's thread); false when aborted.
  bool WaitSent(gloo::transport::UnboundBuffer* buf);
  // Why the ring's connections closed under a receive from `peer`.
  std::string TimedOutTransfer(int peer);

  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::string dead_;
  std::atomic<bool> interrupted_{false};
  // InUse: the transfers in progress, and kLeft once SayGoodbye ran.
  static constexpr uint32_t kLeft = uint32_t{1} << 31;
  std::atomic<uint32_t> use_{0};
  std::atomic<bool> failed_{false};  // a collective failed (dead_, which only Run's thread reads)
  std::mutex live_mu_;
  std::vector<gloo::transport::UnboundBuffer*> live_;  // LiveBuffers
  // The probes' slot (PostProbes, SayGoodbye): no transfer uses this prefix.
  static constexpr uint64_t kProbeSlot = uint64_t{0xfc} << 56;
  std::mutex probe_mu_;
  std::vector<char> probe_bytes_;                                        // PostProbes
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> probes_;  // by peer
  std::once_flag announced_;
  std::mutex send_mu_;
  std::condition_variable send_cv_;
  std::deque<std::unique_ptr<PendingSend>> pending_;   // front: the one the reaper waits for
  gloo::transport::UnboundBuffer* reaping_ = nullptr;  // the buffer the reaper waits in
  bool stop_ = false;
  std::string send_error_;  // the first send that failed; the ring's transfers fail after it
  std::thread reaper_;
};

// The live Gloo rings, drained at exit: a process that returns right after its last send must not
// take the bytes its peer has yet to receive with it.
std::mutex g_live_mu;
std::set<GlooCommunicator*>* g_live = nullptr;

void DrainLiveRings() {
  std::lock_guard<std::mutex> lk(g_live_mu);
  if (g_live == nullptr) return;
  for (GlooCommunicator* c : *g_live) {
    c->DrainSends();
    c->SayGoodbye();
  }
}

void AddLiveRing(GlooCommunicator* c) {
  std::lock_guard<std::mutex> lk(g_live_mu);
  if (g_live == nullptr) {
    g_live = new std::set<GlooCommunicator*>;
    std::atexit(DrainLiveRings);
  }
  g_live->insert(c);
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard<std::mutex> lk(g_live_mu);
    if (g_live != nullptr) g_live->erase(this);
  }
  if (reaper_.joinable()) {
    DrainSends();
    {
      std::lock_guard<std::mutex> lk(send_mu_);
      stop_ = true;
      if (reaping_ != nullptr) reaping_->abortWaitSend();
    }
    send_cv_.notify_all();
    if (reaper_.joinable()) reaper_.join();  // DrainSends joins it when it gives the queue up
  }
  SayGoodbye();
}

void GlooCommunicator::AnnounceNativeP2P() {
  std::call_once(announced_, [this] {
    LOG(INFO) << name_ << ": point-to-point transfers over gloo (native, not through the store)";
    std::lock_guard<std::mutex> lk(g_live_mu);  // DrainLiveRings reads reaper_
    reaper_ = std::thread([this] { ReapSends(); });
  });
}

void GlooCommunicator::Send(const Tensor& t, int peer, int tag) {
  const uint64_t n = NextP2P(true, peer, tag);
  InUse busy(this, [&] { return P2PWhere("send to", peer, tag, n); });
  KEEL_ENFORCE(t.place().is_cpu(), P2PWhere("send to", peer, tag, n),
               ": a CPU ring cannot send a tensor on ", t.place().str());
  KEEL_ENFORCE(static_cast<int>(t.dims().size()) <= P2PHeader::kMaxDims,
               P2PWhere("send to", peer, tag, n), ": a tensor of ", t.dims().size(),
               " dims (at most ", P2PHeader::kMaxDims, ")");
  AnnounceNativeP2P();
  CommTimer timer(&comm_ns_);
  auto s = std::make_unique<PendingSend>();
  s->peer = peer;
  s->tag = tag;
  s->n = n;
  s->header.magic = 0x6b703270;  // "kp2p"
  s->header.dtype = static_cast<uint32_t>(t.dtype());
  s->header.ndims = static_cast<uint32_t>(t.dims().size());
  for (int i = 0; i < t.dims().size(); ++i) s->header.dims[i] = t.dims()[i];
  s->data = t.Clone();  // the caller may reuse t's memory before the peer takes the bytes
  std::lock_guard<std::mutex> lk(send_mu_);
  KEEL_ENFORCE(send_error_.empty(), P2PWhere("send to", peer, tag, n),
               ": the ring failed at an earlier send (", send_error_, ")");
  try {
    s->header_buf = context_->createUnboundBuffer(&s->header, sizeof(P2PHeader));
    s->header_buf->send(peer, P2PSlot(false, tag, n));
    if (s->data.nbytes() > 0) {
      s->data_buf = context_->createUnboundBuffer(s->data.raw_data(), s->data.nbytes());
      s->data_buf->send(peer, P2PSlot(true, tag, n));
    }
  } catch (const std::exception& e) {
    KEEL_THROW(P2PWhere("send to", peer, tag, n), ": failed (the ring is dead?): ", e.what());
  }
  pending_.push_back(std::move(s));
  send_cv_.notify_all();
}

bool GlooCommunicator::WaitSent(gloo::transport::UnboundBuffer* buf) {
  {
    std::lock_guard<std::mutex> lk(send_mu_);
    if (stop_) return false;
    reaping_ = buf;
  }
  bool done = false;
  try {
    done = buf->waitSend(timeout_);
  } catch (...) {
    std::lock_guard<std::mutex> lk(send_mu_);
    reaping_ = nullptr;  // the caller frees the buffer
    throw;
  }
  std::lock_guard<std::mutex> lk(send_mu_);
  reaping_ = nullptr;
  return done;
}

void GlooCommunicator::ReapSends() {
  for (;;) {
    PendingSend* s;
    {
      std::unique_lock<std::mutex> lk(send_mu_);
      send_cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      s = pending_.front().get();  // only this thread pops
    }
    std::string error;
    try {
      if (!WaitSent(s->header_buf.get()) ||
          (s->data_buf != nullptr && !WaitSent(s->data_buf.get())))
        return;  // stopping
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      error = StrCat(P2PWhere("send to", s->peer, s->tag, s->n), ": ",
                     msg.find("imed out") != std::string::npos
                         ? StrCat("not received in ", timeout_.count() / 1000.0,
                                  " s (--comm_timeout_s; did rank ", s->peer, " stop?): ")
                         : StrCat("failed (rank ", s->peer, " stopped?): "),
                     msg);
      LOG(ERROR) << error;
    }
    std::lock_guard<std::mutex> lk(send_mu_);
    if (!error.empty()) {
      send_error_ = error;
      pending_.clear();  // the context is dead: nothing queued will go out
    } else {
      pending_.pop_front();
    }
    send_cv_.notify_all();
  }
}

void GlooCommunicator::DrainSends() {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::unique_lock<std::mutex> lk(send_mu_);
  auto drained = [&] { return pending_.empty() || stop_; };
  while (!send_cv_.wait_for(lk, std::chrono::milliseconds(250), drained)) {
    // A send Gloo had begun writing when its peer's connection failed never ends (the top of the
    // file): give the queue up once the connection to a peer it sends to has failed.
    std::vector<bool> peers(static_cast<size_t>(nranks_), false);
    for (const auto& q : pending_) peers[q->peer] = true;
    lk.unlock();
    const std::string broken = BrokenConnection(&peers);
    lk.lock();
    if (drained()) return;
    if (!broken.empty()) {
      LOG(WARNING) << name_ << ": " << pending_.size()
                   << " point-to-point sends will not be received: " << broken;
      // The reaper ends (nothing queued will go out) and is joined: a thread left finished but
      // unjoined at exit is a leak.
      stop_ = true;
      if (reaping_ != nullptr) reaping_->abortWaitSend();
      send_cv_.notify_all();
      lk.unlock();
      if (reaper_.joinable()) reaper_.join();
      return;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      LOG(WARNING) << name_ << ": " << pending_.size()
                   << " point-to-point sends were not received within the comm timeout";
      return;
    }
  }
}

std::string GlooCommunicator::TimedOutTransfer(int peer) {
  // Gloo closes the ring's connections when any of its waits times out, ending the others with
  // "Application timeout caused pair closure"; when the reaper's send was the one, it records
  // which (give it a moment to).
  std::unique_lock<std::mutex> lk(send_mu_);
  send_cv_.wait_for(lk, std::chrono::milliseconds(200), [&] { return !send_error_.empty(); });
  if (!send_error_.empty()) return "the ring's connections closed when " + send_error_;
  return StrCat(
      "the ring's connections closed when another transfer waited past the comm timeout "
      "of ",
      timeout_.count() / 1000.0, " s (--comm_timeout_s; did rank ", peer, " stop?)");
}

void GlooCommunicator::Recv(Tensor* t, int peer, int tag) {
  const uint64_t n = NextP2P(false, peer, tag);
  InUse busy(this, [&] { return P2PWhere("receive from", peer, tag, n); });
  AnnounceNativeP2P();
  CommTimer timer(&comm_ns_);
  {
    std::lock_guard<std::mutex> lk(send_mu_);
    KEEL_ENFORCE(send_error_.empty(), P2PWhere("receive from", peer, tag, n),
                 ": the ring failed at an earlier send (", send_error_, ")");
  }
  auto wait = [&](gloo::transport::UnboundBuffer* buf, uint64_t slot) {
    try {
      buf->recv(peer, slot);
      buf->waitRecv(timeout_);
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      KEEL_ENFORCE(msg.find("imed out") == std::string::npos,
                   P2PWhere("receive from", peer, tag, n), ": no send arrived in ",
                   timeout_.count() / 1000.0, " s (--comm_timeout_s; did rank ", peer,
                   " stop, or send under another tag or in another order?)");
      KEEL_ENFORCE(msg.find("Application timeout") == std::string::npos,
                   P2PWhere("receive from", peer, tag, n), ": no send arrived; ",
                   TimedOutTransfer(peer));
      KEEL_THROW(P2PWhere("receive from", peer, tag, n), ": the connection to rank ", peer,
                 " failed (its process stopped?): ", msg);
    }
  };
  P2PHeader h;
  auto header_buf = context_->createUnboundBuffer(&h, sizeof h);
  wait(header_buf.get(), P2PSlot(false, tag, n));
  KEEL_ENFORCE(h.magic == 0x6b703270 && h.ndims <= P2PHeader::kMaxDims,
               P2PWhere("receive from", peer, tag, n), ": malformed message");
  t->Resize(DDim(std::vector<int64_t>(h.dims, h.dims + h.ndims)));
  t->mutable_data(static_cast<DType>(h.dtype), CPUPlace());
  if (t->nbytes() == 0) return;
  auto data_buf = context_->createUnboundBuffer(t->raw_data(), t->nbytes());
  wait(data_buf.get(), P2PSlot(true, tag, n));
}

}  // namespace

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "?";
}

std::string Communicator::Where(const std::string& what) const {
  return StrCat(what, " on ", name_, " (rank ", rank_, " of ", nranks_, ", collective #", seq_,
                ")");
}

void Communicator::AllocateGathered(const Tensor& in, Tensor* out) const {
  DDim d = in.dims();
  if (d.empty()) d = DDim{1};
  d[0] *= nranks_;
  out->Resize(d);
  out->mutable_data(in.dtype(), in.place());
}

std::unique_ptr<Communicator> CreateGlooCommunicator(int ring_id, int rank, int nranks,
                                                     StoreClient& store, const CommOptions& opts) {
  return std::make_unique<GlooCommunicator>(ring_id, rank, nranks, store, opts);
}

RingRegistry& RingRegistry::Get() {
  static RingRegistry* r = new RingRegistry;
  return *r;
}

void RingRegistry::Put(int ring_id, std::shared_ptr<Communicator> comm) {
  std::lock_guard<std::mutex> lk(mu_);
  rings_[ring_id] = std::move(comm);
}

Communicator& RingRegistry::At(int ring_id, const std::string& user) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = rings_.find(ring_id);
  KEEL_ENFORCE(it != rings_.end(), user, ": ring ", ring_id,
               " is not initialized; run the startup program (its c_comm_init) first");
  return *it->second;
}

bool RingRegistry::Has(int ring_id) {
  std::lock_guard<std::mutex> lk(mu_);
  return rings_.count(ring_id) > 0;
}

int64_t RingRegistry::TotalCommNs() {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t total = 0;
  for (auto& kv : rings_) total += kv.second->comm_ns();
  return total;
}

int64_t RingRegistry::TotalAllReduceBytes() {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t total = 0;
  for (auto& kv : rings_) total += kv.second->allreduce_bytes();
  return total;
}

void RingRegistry::Clear() {
  std::lock_guard<std::mutex> lk(mu_);
  rings_.clear();
}

}  // namespace keel
