// Gloo backend: CPU tensors over TCP. Our store is adapted to gloo::rendezvous::Store so that
// connectFullMesh's waits honour our timeout (Debian's Gloo snapshot otherwise waits a fixed 30 s).
// Every collective is marked active for the collective watch while it runs; when the watch finds
// a mismatch it fails the ring's pending operations (AbortContext).
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

#include <cstring>

#include "framework/comm/communicator.h"
#include "framework/comm/store.h"
#include "framework/error.h"

namespace keel {

namespace {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(StoreClient& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.Set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = store_.Get(prefix_ + key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    std::vector<std::string> full;
    for (auto& k : keys) full.push_back(prefix_ + k);
    store_.Wait(full, t);
  }

 private:
  StoreClient& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

template <typename T>
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// The 16-bit floats: Gloo has no bfloat16, so both reduce through keel's ReduceElem (float32).
template <typename T, ReduceOp kOp>
void HalfReduce(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = ReduceElem(kOp, x[i], y[i]);
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
      watch_.SetInterrupt([this] { AbortContext(); });
    } catch (const Error& e) {
      KEEL_THROW("gloo ring ", ring_id, " (rank ", rank, " of ", nranks,
                 "): setup failed: ", e.what());
    } catch (const std::exception& e) {
      KEEL_THROW("gloo ring ", ring_id, " (rank ", rank, " of ", nranks, ") on ", o.my_host,
                 ": setup failed: ", e.what());
    }
  }
  const char* backend() const override { return "gloo"; }

  void AllReduce(Tensor* t, ReduceOp op) override {
    CountAllReduce(*t);
    Run(std::string("allreduce_") + ReduceOpName(op), [&] {
      VisitReduceDType(t->dtype(), [&](auto v) {
        using T = decltype(v);
        if constexpr (std::is_same_v<T, bool>) {
          KEEL_THROW("allreduce of bool tensors is not supported; cast to int32");
        } else {
          gloo::AllreduceOptions opts(context_);
          T* p = t->data<T>();
          opts.setOutput(p, static_cast<size_t>(t->numel()));
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
      opts.setOutput(static_cast<uint8_t*>(t->raw_data()), t->nbytes());
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
      opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in.raw_data())), in.nbytes());
      opts.setOutput(static_cast<uint8_t*>(out->raw_data()), out->nbytes());
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
    WaitScope watched(&watch_, seq_);
    try {
      f();
    } catch (const Error& e) {
      KEEL_THROW(Where(what), ": ", CollectiveWatch::Get().Explain(e.what()));
    } catch (const std::exception& e) {
      std::string msg = e.what();
      // Ended by the collective watch here, or by a peer that found the mismatch and left.
      const std::string explained = CollectiveWatch::Get().Explain(msg);
      if (explained != msg) {
        dead_ = explained;
        KEEL_THROW(Where(what), ": ", explained);
      }
      bool timeout =
          msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos;
      dead_ = msg;
      if (timeout)
        KEEL_THROW(Where(what), ": timed out after ", timeout_.count() / 1000.0,
                   " s (a peer crashed, stopped or runs another program?): ", msg);
      KEEL_THROW(Where(what), ": failed (a peer crashed or stopped?): ", msg);
    }
  }

  // Gloo has no call that wakes a thread blocked in a collective, but a receive that times out
  // fails every pending operation of its context and closes its connections (so the peers' waits
  // on this ring end too): post one that nobody answers and let it time out. Called by the
  // collective watch's thread while a collective of this ring runs; the ring is dead after it.
  void AbortContext() {
    constexpr uint64_t kAbortSlot = uint64_t{0xfe} << 56;  // no collective uses this prefix
    char byte = 0;
    try {
      auto buf = context_->createUnboundBuffer(&byte, 1);
      buf->recv(nranks_ > 1 ? (rank_ + 1) % nranks_ : 0, kAbortSlot);
      buf->waitRecv(std::chrono::milliseconds(1));
    } catch (const std::exception& e) {
      VLOG(1) << "gloo ring " << ring_id_ << " aborted: " << e.what();
    }
  }

  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::string dead_;
};

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
