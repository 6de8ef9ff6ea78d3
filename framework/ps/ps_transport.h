// The parameter-server transport (docs/parameter-server.md): one Gloo context over every process of
// a parameter-server job (servers first, then trainers: the global ranks of fleet's Role), made
// through the job's rendezvous store, and point-to-point transfers on its TCP pairs with Gloo's
// unbound buffers. No wire protocol of its own: a transfer is one Gloo send or receive of a tensor
// block's bytes, matched by its slot:
//
//   slot = kind << 56 | block << 32 | step (low 32 bits)
//
// kind: kHeader (a trainer tells every server that step `step` starts, that it is done, or that
// it asks for the server's state for a checkpoint: kState, `block` indexing the server's list),
// kGrad (a trainer's gradient block for `step`), kParam (a server's parameter block after `step`;
// step 0: the initial values), kRows (a row-sparse gradient block's rows and values, after its
// row count under kGrad; docs/sparse-embeddings.md), kIds / kPrefetch (a trainer's request for
// rows of a distributed table and the server's reply), kBundle (sync mode: every parameter block
// a server holds, after `step`, in one message; block 0). `block` is the block's index in the
// transpiler's plan
// (transpiler/ps_pass.h), the same in every process. Gloo's TCP pairs hand data over only once
// the receiver has posted its receive, so nothing is buffered without bound.
//
// Failures: every wait is bounded by the comm timeout (CommContext's, --comm_timeout_s); a peer
// that dies closes its pairs, which fails the transfers with it at once. The error names the peer
// ("server 1 (rank 1)", "trainer 0 (rank 2)") and what was transferred. A process that stops the
// job on purpose (a server that finds unequal step counts) posts why to the store first
// (PostAbort), and the others' errors quote it.
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

namespace gloo {
namespace transport {
class UnboundBuffer;
}
namespace rendezvous {
class Context;
}
}  // namespace gloo

namespace keel {
class StoreClient;
namespace ps {

class AsyncCommunicator;

enum class Kind : uint64_t {
  kHeader = 1,
  kGrad = 2,
  kParam = 3,
  kState = 4,
  kRows = 5,
  kIds = 6,
  kPrefetch = 7,
  kBundle = 8
};
uint64_t Slot(Kind kind, int block, int64_t step);

// A header: step >= 1 starts that step; kDone says the trainer finished after `steps` steps.
struct Header {
  int64_t step = 0;
  int64_t steps = 0;  // steps completed before this header
  int64_t table = 0;  // kPrefetch: the distributed table's slot
  // kPrefetch: how many ids it asks for (HeaderWithIds); an asynchronous push: the bytes of its
  // message that follows (PushSection's; 0: a message per block, as GEO sends them).
  int64_t count = 0;
};
constexpr int64_t kDone = -1;
constexpr int64_t kSave = -2;      // a trainer asks for the server's state (a checkpoint)
constexpr int64_t kPrefetch = -3;  // a trainer asks for rows of a distributed table

// What a server receives as a header: a request for at most kInlineIds rows of a distributed
// table carries their ids in the header's message (the lookup waits for one transfer less); a
// longer one sends them after it, under Slot(kIds, table, steps). Other headers are a Header alone
// (Gloo takes a message shorter than the receive posted for it).
constexpr int64_t kInlineIds = 8192;
struct HeaderWithIds {
  Header h;
  int64_t ids[kInlineIds];
};

// After a step, a server's parameter blocks go to a trainer as one message (Kind::kBundle): a
// header (the block count and a checksum of their slots), then the blocks in ascending slot
// order. A message per block cost the job more than its bytes: each one is a few small Gloo
// messages and wakeups of a process on either side (docs/parameter-server.md, "Transport").
struct BundleBlock {  // a trainer's: where a block goes
  int slot = 0;
  char* data = nullptr;
  size_t bytes = 0;
};
struct BundleSource {  // a server's: a block's value
  int slot = 0;
  const char* data = nullptr;
  size_t bytes = 0;
};
// The message's size, header included.
size_t BundleBytes(const std::vector<BundleBlock>& blocks);
// The message of `blocks` (any order; the server's side).
std::vector<char> PackBundle(std::vector<BundleSource> blocks);
// Copies the blocks out of a received message (`blocks` in any order; a trainer's side). A
// keel::Error naming `what` when the message holds other blocks.
void UnpackBundle(const std::vector<char>& message, std::vector<BundleBlock> blocks,
                  const std::string& what);

// Asynchronous mode: a trainer's push to a server is its header (with count = the bytes that
// follow) and one message under Slot(kBundle, 0, step) of sections, each a PushSection and its
// bytes: a dense block's gradient, or a row-sparse one's row count n (int64), its n rows (int64)
// and their n rows of values. GEO's pushes (count = 0) send a message per block.
struct PushSection {
  int64_t slot = 0;
  int64_t rows = 0;   // 0: dense, 1: row-sparse
  int64_t bytes = 0;  // what follows
};

class Transport {
 public:
  // One posted send or receive.
  // Destroying a Transfer whose transfer is still pending (an error left it unwaited) first
  // destroys the Gloo buffer, which waits until Gloo's thread is done with it, then frees its
  // bytes; `owned` is declared before `buf` so that the members go in that order too.
  struct Transfer {
    Transfer();
    ~Transfer();
    std::vector<char> owned;  // a send's copy of its bytes
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    std::vector<int> peers;  // the receive's possible sources, or the send's destination
    std::string what;
    bool is_send = false;
  };

  static Transport& Get();

  // Joins the job's parameter-server context: this process is `rank` of `nranks`, ranks
  // 0..nservers-1 are the servers. Every process of the job calls it (the first PS op does).
  // Idempotent for the same arguments.
  void Connect(int rank, int nranks, int nservers);
  bool connected() const { return context_ != nullptr; }
  int rank() const { return rank_; }
  int nservers() const { return nservers_; }
  int ntrainers() const { return nranks_ - nservers_; }
  // "server 1 (rank 1)", "trainer 0 (rank 2)".
  std::string PeerName(int rank) const;
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Posts a send of a copy of `bytes` bytes at `data` to `peer`.
  std::unique_ptr<Transfer> PostSend(int peer, uint64_t slot, const void* data, size_t bytes,
                                     const std::string& what);
  // Posts a send of `bytes` (taken, not copied) to `peer`.
  std::unique_ptr<Transfer> PostSend(int peer, uint64_t slot, std::vector<char>&& bytes,
                                     const std::string& what);
  // Posts a receive of exactly `bytes` bytes into `data` from any of `peers`.
  std::unique_ptr<Transfer> PostRecv(const std::vector<int>& peers, uint64_t slot, void* data,
                                     size_t bytes, const std::string& what);
  // Waits for it (at most the comm timeout); returns the peer it went to or came from. A
  // keel::Error names the peer(s) and `what` on timeout or a broken connection. A receive from any
  // of several peers is watched through the job's store (Gloo fails it on no closed connection):
  // when one of the peers exits, or the store does (it lives in server 0), the wait ends at once
  // naming it.
  int Wait(Transfer& t);

  // Asynchronous mode (the ops' attr mode = 1): every header goes under step 0 of its slot, since
  // a server receives the next header from whichever trainer sends one (trainers' steps differ).
  // Set by the first PS op; every op of the job must agree.
  void SetAsync(bool async, const std::string& op);
  bool async() const { return async_; }
  uint64_t HeaderSlot(int64_t step) const { return Slot(Kind::kHeader, 0, async_ ? 0 : step); }
  // Asynchronous and GEO mode: a trainer's requests for rows of a distributed table (and, at the
  // end, that it is done) go under a header slot of their own, served by a server thread of
  // their own (listen_and_serv), so that they do not queue behind other trainers' pushes.
  uint64_t PrefetchHeaderSlot() const { return Slot(Kind::kHeader, 1, 0); }
  // Ends a receive's Wait at once (another thread stopping the one that waits), as an abort.
  void AbortRecv(Transfer& t);

  // GEO: counts geo_communicate's runs (1, 2, ...); it exchanges on multiples of k.
  int64_t NextGeoRun() { return ++geo_runs_; }

  // Trainer side: the step the trainer is in (0: startup, before its first send).
  int64_t step() const { return step_.load(); }
  // On a step's first send: starts step step()+1, telling every server (a header).
  void BeginStepOnce();
  // Keeps a posted transfer until WaitSends / WaitRecvs.
  void KeepSend(std::unique_ptr<Transfer> t);
  void KeepRecv(std::unique_ptr<Transfer> t);
  // Synchronous mode, a step's recv ops: block `slot` of server `server` (`bytes` at `data`) comes
  // in that server's bundle; fetch_barrier receives it.
  void AddBundleBlock(int server, int slot, void* data, size_t bytes, std::string what);
  // send_barrier: waits for the step's sends (the servers have every gradient block); the step's
  // sends are then over. fetch_barrier: waits for the posted receives, and receives the servers'
  // bundles, copying their blocks to where the recv ops said.
  void WaitSends();
  void WaitRecvs();
  // Asynchronous mode, a trainer (framework/ps/async_communicator.h): the communicator, made on
  // first use; it takes the pushes from the trainer's first step on (the send, recv and barrier
  // ops ask communicating()), its startup's recv ops having said which blocks to pull.
  AsyncCommunicator& communicator();
  bool communicating() const { return communicating_.load(); }
  bool has_communicator() {
    std::lock_guard<std::mutex> lk(mu_);
    return communicator_ != nullptr;
  }
  void StartCommunicating(int queue_steps, int max_merge, int max_staleness);
  // The communicator's push: starts step step() + 1 and returns it; PostPushHeader posts its
  // header to one server, announcing `bytes` of push after it.
  int64_t NextPushStep();
  std::unique_ptr<Transfer> PostPushHeader(int server, int64_t step, int64_t bytes);
  // Between steps: asks every server for its state (kSave headers); the servers then send their
  // state lists under Slot(kState, i, step() + 1). The communicator pushes what it holds first.
  void RequestState();
  // The trainer is done (fleet::stop_worker): tells every server, waits until they took it.
  void FinishTrainer();
  bool finished() const { return finished_; }

  // Stops the job on purpose: posts `why` to the store (quoted in the others' errors), then the
  // caller throws it.
  void PostAbort(const std::string& why);

  // Drops the context (tests; a process connects once).
  void Reset();

 private:
  std::string AbortNote() const;
  // The watcher: while transfers are waited for, every 100 ms it asks the job's store which
  // processes exited and aborts the waits that involve one (Gloo leaves some of them pending
  // until the timeout: a receive from any of several peers, a send posted as the peer died),
  // recording why.
  struct Watched {
    Transfer* t;
    std::string why;
  };
  void WatchLoop();
  // Which of `peers` have exited, by the job's store ("trainer 1 (rank 3) exited ..."), or that
  // the store itself is gone; empty when none is.
  std::string GonePeers(const std::vector<int>& peers);
  // For an error of a transfer with several peers: "; " and GonePeers, asked for up to 0.5 s.
  std::string WhoIsGone(const std::vector<int>& peers);

  int rank_ = -1, nranks_ = 0, nservers_ = 0;
  std::chrono::milliseconds timeout_{300000};
  std::shared_ptr<void> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::mutex mu_;                 // step state and the kept transfers
  std::mutex post_mu_;            // posting to the context (ops post from the executor's threads)
  std::atomic<int64_t> step_{0};  // the communicator's thread advances it, ops read it
  bool in_step_ = false, finished_ = false;
  int async_set_ = -1;  // -1: not yet set
  int64_t geo_runs_ = 0;
  std::atomic<bool> async_{false};  // set once by the first PS op; the communicator reads it
  std::vector<std::unique_ptr<Transfer>> sends_, recvs_;
  std::map<int, std::vector<BundleBlock>> bundle_;  // server -> the blocks the recv ops added
  std::map<int, std::string> bundle_what_;          // server -> its first block's recv, for errors
  std::map<int, std::vector<char>> bundle_bytes_;   // server -> its bundle's buffer (reused)
  std::unique_ptr<AsyncCommunicator> communicator_;
  std::atomic<bool> communicating_{false};
  std::mutex watch_mu_;                         // GonePeers' store connection
  std::unique_ptr<StoreClient> watch_store_;    // its own: the main one may be in a long wait
  int64_t store_gone_since_ms_ = -1;            // when GonePeers first found the store gone
  std::atomic<int64_t> last_gone_check_ms_{0};  // when Wait last asked GonePeers (steady clock)
  std::mutex active_mu_;                        // the waits in progress, for the watcher
  std::vector<Watched*> active_;
  std::thread watcher_;
};

}  // namespace ps
}  // namespace keel
