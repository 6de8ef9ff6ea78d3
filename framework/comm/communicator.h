// Communicator: the collectives of one ring (a group of ranks), with a Gloo backend for CPU
// tensors and an NCCL backend for CUDA tensors. RingRegistry maps ring_id -> Communicator.
//
// Every collective carries a sequence number; a failure or timeout is a keel::Error naming the
// collective, ring, rank and sequence number. After a transport error the ring is dead: later
// calls fail at once instead of hanging. The CPU backends (shared memory, Gloo) tell the collective
// watch (collective_watch.h) what they wait in, so that ranks in collectives that cannot complete
// together fail within seconds naming each rank's call.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "framework/comm/collective_watch.h"
#include "framework/runtime/float16.h"
#include "framework/runtime/half_convert.h"
#include "framework/runtime/tensor.h"

namespace keel {

class StoreClient;

enum class ReduceOp { kSum, kMax, kMin, kProd, kAvg };
const char* ReduceOpName(ReduceOp op);

// The element types the CPU backends reduce: VisitDType's, and the 16-bit floats (float16,
// bfloat16: DistributedStrategy::fp16_allreduce), which reduce in float32 with one rounding per
// pair (for two ranks the exact sum, rounded once).
template <typename F>
decltype(auto) VisitReduceDType(DType t, F&& f) {
  if (t == DType::kFloat16) return f(float16{});
  if (t == DType::kBFloat16) return f(bfloat16{});
  return VisitDType(t, std::forward<F>(f));
}
// x op y for one element, in float32 for the 16-bit floats.
template <typename T>
T ReduceElem(ReduceOp op, T x, T y) {
  if constexpr (kIsHalf<T>) {
    return T(ReduceElem<float>(op, static_cast<float>(x), static_cast<float>(y)));
  } else {
    switch (op) {
      case ReduceOp::kProd:
        return static_cast<T>(x * y);
      case ReduceOp::kMax:
        return x < y ? y : x;
      case ReduceOp::kMin:
        return y < x ? y : x;
      default:
        return static_cast<T>(x + y);
    }
  }
}
// dst[i] = a[i] + b[i] for the 16-bit floats: each sum in float32 rounded once, as ReduceElem's,
// by the vectorized conversions (half_convert.h's AddN). dst may be a or b; a non-null dst2 gets
// a copy of dst.
template <typename T>
void SumHalfInto(T* dst, const T* a, const T* b, size_t n, T* dst2 = nullptr) {
  static_assert(kIsHalf<T>, "SumHalfInto adds float16 or bfloat16");
  constexpr size_t kChunk = 4096;  // the copy reads what was just written, from the cache
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t len = std::min(kChunk, n - i);
    AddN(a + i, b + i, dst + i, static_cast<int64_t>(len));
    if (dst2 != nullptr) std::memcpy(dst2 + i, dst + i, len * sizeof(T));
  }
}
// x / n (ReduceOp::kAvg's last step), in float32 for the 16-bit floats.
template <typename T>
T DivideElem(T x, int n) {
  if constexpr (kIsHalf<T>) {
    return T(static_cast<float>(x) / static_cast<float>(n));
  } else {
    return static_cast<T>(x / n);
  }
}

class Communicator {
 public:
  Communicator(int ring_id, int rank, int nranks)
      : ring_id_(ring_id),
        rank_(rank),
        nranks_(nranks),
        name_("ring " + std::to_string(ring_id)),
        watch_(name_, name_, /*exclusive=*/false) {}
  virtual ~Communicator() = default;

  int ring_id() const { return ring_id_; }
  // How errors and the collective watch name this ring ("ring 0", "fleet's eager ring"), and the
  // channel the watch numbers its collectives on (one per ring id and group). Set before use.
  void SetName(const std::string& name, const std::string& channel) {
    name_ = name;
    watch_.SetNames(channel, name);
  }
  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  uint64_t seq() const { return seq_; }
  virtual const char* backend() const = 0;
  // The CUDA stream (a cudaStream_t) this ring runs CUDA tensors' collectives on, for the
  // executor's events; nullptr for rings of CPU tensors.
  virtual void* device_stream() const { return nullptr; }
  // For waits on this ring's device work that do not go through a collective call (a CUDA graph
  // replay): throws, after aborting the ring, when its device side failed (a peer died) or when
  // `past_deadline` (the caller waited timeout_s()); otherwise returns. CPU rings: nothing.
  virtual void WatchDevice(const std::string& what, bool past_deadline) {}
  // How long this ring's collectives wait for peers (0: not bounded here).
  virtual double timeout_s() const { return 0; }
  // Nanoseconds this rank has spent inside this ring's collectives (moving data and waiting for
  // peers); read from any thread. The straggler monitor subtracts it from step time.
  int64_t comm_ns() const { return comm_ns_.total.load(std::memory_order_relaxed); }
  // How long the collective this ring runs now has been running (0: none): a rank whose step is
  // stuck here waits for a peer. Read from any thread (the straggler monitor's).
  int64_t in_flight_ns() const {
    const int64_t since = comm_ns_.since.load(std::memory_order_relaxed);
    return since == 0
               ? 0
               : std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                              .count() -
                                          since);
  }

  // A block of `bytes` of CPU memory that every rank of the ring maps (shm rings), for a buffer
  // this ring all-reduces again and again (the fused gradients): an all-reduce of a tensor that
  // lies in such a block on every rank reads and writes the ranks' buffers directly instead of
  // copying through the ring's slots. nullptr when the ring has none to give (other backends,
  // --shm_zero_copy_mb=0, that much already given).
  virtual std::shared_ptr<Allocation> AllocateShared(size_t bytes) { return nullptr; }
  // Whether [p, p + bytes) lies in the memory AllocateShared gives blocks from.
  virtual bool IsShared(const void* p, size_t bytes) const { return false; }
  // Bytes of the tensors this rank handed to AllReduce on this ring, summed over calls (what an
  // all-reduce in a 16-bit type halves); read from any thread.
  int64_t allreduce_bytes() const { return allreduce_bytes_.load(std::memory_order_relaxed); }
  // Collectives that ran that way, without copies.
  int64_t zero_copy_collectives() const {
    return zero_copy_collectives_.load(std::memory_order_relaxed);
  }

  // In place over `t`.
  virtual void AllReduce(Tensor* t, ReduceOp op) = 0;
  virtual void Broadcast(Tensor* t, int root) = 0;
  // out = concat over ranks of `in` along dim 0: [nranks * in.dims[0], ...].
  virtual void AllGather(const Tensor& in, Tensor* out) = 0;
  // out = this rank's 1/nranks slice (along dim 0) of the reduction of `in` over ranks.
  virtual void ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) = 0;
  virtual void Barrier() = 0;

  // Point-to-point, for pipeline parallelism (ops send_v2 / recv_v2). Send hands `t` to rank
  // `peer` of this ring under `tag` and returns without waiting for the receive (it is buffered,
  // so no schedule deadlocks on a send). Recv(t, peer, tag) waits for the n-th Send(., rank, tag)
  // of `peer` to this rank, n counting this rank's Recvs from `peer` under `tag`: transfers are
  // matched by (peer, tag, ordinal), never by arrival order, so concurrent transfers cannot swap.
  // A receive that waits past the ring's timeout, or whose peer's process is gone, is a
  // keel::Error naming the ring, both ranks, the tag and the ordinal. Gloo rings move the bytes
  // over their own connections (gloo_communicator.cc); shared-memory rings through memory each
  // sender shares with its peers (shm_communicator.cc), or through the job's store where that
  // memory could not be mapped (UseStoreMailbox, framework/comm/p2p_mailbox.cc); host-staged
  // rings of CUDA tensors through the host ring they wrap. Other backends (NCCL: its send and
  // receive meet inside the streams, where crossing sends deadlock): a keel::Error naming the
  // backend.
  virtual void Send(const Tensor& t, int peer, int tag);
  virtual void Recv(Tensor* t, int peer, int tag);
  // Point-to-point through `store` under keys starting with `prefix` (CommContext sets it on every
  // CPU ring it creates; the Gloo backend overrides Send / Recv and does not use it, the shm
  // backend only towards peers whose memory it could not map).
  void UseStoreMailbox(StoreClient* store, std::string prefix, std::chrono::milliseconds timeout);

 protected:
  // "send to rank 1 (tag 3, #7) on ring 5 (rank 0 of 2)"
  std::string P2PWhere(const char* what, int peer, int tag, uint64_t n) const;
  // Checks `peer` and returns the ordinal of the next transfer with `peer` under `tag` (sends
  // and receives counted apart).
  uint64_t NextP2P(bool send, int peer, int tag);
  // Transfer #n with `peer` under `tag` through the store mailbox (an error without one).
  void MailboxSend(const Tensor& t, int peer, int tag, uint64_t n);
  void MailboxRecv(Tensor* t, int peer, int tag, uint64_t n);
  // "allreduce_sum on ring 0 (rank 1 of 2, collective #17)"
  std::string Where(const std::string& what) const;
  // Sizes `out` for AllGather of `in`: [nranks * in.dims[0], ...] (a scalar counts as [1]), in's
  // dtype and place.
  void AllocateGathered(const Tensor& in, Tensor* out) const;
  int ring_id_, rank_, nranks_;
  std::string name_;
  // This ring's collectives as the collective watch sees them: the backends mark them active while
  // they run (Gloo) or once they wait (shared memory).
  WatchedWait watch_;
  uint64_t seq_ = 0;
  // Time inside collectives: the total of those that ended, and when the one running now began
  // (steady-clock nanoseconds; 0: none).
  struct CommClock {
    std::atomic<int64_t> total{0};
    std::atomic<int64_t> since{0};
  };
  CommClock comm_ns_;
  std::atomic<int64_t> zero_copy_collectives_{0};
  std::atomic<int64_t> allreduce_bytes_{0};
  // Each backend's AllReduce calls it once per call.
  void CountAllReduce(const Tensor& t) {
    allreduce_bytes_.fetch_add(static_cast<int64_t>(t.nbytes()), std::memory_order_relaxed);
  }
  // The store mailbox of Send / Recv (nullptr: none) and the ordinals per (send?, peer, tag).
  StoreClient* mailbox_ = nullptr;
  std::string mailbox_prefix_;
  std::chrono::milliseconds mailbox_timeout_{0};
  std::mutex p2p_mu_;
  std::map<std::tuple<bool, int, int>, uint64_t> p2p_count_;
  // Adds the time from construction to destruction to comm_ns_, and marks the collective as
  // running meanwhile.
  struct CommTimer {
    explicit CommTimer(CommClock* clock) : clock_(clock), start_(std::chrono::steady_clock::now()) {
      clock_->since.store(
          std::chrono::duration_cast<std::chrono::nanoseconds>(start_.time_since_epoch()).count(),
          std::memory_order_relaxed);
    }
    ~CommTimer() {
      clock_->since.store(0, std::memory_order_relaxed);
      clock_->total.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - start_)
                                  .count(),
                              std::memory_order_relaxed);
    }
    CommClock* clock_;
    std::chrono::steady_clock::time_point start_;
  };
};

struct CommOptions {
  std::string my_host = "127.0.0.1";  // the address peers reach this rank at (never gethostname)
  std::chrono::milliseconds timeout{300000};
  std::string prefix;  // store key prefix, unique per job and ring
  // shm rings: the bytes of each rank's memory that its peers map for zero-copy all-reduces
  // (--shm_zero_copy_mb; 0: none).
  size_t shm_shared_bytes = 0;
};

// A Gloo ring over the store; connects its full mesh now. Throws keel::Error on failure/timeout.
std::unique_ptr<Communicator> CreateGlooCommunicator(int ring_id, int rank, int nranks,
                                                     StoreClient& store, const CommOptions& opts);
// A ring over POSIX shared memory, for CPU tensors when every rank runs on this host (same
// boot, pid and mount namespace). Returns nullptr, with the reason in *why_not, when it cannot be
// used; every rank of the ring then gets nullptr, so they fall back together. Throws keel::Error
// on a store timeout.
std::unique_ptr<Communicator> CreateShmCommunicator(int ring_id, int rank, int nranks,
                                                    StoreClient& store, const CommOptions& opts,
                                                    std::string* why_not);
// Rings for CUDA tensors live in libkeel_cuda (framework/runtime/cuda_backend.h), which registers
// their factories as it opens:
// - nccl: an NCCL ring on `device` (the unique id goes through the store); registered when
//   libkeel_cuda was built with NCCL.
// - host_staged: collectives of CUDA tensors on `device` staged through pinned host memory over
//   `host_ring` (a shm or Gloo ring of the same ranks): device -> pinned host -> host_ring ->
//   device, on a CUDA stream of its own. Ranks may share a GPU, which NCCL refuses. CPU tensors
//   go to host_ring as they are.
using NcclRingFactory = std::unique_ptr<Communicator> (*)(int ring_id, int rank, int nranks,
                                                          int device, StoreClient& store,
                                                          const CommOptions& opts);
using HostStagedRingFactory =
    std::unique_ptr<Communicator> (*)(std::unique_ptr<Communicator> host_ring, int device);
void RegisterNcclRingFactory(NcclRingFactory factory);
void RegisterHostStagedRingFactory(HostStagedRingFactory factory);

// Which backend serves a ring of CUDA tensors (--gpu_comm_backend): "nccl" or "host". `gpus`
// holds each rank's GPU identity (its UUID); auto picks nccl when NCCL is built in and no two
// ranks share a GPU. nccl with a shared GPU is a keel::Error naming both flags.
std::string ChooseGpuCommBackend(const std::string& flag, bool have_nccl,
                                 const std::vector<std::string>& gpus, int ring_id);

class RingRegistry {
 public:
  static RingRegistry& Get();
  void Put(int ring_id, std::shared_ptr<Communicator> comm);
  // The ring's communicator; a keel::Error when it was never initialized.
  Communicator& At(int ring_id, const std::string& user);
  bool Has(int ring_id);
  void Clear();
  // Sum of comm_ns() over every ring.
  int64_t TotalCommNs();
  // Sum of allreduce_bytes() over every ring.
  int64_t TotalAllReduceBytes();
  // The longest in_flight_ns() over every ring: how long this rank has been waiting inside a
  // collective (0: it is in none). Defined in comm_context.cc.
  int64_t InFlightNs();

 private:
  std::mutex mu_;
  std::map<int, std::shared_ptr<Communicator>> rings_;
};

}  // namespace keel
