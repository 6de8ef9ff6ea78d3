// Shared-memory backend: the collectives of a CPU ring whose ranks all run on this host.
//
// Rank 0 creates one anonymous shared-memory file per ring (memfd_create: it has no name in
// /dev/shm, so nothing can be left there whoever dies when); the others open it through rank 0's
// /proc/PID/fd/N while rank 0 holds it open, map it and check a nonce that went through the store.
// The memory is freed by the kernel when the last rank unmaps it or exits. The segment holds a
// header line per rank and two sets of per-rank slots of kSlotBytes (double buffering). A
// collective moves its data through the slots in chunks; ranks meet at barriers built from per-rank
// arrival counters (a short spin, then a futex wait) and no lock.
//
// All-reduce of a chunk: every rank copies into its slot the slices the others reduce; barrier;
// rank r reduces the r-th 1/N slice over the ranks in rank order (its own part from its data, the
// others' from their slots) into its data and its slot; barrier; every rank copies slice j from
// rank j's slot. Each element is reduced once, by one rank, so every rank ends with the same
// bits. The next chunk uses the other buffer, so no third barrier is needed: a rank writes a
// buffer again only after a barrier that every rank reached after reading it.
//
// Zero-copy all-reduce (--shm_zero_copy_mb): every rank also creates a memfd of its own that all
// its peers map (sparse: a block's pages are reserved when AllocateShared gives it and punched out
// when it comes back). The executor places there what a ring all-reduces in place (fused gradient
// buffers, the 16-bit copies of fp16_allreduce), and keeps it from step to step. When every rank's
// tensor lies in its shared memory, each rank's intent says where, and the tensor is cut into
// pieces (64 KiB; larger beyond 4 GiB a rank), the r-th 1/N of them rank r's. Each rank takes its
// own pieces, then the others' that remain, reduces each straight from the ranks' buffers (in rank
// order, through a small block on the stack) and writes the result into all of them; it ends when
// the ranks' counts say every piece is reduced. That moves
// half the bytes of the slot path and needs one barrier instead of 2 per MiB, and a rank that
// arrives last does not wait for a peer asleep in that barrier to wake up and do a share: it takes
// the pieces itself. The bits are the slot path's: each element is reduced by one rank, in rank
// order.
//
// Point-to-point transfers (Send / Recv, the pipeline's send_v2 / recv_v2): every rank has one
// more memfd, for what it sends, which its peers map at setup: a channel per receiving peer (a
// futex word bumped at every send and a table of message slots), then a data area (sparse). A send
// reserves a block of the data area (first fit), copies the tensor into it, fills a free slot
// (tag, ordinal, dtype, dims, where the bytes lie), marks it posted and returns: sends are
// buffered, so a schedule in which both neighbours send before they receive cannot deadlock. A
// receive scans its channel in the sender's memory for the slot of exactly its (tag, ordinal),
// copies the bytes out and marks the slot taken; the sender frees taken slots and their blocks at
// its next send. Freed blocks keep their pages: a pipeline sends the same sizes every step, so its
// steady state neither faults nor allocates. The memory outlives a sender that exits (its peers'
// mappings hold it), so a last stage may return right after its last send. A waiting receive
// checks the sender's pid (a sender that exited without sending is named at once) and the ring's
// timeout. Towards a peer whose file could not be mapped the transfers go through the store
// (Communicator::MailboxSend), each side deciding the same way from the bits of the header.
//
// While waiting, a rank checks its peers' pids: a peer that exited (killed, crashed) is an error
// naming it within ~50 ms, and a peer that never arrives is a timeout naming the missing ranks
// (pieces of a zero-copy all-reduce that a peer took and never reduced: a timeout saying so).
// Before the first barrier of each collective the ranks compare what they run (collective, dtype,
// bytes): ranks running different programs fail naming both collectives instead of mixing data.
// A collective whose wait outlasts the spin tells the collective watch (collective_watch.h) what
// it waits in; the wait loop then also stops when the watch finds that the ranks are in
// collectives that cannot complete together.
#include <fcntl.h>
#include <glog/logging.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "framework/comm/communicator.h"
#include "framework/comm/store.h"
#include "framework/error.h"
#include "framework/fault_point.h"
#include "framework/runtime/cpu_threads.h"

namespace keel {

namespace {

constexpr uint64_t kMagic = 0x6b65656c73686d34ull;  // "keelshm4" (zero-copy pieces are claimed)
constexpr size_t kSlotBytes = size_t{1} << 20;      // per rank and buffer
constexpr int kMaxShmRanks = 64;
// A zero-copy all-reduce's unit of work (AllReduceShared): small enough that a rank that wakes
// late still finds pieces to take, large enough that taking one costs nothing beside reducing it.
// A rank's range holds at most kMaxRangePieces (they grow for tensors of more than 4 GiB a rank).
constexpr size_t kZeroCopyPieceBytes = size_t{64} << 10;
constexpr uint64_t kMaxRangePieces = 0xffff;

// What a rank runs, posted before a collective's first barrier and compared by its peers.
struct Intent {
  uint64_t seq;
  uint32_t kind;  // Kind below
  uint32_t dtype;
  uint64_t bytes;
  int32_t root;
  // An all-reduce's tensor: its offset in this rank's shared memory, or -1 when it lies elsewhere
  // (not compared between ranks).
  int64_t shared_off;
};

enum Kind : uint32_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kBarrier };

const char* KindName(uint32_t k) {
  switch (k) {
    case kAllReduce:
      return "allreduce";
    case kBroadcast:
      return "broadcast";
    case kAllGather:
      return "allgather";
    case kReduceScatter:
      return "reduce_scatter";
    case kBarrier:
      return "barrier";
  }
  return "?";
}

struct alignas(64) RankLine {
  std::atomic<uint64_t> arrived;  // barriers this rank has reached
  std::atomic<int32_t> pid;
  // Bit j: this rank mapped rank j's point-to-point file (so j sends to it through shared memory).
  std::atomic<uint64_t> p2p_maps;
  // By collective parity: a rank posts collective k+1's intent while slower peers may still be
  // reading collective k's.
  Intent intent[2];
  // Zero-copy all-reduce (AllReduceShared): this rank's range of pieces, as the collective's
  // number (32 bits) | pieces taken from the front, by this rank (16) | from the back, by the
  // others (16); and the pieces this rank has reduced over the ring's life.
  alignas(64) std::atomic<uint64_t> range;
  alignas(64) std::atomic<uint64_t> reduced;
};

struct Header {
  uint64_t magic;
  uint64_t nonce;
  int32_t nranks;
  // The futex word every wait sleeps on: bumped at every arrival at a barrier, and when a rank
  // has reduced its last piece of a zero-copy all-reduce. The ranks asleep on it, by what for:
  alignas(64) std::atomic<uint32_t> wake;
  std::atomic<uint32_t> sleepers;        // a barrier
  std::atomic<uint32_t> piece_sleepers;  // a zero-copy all-reduce's last pieces
  alignas(64) RankLine ranks[kMaxShmRanks];
};

// A rank's point-to-point file: a channel per receiving peer, then the data area.
constexpr int kP2PSlots = 1024;  // transfers to one peer that may wait unreceived
constexpr int kP2PMaxDims = 30;  // as Gloo rings' transfers
constexpr size_t kP2PDataBytes = size_t{16} << 30;  // address space; pages only as sends need them
constexpr uint64_t kP2PMagic = 0x6b65656c70327031ull;  // "keelp2p1"

// A slot's key: free, taken (received, not yet freed), or posted with its tag and ordinal in one
// word, so that a receive matches a transfer with one load and no other receive can: only the
// receive of that tag and ordinal ever sees it (ordinals are compared modulo 2^31; at most
// kP2PSlots transfers wait at once).
constexpr uint64_t kSlotFree = 0, kSlotTaken = 2;
uint64_t PostedKey(int tag, uint64_t n) {
  return (uint64_t{static_cast<uint32_t>(tag)} << 32) | ((n & 0x7fffffff) << 1) | 1;
}

// One transfer. The sender fills it while it is free and then posts it; the receiver only marks it
// taken; the sender frees it.
struct alignas(64) P2PSlot {
  std::atomic<uint64_t> key;
  uint32_t dtype, ndims;
  uint64_t offset, bytes;  // of the tensor's bytes in the sender's file
  int64_t dims[kP2PMaxDims];
};

struct P2PChannel {
  alignas(64) std::atomic<uint32_t> posted;  // futex word: bumped at every send
  std::atomic<uint32_t> sleepers;
  std::atomic<uint32_t> used;  // 1 + the highest slot ever posted: receives scan no further
  alignas(64) P2PSlot slots[kP2PSlots];
};

struct P2PFile {
  uint64_t magic;
  P2PChannel to[kMaxShmRanks];  // by receiving rank
};

constexpr size_t kP2PHeadBytes = (sizeof(P2PFile) + 4095) / 4096 * 4096;

size_t SegmentBytes(int nranks) {
  size_t head = (sizeof(Header) + 4095) / 4096 * 4096;
  return head + 2 * static_cast<size_t>(nranks) * kSlotBytes;
}

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

// What must match for two processes to share a segment and check each other's pids: the same
// kernel boot, pid namespace and mount namespace (/dev/shm).
std::string HostIdentity() {
  std::string id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, id);
  char buf[256];
  for (const char* ns : {"/proc/self/ns/pid", "/proc/self/ns/mnt", "/proc/self/ns/ipc"}) {
    ssize_t n = readlink(ns, buf, sizeof(buf) - 1);
    id += "|" + (n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?"));
  }
  return id;
}

// dst[i] = a[i] op b[i], also stored to dst2[i] when dst2 is set (one pass for both copies).
template <typename T, typename F>
void Combine(T* dst, T* dst2, const T* a, const T* b, size_t n, F f) {
  if (dst2 == nullptr) {
    for (size_t i = 0; i < n; ++i) dst[i] = f(a[i], b[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = dst2[i] = f(a[i], b[i]);
  }
}

template <typename T>
void ReduceInto(T* dst, const T* a, const T* b, size_t n, ReduceOp op, T* dst2 = nullptr) {
  if constexpr (kIsHalf<T>)
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) return SumHalfInto(dst, a, b, n, dst2);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      Combine(dst, dst2, a, b, n, [](T x, T y) { return ReduceElem(ReduceOp::kSum, x, y); });
      break;
    case ReduceOp::kProd:
      Combine(dst, dst2, a, b, n, [](T x, T y) { return ReduceElem(ReduceOp::kProd, x, y); });
      break;
    case ReduceOp::kMax:
      Combine(dst, dst2, a, b, n, [](T x, T y) { return ReduceElem(ReduceOp::kMax, x, y); });
      break;
    case ReduceOp::kMin:
      Combine(dst, dst2, a, b, n, [](T x, T y) { return ReduceElem(ReduceOp::kMin, x, y); });
      break;
  }
}

// "broadcast #3 (float32, 400 bytes, root 1)"
std::string Describe(const Intent& i) {
  if (i.kind == kBarrier) return StrCat("barrier #", i.seq);
  return StrCat(KindName(i.kind), " #", i.seq, " (", DTypeName(static_cast<DType>(i.dtype)), ", ",
                i.bytes, " bytes", i.root >= 0 ? StrCat(", root ", i.root) : std::string(), ")");
}

struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
};

// A rank's memory that its peers map: a sparse memfd, for zero-copy all-reduces and for the data
// of point-to-point sends. Blocks are 4 KiB multiples, first fit, from `first` on (offsets are the
// file's); Take reserves a block's pages (so a full machine fails here, not with SIGBUS later) and
// Give punches them out, unless `keep_pages` (the next blocks reuse them). Shared with the
// Allocations it gave, which may outlive the ring.
class SharedArena {
 public:
  SharedArena(int fd, char* base, size_t bytes, size_t first = 0, bool keep_pages = false)
      : fd_(fd), base_(base), bytes_(bytes), keep_pages_(keep_pages) {
    free_[first] = bytes - first;
  }
  ~SharedArena() {
    munmap(base_, bytes_);
    close(fd_);
  }
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }

  // The offset of a block of `bytes` with its pages reserved, or -1 (no room, or no memory).
  int64_t Take(size_t bytes) {
    const size_t need = Round(bytes);
    int64_t off = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second < need) continue;
        off = static_cast<int64_t>(it->first);
        const size_t left = it->second - need;
        free_.erase(it);
        if (left > 0) free_[static_cast<size_t>(off) + need] = left;
        break;
      }
    }
    if (off < 0) return -1;
    if (posix_fallocate(fd_, off, static_cast<off_t>(need)) != 0) {
      Put(static_cast<size_t>(off), need);
      return -1;
    }
    return off;
  }

  void Give(int64_t off, size_t bytes) {
    const size_t need = Round(bytes);
    if (!keep_pages_)
      fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, static_cast<off_t>(need));
    Put(static_cast<size_t>(off), need);
  }

 private:
  static size_t Round(size_t b) { return (std::max<size_t>(b, 1) + 4095) / 4096 * 4096; }
  // Back into the free list, merged with its neighbours.
  void Put(size_t off, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = free_.lower_bound(off);
    if (next != free_.end() && off + size == next->first) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        prev->second += size;
        return;
      }
    }
    free_[off] = size;
  }

  int fd_;
  char* base_;
  size_t bytes_;
  bool keep_pages_;
  std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> bytes
};

class ShmCommunicator : public Communicator {
 public:
  ShmCommunicator(int ring_id, int rank, int nranks, void* base, size_t bytes,
                  std::chrono::milliseconds timeout)
      : Communicator(ring_id, rank, nranks),
        base_(static_cast<char*>(base)),
        bytes_(bytes),
        timeout_(timeout) {
    header_ = reinterpret_cast<Header*>(base_);
    slots_ = base_ + (sizeof(Header) + 4095) / 4096 * 4096;
    // Long spins only pay when every rank's ring thread has a core of its own: collectives run on
    // a ring thread beside the rank's compute threads (its CPU budget), and a spinning waiter
    // would take the core that compute needs. Otherwise a short one (1000 pauses, 10-40 us by the
    // CPU): within a collective the peers are mostly a memcpy or a piece away, and a futex sleep
    // and wake-up costs more than that on a VM. Measured (with two barriers per zero-copy
    // all-reduce, before its pieces), 2 workers of the seed MLP on 2 cores, interleaved: 16.0-16.4
    // k samples/s with 1000 rounds, 15.0-15.6 k with none.
    cpu_set_t cpus;
    int ncpu = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    spin_ = nranks * (cpu_threads::Budget() + 1) <= ncpu ? 20000 : 1000;
    arrived_ = header_->ranks[rank].arrived.load();
  }
  ~ShmCommunicator() override {
    for (size_t j = 0; j < peer_shared_.size(); ++j)
      if (static_cast<int>(j) != rank_ && peer_shared_[j].base)
        munmap(peer_shared_[j].base, peer_shared_[j].bytes);
    for (size_t j = 0; j < peer_p2p_.size(); ++j)
      if (static_cast<int>(j) != rank_ && peer_p2p_[j].base)
        munmap(peer_p2p_[j].base, peer_p2p_[j].bytes);
    munmap(base_, bytes_);
  }

  const char* backend() const override { return "shm"; }

  std::shared_ptr<Allocation> AllocateShared(size_t bytes) override {
    if (!shared_ready_) return nullptr;
    const int64_t off = arena_->Take(bytes);
    if (off < 0) return nullptr;
    return Allocation::External(arena_->base() + off, bytes, CPUPlace(),
                                [arena = arena_, off, bytes] { arena->Give(off, bytes); });
  }

  bool IsShared(const void* p, size_t bytes) const override {
    if (!shared_ready_) return false;
    const char* c = static_cast<const char*>(p);
    return c >= arena_->base() && bytes <= arena_->bytes() &&
           static_cast<size_t>(c - arena_->base()) <= arena_->bytes() - bytes;
  }

  // Creates this rank's shared memory of `bytes` (none when 0) and its point-to-point file,
  // publishes where its peers open them, and maps theirs. When any rank has no shared memory or a
  // mapping fails, zero-copy stays off for this rank, and since its intents then say so, for the
  // ring's all-reduces. A point-to-point file that cannot be created or mapped sends the
  // transfers it would carry through the store.
  void SetUpSharedMemory(StoreClient& store, const std::string& key, size_t bytes,
                         std::chrono::milliseconds timeout) {
    std::string p2p_mine = "-";
    if (int pfd = memfd_create("keel-shm-p2p", MFD_CLOEXEC); pfd >= 0) {
      const size_t p2p_bytes = kP2PHeadBytes + kP2PDataBytes;
      void* base =
          ftruncate(pfd, static_cast<off_t>(p2p_bytes)) == 0
              ? mmap(nullptr, p2p_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, pfd, 0)
              : MAP_FAILED;
      if (base != MAP_FAILED) {
        reinterpret_cast<P2PFile*>(base)->magic = kP2PMagic;
        p2p_arena_ = std::make_shared<SharedArena>(pfd, static_cast<char*>(base), p2p_bytes,
                                                   kP2PHeadBytes, /*keep_pages=*/true);
        p2p_mine = StrCat("/proc/", getpid(), "/fd/", pfd, " ", p2p_bytes);
      } else {
        close(pfd);
      }
    }
    if (!p2p_arena_)
      LOG(WARNING) << "shm ring " << ring_id_ << ": no shared memory for point-to-point sends ("
                   << std::strerror(errno) << "); they go through the store";
    std::string mine = "-";
    int fd = bytes > 0 ? memfd_create("keel-shm-shared", MFD_CLOEXEC) : -1;
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
      if (base != MAP_FAILED) {
        arena_ = std::make_shared<SharedArena>(fd, static_cast<char*>(base), bytes);
        mine = StrCat("/proc/", getpid(), "/fd/", fd, " ", bytes);
      }
    }
    if (!arena_ && bytes > 0) {
      LOG(WARNING) << "shm ring " << ring_id_ << ": no shared memory for zero-copy all-reduces ("
                   << std::strerror(errno) << "); they copy through the ring";
      if (fd >= 0) close(fd);
    }
    store.Set(key + "shared" + std::to_string(rank_), mine + "|" + p2p_mine);
    peer_shared_.assign(static_cast<size_t>(nranks_), Mapping{});
    peer_p2p_.assign(static_cast<size_t>(nranks_), Mapping{});
    bool ok = arena_ != nullptr;
    uint64_t p2p_maps = 0;
    for (int j = 0; j < nranks_; ++j) {
      const std::string both = store.Get(key + "shared" + std::to_string(j), timeout);
      if (j == rank_) {
        if (arena_) peer_shared_[j] = {arena_->base(), arena_->bytes()};
        continue;
      }
      const size_t bar = both.find('|');
      KEEL_ENFORCE(bar != std::string::npos, "shm ring ", ring_id_, ": rank ", j,
                   " published no point-to-point file (another keel version?)");
      const std::string s = both.substr(0, bar), p2p = both.substr(bar + 1);
      if (p2p != "-") {
        const Mapping m = MapPeerFile(p2p);
        if (m.base != nullptr && reinterpret_cast<const P2PFile*>(m.base)->magic == kP2PMagic) {
          peer_p2p_[j] = m;
          p2p_maps |= uint64_t{1} << j;
        } else {
          if (m.base != nullptr) munmap(m.base, m.bytes);
          LOG(WARNING) << "shm ring " << ring_id_ << ": cannot map rank " << j
                       << "'s point-to-point file (" << p2p << "); its sends go through the store";
        }
      }
      if (s == "-") {
        ok = false;
        continue;
      }
      const Mapping m = MapPeerFile(s);
      if (m.base == nullptr) {
        LOG(WARNING) << "shm ring " << ring_id_ << ": cannot map rank " << j << "'s shared memory ("
                     << s << "); all-reduces copy through the ring";
        ok = false;
        continue;
      }
      peer_shared_[j] = m;
    }
    header_->ranks[rank_].p2p_maps.store(p2p_maps, std::memory_order_release);
    // Every rank has opened every file before any owner could exit and take its fd with it.
    try {
      Arrive("every rank to map the others' shared memory");
    } catch (const Error& e) {
      KEEL_THROW("shm ring ", ring_id_, " (rank ", rank_, " of ", nranks_,
                 "): setup failed: ", e.what());
    }
    shared_ready_ = ok;
    p2p_to_.assign(static_cast<size_t>(nranks_), false);
    for (int j = 0; j < nranks_; ++j)
      p2p_to_[j] = p2p_arena_ != nullptr && j != rank_ &&
                   (header_->ranks[j].p2p_maps.load(std::memory_order_acquire) >> rank_ & 1);
  }

  void Send(const Tensor& t, int peer, int tag) override {
    const uint64_t n = NextP2P(true, peer, tag);
    if (p2p_to_.empty() || !p2p_to_[peer]) return MailboxSend(t, peer, tag, n);
    KEEL_ENFORCE(t.place().is_cpu(), P2PWhere("send to", peer, tag, n),
                 ": a CPU ring cannot send a tensor on ", t.place().str());
    KEEL_ENFORCE(static_cast<int>(t.dims().size()) <= kP2PMaxDims,
                 P2PWhere("send to", peer, tag, n), ": a tensor of ", t.dims().size(),
                 " dims (at most ", kP2PMaxDims, ")");
    KEEL_ENFORCE(t.nbytes() <= kP2PDataBytes / 2, P2PWhere("send to", peer, tag, n), ": ",
                 t.nbytes(), " bytes is more than a shared-memory ring moves at once (",
                 kP2PDataBytes / 2, "; use smaller micro-batches)");
    AnnounceP2P();
    CommTimer timer(&comm_ns_);
    P2PChannel& ch = reinterpret_cast<P2PFile*>(p2p_arena_->base())->to[peer];
    std::lock_guard<std::mutex> lock(p2p_send_mu_);
    // A free slot and a block for the bytes; when the peer has not received enough of the
    // earlier transfers for either, wait for it to (bounded by the ring's timeout).
    int slot = -1;
    int64_t off = 0;
    const size_t bytes = t.nbytes();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      ReclaimP2P(ch);
      if (slot < 0)
        for (int i = 0; i < kP2PSlots && slot < 0; ++i)
          if (ch.slots[i].key.load(std::memory_order_relaxed) == kSlotFree) slot = i;
      if (slot >= 0 && bytes > 0 && off <= 0) off = p2p_arena_->Take(bytes);
      if (slot >= 0 && (bytes == 0 || off > 0)) break;
      const int pid = header_->ranks[peer].pid.load();
      KEEL_ENFORCE(pid <= 0 || Alive(pid), P2PWhere("send to", peer, tag, n), ": rank ", peer,
                   " (pid ", pid, ") exited leaving ", Unfreed(ch), " transfers unreceived");
      KEEL_ENFORCE(std::chrono::steady_clock::now() < deadline, P2PWhere("send to", peer, tag, n),
                   ": ", Unfreed(ch), " earlier transfers to rank ", peer,
                   " stayed unreceived for ", timeout_.count() / 1000.0,
                   " s (--comm_timeout_s), and at most ", kP2PSlots, " transfers or ",
                   kP2PDataBytes >> 30, " GiB may wait (", slot < 0 ? "no free slot" : "no room",
                   " for ", bytes, " more bytes)");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    P2PSlot& m = ch.slots[slot];
    if (bytes > 0) std::memcpy(p2p_arena_->base() + off, t.raw_data(), bytes);
    m.dtype = static_cast<uint32_t>(t.dtype());
    m.ndims = static_cast<uint32_t>(t.dims().size());
    for (uint32_t d = 0; d < m.ndims; ++d) m.dims[d] = t.dims()[static_cast<int>(d)];
    m.offset = static_cast<uint64_t>(off);
    m.bytes = bytes;
    if (ch.used.load(std::memory_order_relaxed) < static_cast<uint32_t>(slot) + 1)
      ch.used.store(static_cast<uint32_t>(slot) + 1, std::memory_order_release);
    m.key.store(PostedKey(tag, n), std::memory_order_release);
    ch.posted.fetch_add(1);
    if (ch.sleepers.load() > 0) Futex(&ch.posted, FUTEX_WAKE, INT32_MAX, nullptr);
  }

  void Recv(Tensor* t, int peer, int tag) override {
    const uint64_t n = NextP2P(false, peer, tag);
    if (peer_p2p_.empty() || peer_p2p_[peer].base == nullptr) return MailboxRecv(t, peer, tag, n);
    AnnounceP2P();
    CommTimer timer(&comm_ns_);
    char* file = static_cast<char*>(peer_p2p_[peer].base);
    P2PChannel& ch = reinterpret_cast<P2PFile*>(file)->to[rank_];
    const uint64_t want = PostedKey(tag, n);
    auto find = [&]() -> P2PSlot* {
      const uint32_t used = std::min<uint32_t>(ch.used.load(std::memory_order_acquire), kP2PSlots);
      for (uint32_t i = 0; i < used; ++i)
        if (ch.slots[i].key.load(std::memory_order_acquire) == want) return &ch.slots[i];
      return nullptr;
    };
    P2PSlot* m = nullptr;
    for (int i = 0; i < spin_ && (m = find()) == nullptr; ++i) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (m == nullptr) {
      const uint32_t w = ch.posted.load();
      if ((m = find()) != nullptr) break;
      ch.sleepers.fetch_add(1);
      timespec ts{0, 50 * 1000 * 1000};
      if (ch.posted.load() == w) Futex(&ch.posted, FUTEX_WAIT, w, &ts);
      ch.sleepers.fetch_sub(1);
      if ((m = find()) != nullptr) break;
      const int pid = header_->ranks[peer].pid.load();
      if (pid > 0 && !Alive(pid)) {
        if ((m = find()) != nullptr) break;  // sent just before it exited
        KEEL_THROW(P2PWhere("receive from", peer, tag, n), ": rank ", peer, " (pid ", pid,
                   ") exited without sending it");
      }
      KEEL_ENFORCE(std::chrono::steady_clock::now() < deadline,
                   P2PWhere("receive from", peer, tag, n), ": no send arrived in ",
                   timeout_.count() / 1000.0, " s (--comm_timeout_s; did rank ", peer,
                   " stop, or send under another tag or in another order?)");
    }
    KEEL_ENFORCE(m->ndims <= static_cast<uint32_t>(kP2PMaxDims) &&
                     m->offset + m->bytes <= peer_p2p_[peer].bytes,
                 P2PWhere("receive from", peer, tag, n), ": malformed transfer");
    t->Resize(DDim(std::vector<int64_t>(m->dims, m->dims + m->ndims)));
    t->mutable_data(static_cast<DType>(m->dtype), CPUPlace());
    KEEL_ENFORCE(t->nbytes() == m->bytes, P2PWhere("receive from", peer, tag, n), ": ", m->bytes,
                 " bytes for a tensor of ", t->nbytes());
    if (m->bytes > 0) std::memcpy(t->raw_data(), file + m->offset, m->bytes);
    m->key.store(kSlotTaken, std::memory_order_release);
  }

  void AllReduce(Tensor* t, ReduceOp op) override {
    CountAllReduce(*t);
    Run("allreduce_" + std::string(ReduceOpName(op)), kAllReduce, *t, -1, [&] {
      VisitReduceDType(t->dtype(), [&](auto v) {
        using T = decltype(v);
        if constexpr (std::is_same_v<T, bool>) {
          KEEL_THROW("allreduce of bool tensors is not supported; cast to int32");
        } else {
          if (all_shared_)
            AllReduceShared<T>(static_cast<size_t>(t->numel()), op);
          else
            AllReduceT<T>(t->data<T>(), static_cast<size_t>(t->numel()), op);
        }
      });
    });
  }

  void Broadcast(Tensor* t, int root) override {
    KEEL_ENFORCE(root >= 0 && root < nranks_, "broadcast root ", root, " outside [0, ", nranks_,
                 ")");
    Run("broadcast", kBroadcast, *t, root, [&] {
      char* p = static_cast<char*>(t->raw_data());
      const size_t n = t->nbytes();
      for (size_t o = 0; o < n; o += kSlotBytes) {
        size_t c = std::min(kSlotBytes, n - o);
        char* slot = Slot(0);
        if (rank_ == root) std::memcpy(slot, p + o, c);
        Arrive("the root's data");
        if (rank_ != root) std::memcpy(p + o, slot, c);
        NextBuffer();
      }
    });
  }

  void AllGather(const Tensor& in, Tensor* out) override {
    AllocateGathered(in, out);
    Run("allgather", kAllGather, in, -1, [&] {
      const char* p = static_cast<const char*>(in.raw_data());
      char* q = static_cast<char*>(out->raw_data());
      const size_t n = in.nbytes();
      for (size_t o = 0; o < n; o += kSlotBytes) {
        size_t c = std::min(kSlotBytes, n - o);
        std::memcpy(Slot(rank_), p + o, c);
        Arrive("every rank's part");
        for (int j = 0; j < nranks_; ++j) std::memcpy(q + j * n + o, Slot(j), c);
        NextBuffer();
      }
    });
  }

  void ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) override {
    KEEL_ENFORCE(in.dims().size() >= 1 && in.dims()[0] % nranks_ == 0, "reduce_scatter: dim 0 of ",
                 in.dims().str(), " must divide by ", nranks_, " ranks");
    int64_t rows = in.dims()[0] / nranks_;
    DDim d = in.dims();
    d[0] = rows;
    out->Resize(d);
    out->mutable_data(in.dtype(), in.place());
    Run("reduce_scatter_" + std::string(ReduceOpName(op)), kReduceScatter, in, -1, [&] {
      VisitReduceDType(in.dtype(), [&](auto v) {
        using T = decltype(v);
        if constexpr (std::is_same_v<T, bool>) {
          KEEL_THROW("reduce_scatter of bool tensors is not supported; cast to int32");
        } else {
          ReduceScatterT<T>(in.data<T>(), out->data<T>(), static_cast<size_t>(out->numel()), op);
        }
      });
    });
  }

  void Barrier() override {
    Tensor none;
    Run("barrier", kBarrier, none, -1, [&] {});
  }

  // Waits for every rank to have mapped the segment and posted its pid.
  void Join() {
    try {
      Arrive("every rank to map the segment");
    } catch (const Error& e) {
      KEEL_THROW("shm ring ", ring_id_, " (rank ", rank_, " of ", nranks_,
                 "): setup failed: ", e.what());
    }
  }

 private:
  // Maps a peer's file given as "<path> <bytes>" (nullptr when that fails).
  static Mapping MapPeerFile(const std::string& spec) {
    const std::string path = spec.substr(0, spec.find(' '));
    const size_t size = std::stoull(spec.substr(spec.find(' ') + 1));
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    struct stat st;
    void* base = MAP_FAILED;
    if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == size)
      base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (fd >= 0) close(fd);
    if (base == MAP_FAILED) return {};
    return {base, size};
  }

  void AnnounceP2P() {
    std::call_once(p2p_announced_, [this] {
      LOG(INFO) << name_ << ": point-to-point transfers through shared memory (not the store)";
    });
  }

  // This rank's transfers in `ch` (to one peer) posted or received but not yet freed.
  static int Unfreed(const P2PChannel& ch) {
    int n = 0;
    const uint32_t used = ch.used.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < used; ++i)
      n += ch.slots[i].key.load(std::memory_order_relaxed) != kSlotFree;
    return n;
  }

  // Frees the slots (and their blocks) of this rank's transfers in `ch` that the peer has received.
  // Only the sender frees and posts, so a slot whose key reads free is this rank's to fill.
  void ReclaimP2P(P2PChannel& ch) {
    const uint32_t used = ch.used.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < used; ++i) {
      P2PSlot& m = ch.slots[i];
      if (m.key.load(std::memory_order_acquire) != kSlotTaken) continue;
      if (m.bytes > 0) p2p_arena_->Give(static_cast<int64_t>(m.offset), m.bytes);
      m.key.store(kSlotFree, std::memory_order_relaxed);
    }
  }

  // Every rank's tensor lies in its shared memory (the intents of this collective say where).
  // The tensor is cut into pieces of kZeroCopyPieceBytes (larger when a rank's 1/N would be more
  // than kMaxRangePieces of them; the last one shorter), and rank r owns the r-th 1/N of them
  // (none, when there are fewer pieces than ranks): it takes its pieces from the front of its
  // range, one at a time (a compare-and-swap on its header line), reduces each over every rank's
  // tensor in rank order and stores the result into each. A rank done with its own range takes
  // pieces from the back of the others'. The collective ends for each rank when every piece is
  // reduced: no second barrier, and no rank waits for a peer to wake up and do its share (the
  // last to arrive often does all of a small tensor before its peers are back on a CPU). The bits
  // do not depend on who reduces what: each element is reduced once, in rank order. (A rank that
  // fails after arriving has its pieces reduced by the others, which fail at the next collective.)
  template <typename T>
  void AllReduceShared(size_t n, ReduceOp op) {
    const int parity = static_cast<int>(seq_ & 1);
    std::vector<T*> p(static_cast<size_t>(nranks_));
    for (int j = 0; j < nranks_; ++j)
      p[j] = reinterpret_cast<T*>(static_cast<char*>(peer_shared_[j].base) +
                                  header_->ranks[j].intent[parity].shared_off);
    const uint64_t ranks = static_cast<uint64_t>(nranks_);
    const uint64_t piece =
        std::max<uint64_t>(kZeroCopyPieceBytes / sizeof(T),
                           (n + kMaxRangePieces * ranks - 1) / (kMaxRangePieces * ranks));
    const uint64_t pieces = (n + piece - 1) / piece;
    uint64_t mine = 0;
    auto reduce = [&](uint64_t k) {
      ReducePieceShared(p, k * piece, std::min<uint64_t>(n, (k + 1) * piece), op);
      header_->ranks[rank_].reduced.store(++reduced_, std::memory_order_release);
      ++mine;
    };
    FaultDelay("shm_pieces");  // a test holds a rank back here: the others take its pieces
    for (int64_t k; (k = TakePiece(rank_, pieces, /*front=*/true)) >= 0;) reduce(k);
    for (int d = 1; d < nranks_; ++d)
      for (int64_t k; (k = TakePiece((rank_ + d) % nranks_, pieces, false)) >= 0;) reduce(k);
    // Pieces are counted over the ring's life; every rank runs the same zero-copy all-reduces.
    pieces_ += pieces;
    auto all_reduced = [&] {
      uint64_t r = 0;
      for (int j = 0; j < nranks_; ++j)
        r += header_->ranks[j].reduced.load(std::memory_order_acquire);
      return r >= pieces_;
    };
    if (mine > 0) Wake(&header_->piece_sleepers);
    Await(&header_->piece_sleepers, "every rank's reduced pieces", all_reduced, [&] {
      return std::string("pieces taken but not reduced (a peer stopped in the middle of one?)");
    });
    zero_copy_collectives_.fetch_add(1, std::memory_order_relaxed);
  }

  // The number of the next piece of rank r's range in this collective (of `pieces`), taken from
  // its front (only rank r does) or its back; -1 when the range is used up. A line still marked
  // with another collective's number counts as used up: its owner has gone on to the next
  // collective, so every piece of this one is reduced.
  int64_t TakePiece(int r, uint64_t pieces, bool front) {
    const uint64_t lo = pieces * static_cast<uint64_t>(r) / static_cast<uint64_t>(nranks_);
    const uint64_t size =
        pieces * static_cast<uint64_t>(r + 1) / static_cast<uint64_t>(nranks_) - lo;
    std::atomic<uint64_t>& range = header_->ranks[r].range;
    uint64_t w = range.load(std::memory_order_acquire);
    while (true) {
      if (w >> 32 != static_cast<uint32_t>(seq_)) return -1;
      const uint64_t f = w >> 16 & 0xffff, b = w & 0xffff;
      if (f + b >= size) return -1;
      if (range.compare_exchange_weak(w, w + (front ? uint64_t{1} << 16 : 1),
                                      std::memory_order_acq_rel, std::memory_order_acquire))
        return static_cast<int64_t>(front ? lo + f : lo + size - 1 - b);
    }
  }

  // Elements [lo, hi) of every rank's tensor, reduced in rank order and stored into each, through
  // a small block on the stack: an element is fully reduced before any rank's copy of it is
  // overwritten.
  template <typename T>
  void ReducePieceShared(const std::vector<T*>& p, size_t lo, size_t hi, ReduceOp op) {
    constexpr size_t kBlock = 16384 / sizeof(T);
    alignas(64) T acc[kBlock];
    for (size_t s = lo; s < hi; s += kBlock) {
      const size_t m = std::min(kBlock, hi - s);
      ReduceInto(acc, p[0] + s, p[1] + s, m, op);
      for (int j = 2; j < nranks_; ++j) ReduceInto(acc, acc, p[j] + s, m, op);
      if (op == ReduceOp::kAvg)
        for (size_t i = 0; i < m; ++i) acc[i] = DivideElem(acc[i], nranks_);
      for (int j = 0; j < nranks_; ++j) std::memcpy(p[j] + s, acc, m * sizeof(T));
    }
  }

  template <typename T>
  void AllReduceT(T* data, size_t n, ReduceOp op) {
    const size_t per_chunk = kSlotBytes / sizeof(T);
    for (size_t o = 0; o < n; o += per_chunk) {
      const size_t m = std::min(per_chunk, n - o);
      T* chunk = data + o;
      auto lo_of = [&](int r) { return m * r / nranks_; };
      // Peers read from my slot only the slices they reduce: my own slice stays in `data`.
      T* mine = reinterpret_cast<T*>(Slot(rank_));
      const size_t lo = lo_of(rank_), hi = lo_of(rank_ + 1);
      if (lo > 0) std::memcpy(mine, chunk, lo * sizeof(T));
      if (m > hi) std::memcpy(mine + hi, chunk + hi, (m - hi) * sizeof(T));
      Arrive("every rank's chunk");
      // My slice, reduced over the ranks in rank order (rank j's part read from its slot, mine
      // from `data`) into my slot, for the peers, then copied into `data`. (Reducing into `data`
      // would overwrite my part before a rank after the first two reads it.)
      if (hi > lo) {
        auto part = [&](int j) -> const T* {
          return j == rank_ ? chunk + lo : reinterpret_cast<const T*>(Slot(j)) + lo;
        };
        T* acc = nranks_ > 1 ? mine + lo : chunk + lo;
        // The last step also stores into `data` (my part was read by then), unless an average
        // still divides.
        T* also = op == ReduceOp::kAvg ? nullptr : chunk + lo;
        if (nranks_ > 1) {
          ReduceInto(acc, part(0), part(1), hi - lo, op, nranks_ == 2 ? also : nullptr);
          for (int j = 2; j < nranks_; ++j)
            ReduceInto(acc, acc, part(j), hi - lo, op, j == nranks_ - 1 ? also : nullptr);
        }
        if (op == ReduceOp::kAvg) {
          for (size_t i = 0; i < hi - lo; ++i) acc[i] = DivideElem(acc[i], nranks_);
          if (nranks_ > 1) std::memcpy(chunk + lo, acc, (hi - lo) * sizeof(T));
        }
      }
      Arrive("every rank's reduced slice");
      for (int j = 0; j < nranks_; ++j) {
        if (j == rank_) continue;
        const size_t a = lo_of(j), b = lo_of(j + 1);
        if (b > a)
          std::memcpy(chunk + a, reinterpret_cast<const T*>(Slot(j)) + a, (b - a) * sizeof(T));
      }
      NextBuffer();
    }
  }

  // in: nranks pieces of n elements; out: this rank's piece, reduced.
  template <typename T>
  void ReduceScatterT(const T* in, T* out, size_t n, ReduceOp op) {
    const size_t per_chunk = std::max<size_t>(1, kSlotBytes / sizeof(T) / nranks_);
    for (size_t o = 0; o < n; o += per_chunk) {
      const size_t m = std::min(per_chunk, n - o);
      T* mine = reinterpret_cast<T*>(Slot(rank_));
      for (int j = 0; j < nranks_; ++j) std::memcpy(mine + j * m, in + j * n + o, m * sizeof(T));
      Arrive("every rank's chunk");
      const T* s0 = reinterpret_cast<const T*>(Slot(0)) + rank_ * m;
      if (nranks_ == 1) {
        std::memcpy(out + o, s0, m * sizeof(T));
      } else {
        ReduceInto(out + o, s0, reinterpret_cast<const T*>(Slot(1)) + rank_ * m, m, op);
        for (int j = 2; j < nranks_; ++j)
          ReduceInto(out + o, out + o, reinterpret_cast<const T*>(Slot(j)) + rank_ * m, m, op);
      }
      if (op == ReduceOp::kAvg)
        for (size_t i = 0; i < m; ++i) out[o + i] = DivideElem(out[o + i], nranks_);
      // The next chunk writes the other buffer. This one is written again only after the next
      // barrier (a chunk's or the next collective's first), which every rank reaches after
      // reading it here.
      NextBuffer();
    }
  }

  char* Slot(int j) { return slots_ + (static_cast<size_t>(buffer_) * nranks_ + j) * kSlotBytes; }
  void NextBuffer() { buffer_ ^= 1; }

  template <typename F>
  void Run(const std::string& what, uint32_t kind, const Tensor& t, int root, F&& f) {
    CommTimer timer(&comm_ns_);
    ++seq_;
    KEEL_ENFORCE(dead_.empty(), Where(what), ": the ring is dead after an earlier failure (", dead_,
                 ")");
    watch_.Note(seq_);
    // Await marks the collective active for the watch while a wait of it outlasts the spin; a
    // collective that fails ends it here.
    struct Watched {
      explicit Watched(ShmCommunicator* c) : c(c) { c->in_collective_ = true; }
      ~Watched() {
        c->in_collective_ = false;
        if (c->watched_) c->watch_.End();
        c->watched_ = false;
      }
      ShmCommunicator* c;
    } watched(this);
    try {
      const int parity = static_cast<int>(seq_ & 1);
      Intent& m = header_->ranks[rank_].intent[parity];
      int64_t shared_off = -1;
      if (kind == kAllReduce && nranks_ > 1 && t.initialized() && t.nbytes() > 0 &&
          IsShared(t.raw_data(), t.nbytes())) {
        shared_off = static_cast<const char*>(t.raw_data()) - arena_->base();
        // A fresh range of pieces for AllReduceShared, before any peer can take from it.
        header_->ranks[rank_].range.store(uint64_t{static_cast<uint32_t>(seq_)} << 32,
                                          std::memory_order_release);
      }
      m = Intent{seq_,
                 kind,
                 static_cast<uint32_t>(t.initialized() ? t.dtype() : DType{}),
                 t.initialized() ? t.nbytes() : 0,
                 root,
                 shared_off};
      Arrive("every rank to start it");
      all_shared_ = shared_off >= 0;
      for (int j = 0; j < nranks_; ++j) {
        const Intent& o = header_->ranks[j].intent[parity];
        if (o.seq != m.seq || o.kind != m.kind || o.dtype != m.dtype || o.bytes != m.bytes ||
            o.root != m.root)
          KEEL_THROW("rank ", j, " runs ", Describe(o), " while this rank runs ", Describe(m),
                     ": the ranks run different programs");
        if (o.shared_off < 0) all_shared_ = false;
      }
      f();
    } catch (const Error& e) {
      // Ended by the collective watch, or by a peer that found a mismatch and left.
      dead_ = watch_.interrupted() ? e.what() : CollectiveWatch::Get().Explain(e.what());
      KEEL_THROW(Where(what), ": ", dead_);
    }
  }

  // Marks this rank's arrival at the next barrier and waits for every rank to reach it.
  void Arrive(const char* waiting_for) {
    const uint64_t target = ++arrived_;
    header_->ranks[rank_].arrived.store(target, std::memory_order_release);
    Wake(&header_->sleepers);
    Await(
        &header_->sleepers, waiting_for,
        [&] {
          for (int j = 0; j < nranks_; ++j)
            if (header_->ranks[j].arrived.load(std::memory_order_acquire) < target) return false;
          return true;
        },
        [&] {
          std::string missing;
          for (int j = 0; j < nranks_; ++j)
            if (header_->ranks[j].arrived.load(std::memory_order_acquire) < target)
              missing += (missing.empty() ? "" : ", ") + std::to_string(j);
          return StrCat("rank(s) ", missing,
                        " did not arrive (a peer stopped or runs another program?)");
        });
  }

  // Tells the ranks asleep in Await that something they wait for may have happened; the
  // system call only when `sleepers` (the count of those that wait for it) says one sleeps. (Both
  // kinds of sleeper share the futex word, so the other kind wakes too, finds nothing and sleeps
  // again.)
  void Wake(const std::atomic<uint32_t>* sleepers) {
    header_->wake.fetch_add(1, std::memory_order_release);
    // Orders the bump before the read of `sleepers`, as Await orders its count before its check.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleepers->load(std::memory_order_acquire) > 0)
      Futex(&header_->wake, FUTEX_WAKE, INT32_MAX, nullptr);
  }

  // Waits until `done()`: a short spin, then sleeps on the header's futex word (woken by Wake),
  // counted in `sleepers`. A wait that outlasts the spin is posted to the collective watch until
  // it ends (not until the collective does: a zero-copy all-reduce's peers may go on to the next
  // collective while this rank still reduces pieces of this one). Every ~50 ms it checks the
  // peers: one that exited before `done()` is an error naming it; at the ring's timeout the error
  // says what `missing()` says is missing.
  template <typename Done, typename Missing>
  void Await(std::atomic<uint32_t>* sleepers, const char* waiting_for, Done done, Missing missing) {
    for (int i = 0; i < spin_; ++i) {
      if (done()) return;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout_;
    if (in_collective_ && !watched_) {
      watch_.Begin(seq_, start);
      watched_ = true;
    }
    auto checked = start;
    while (!done()) {
      const uint32_t w = header_->wake.load(std::memory_order_acquire);
      if (done()) break;
      if (watched_ && watch_.interrupted()) KEEL_THROW(CollectiveWatch::Get().Verdict());
      sleepers->fetch_add(1, std::memory_order_acq_rel);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      timespec ts{0, 50 * 1000 * 1000};
      if (!done()) Futex(&header_->wake, FUTEX_WAIT, w, &ts);
      sleepers->fetch_sub(1, std::memory_order_acq_rel);
      const auto now = std::chrono::steady_clock::now();
      if (done() || now - checked < std::chrono::milliseconds(50)) continue;
      checked = now;
      for (int j = 0; j < nranks_; ++j) {
        if (j == rank_) continue;
        const int pid = header_->ranks[j].pid.load();
        // A peer that saw `done()` may have finished and exited since this rank last looked.
        if (pid > 0 && !Alive(pid) && !done())
          KEEL_THROW("rank ", j, " (pid ", pid, ") exited while this rank waited for ",
                     waiting_for);
      }
      if (now >= deadline && !done())
        KEEL_THROW("timed out after ", timeout_.count() / 1000.0, " s waiting for ", waiting_for,
                   "; ", missing());
    }
    if (watched_) {
      watch_.End();
      watched_ = false;
    }
  }

  // Whether `pid` still runs: not gone, and not a zombie its parent has yet to reap.
  static bool Alive(int pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t paren = text.rfind(')');
    return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
  }

  char* base_;
  size_t bytes_;
  Header* header_;
  char* slots_;
  std::chrono::milliseconds timeout_;
  int spin_ = 0;
  int buffer_ = 0;
  uint64_t arrived_ = 0;
  std::string dead_;
  // A collective runs (Run), and a wait of it is posted to the collective watch (Await).
  bool in_collective_ = false, watched_ = false;
  // Zero-copy: this rank's shared memory, every rank's mapped here (index = rank), whether all
  // of them are, and whether the collective in flight uses them.
  std::shared_ptr<SharedArena> arena_;
  std::vector<Mapping> peer_shared_;
  bool shared_ready_ = false;
  bool all_shared_ = false;
  // Zero-copy pieces: of the ring's all-reduces so far, and reduced by this rank.
  uint64_t pieces_ = 0, reduced_ = 0;
  // Point-to-point: this rank's file (nullptr: none), every peer's mapped here (index = rank;
  // none: that peer's sends come through the store), and whether each peer mapped this rank's.
  std::shared_ptr<SharedArena> p2p_arena_;
  std::vector<Mapping> peer_p2p_;
  std::vector<bool> p2p_to_;
  std::mutex p2p_send_mu_;
  std::once_flag p2p_announced_;
};

// Rank 0: creates, sizes (reserving the pages: a full /dev/shm fails here, not with SIGBUS
// later) and maps the segment; *fd stays open until every rank has opened it.
Mapping CreateSegment(int nranks, uint64_t nonce, int* fd_out) {
  size_t bytes = SegmentBytes(nranks);
  int fd = memfd_create("keel-shm", MFD_CLOEXEC);
  KEEL_ENFORCE(fd >= 0, "memfd_create: ", std::strerror(errno));
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    close(fd);
    KEEL_THROW("cannot reserve ", bytes, " bytes of shared memory: ", std::strerror(err),
               " (is shared memory limited?)");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int e = errno;
    close(fd);
    KEEL_THROW("mmap of the shared memory segment: ", std::strerror(e));
  }
  auto* h = new (base) Header();
  h->magic = kMagic;
  h->nonce = nonce;
  h->nranks = nranks;
  *fd_out = fd;
  return {base, bytes};
}

// The others: `path` is rank 0's /proc/PID/fd/N.
Mapping OpenSegment(const std::string& path, int nranks, uint64_t nonce) {
  size_t bytes = SegmentBytes(nranks);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  KEEL_ENFORCE(fd >= 0, "open(", path, "): ", std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    KEEL_THROW("shared memory ", path, " has the wrong size");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  KEEL_ENFORCE(base != MAP_FAILED, "mmap of ", path, ": ", std::strerror(errno));
  auto* h = static_cast<Header*>(base);
  if (h->magic != kMagic || h->nonce != nonce || h->nranks != nranks) {
    munmap(base, bytes);
    KEEL_THROW("shared memory ", path, " is not this job's");
  }
  return {base, bytes};
}

}  // namespace

std::unique_ptr<Communicator> CreateShmCommunicator(int ring_id, int rank, int nranks,
                                                    StoreClient& store, const CommOptions& opts,
                                                    std::string* why_not) {
  auto refuse = [&](const std::string& why) -> std::unique_ptr<Communicator> {
    if (why_not) *why_not = why;
    return nullptr;
  };
  if (nranks > kMaxShmRanks) return refuse(StrCat(nranks, " ranks (at most ", kMaxShmRanks, ")"));
  const std::string key = opts.prefix + "shm" + std::to_string(ring_id) + "/";
  // 1. Are all ranks on this host, in one pid and mount namespace?
  const std::string me = HostIdentity();
  store.Set(key + "host" + std::to_string(rank), me);
  for (int j = 0; j < nranks; ++j)
    if (store.Get(key + "host" + std::to_string(j), opts.timeout) != me)
      return refuse(StrCat("rank ", j, " runs on another host or namespace"));
  // 2. Rank 0 creates the segment and publishes where to open it and its nonce (or why it
  // failed).
  Mapping m;
  std::string error;
  if (rank == 0) {
    std::random_device rd;
    uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
    int fd = -1;
    try {
      m = CreateSegment(nranks, nonce, &fd);
      store.Set(key + "segment", StrCat("/proc/", getpid(), "/fd/", fd, " ", nonce));
    } catch (const Error& e) {
      if (fd >= 0) close(fd);
      store.Set(key + "segment", "-");
      return refuse(e.what());
    }
    // 3. Wait until every rank opened it (or failed to), then close the fd: from then on only
    // the mappings keep the memory.
    int ok = 1;
    try {
      for (int j = 1; j < nranks; ++j) {
        std::string s = store.Get(key + "mapped" + std::to_string(j), opts.timeout);
        if (s != "ok") {
          ok = 0;
          error = StrCat("rank ", j, ": ", s);
        }
      }
    } catch (...) {
      close(fd);
      munmap(m.base, m.bytes);
      throw;
    }
    close(fd);
    store.Set(key + "verdict", ok ? "ok" : error);
  } else {
    std::string seg = store.Get(key + "segment", opts.timeout);
    if (seg == "-") return refuse("rank 0 could not create the segment");
    FaultPoint("shm_before_map");
    std::string path = seg.substr(0, seg.find(' '));
    uint64_t nonce = std::stoull(seg.substr(seg.find(' ') + 1));
    try {
      m = OpenSegment(path, nranks, nonce);
      store.Set(key + "mapped" + std::to_string(rank), "ok");
    } catch (const Error& e) {
      store.Set(key + "mapped" + std::to_string(rank), e.what());
    }
  }
  std::string verdict = store.Get(key + "verdict", opts.timeout);
  if (verdict != "ok") {
    if (m.base) munmap(m.base, m.bytes);
    return refuse(verdict);
  }
  auto* h = static_cast<Header*>(m.base);
  h->ranks[rank].pid.store(static_cast<int32_t>(getpid()));
  auto comm =
      std::make_unique<ShmCommunicator>(ring_id, rank, nranks, m.base, m.bytes, opts.timeout);
  comm->Join();  // every pid is posted before anyone relies on them
  // Also with no bytes of its own (zero-copy off here): the peers wait for every rank's answer.
  if (nranks > 1) comm->SetUpSharedMemory(store, key, opts.shm_shared_bytes, opts.timeout);
  return comm;
}

}  // namespace keel
