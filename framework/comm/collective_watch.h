// CollectiveWatch: a collective that some ranks never call fails within seconds on every rank
// that waits in it, naming the call each rank is in, instead of waiting out --comm_timeout_s.
//
// Nothing goes through the store while collectives complete. Each place this process can wait in
// a collective (a ring, a ring's setup, one of fleet's calls) is a WatchedWait; a wait marks it
// active (a lock held for a few instructions) and inactive again when it ends. A thread of the
// watch looks every 250 ms: while a wait has lasted longer than --collective_check_s (1 s), it
// posts what this rank waits in to the store (key keel/watch/rankN, one line per wait: the
// user's call, the ring or fleet channel, the sequence number there) and reads the other ranks'
// posts. A counter that every post bumps tells it when a post changed, so a rank reads the others'
// posts again only then, and trusts a conclusion only after the counter stood still for two more
// looks (a post that a finished wait has yet to clear never decides). A wait that ends after it
// was posted clears its post before the caller goes on.
//
// The ranks cannot all finish (CollectiveMismatchReport) when two of them post
// - fleet calls (fleet::barrier_worker, fleet::all_reduce, fleet::metrics::*, the program checks)
//   that differ in name or number: each rank makes them from its own thread, in order;
// - a fleet call on one rank and, on the other, only collectives of a program being run: the first
//   rank runs no program until its fleet call returns, the second returns from its run only after
//   its collectives complete;
// - collectives on the same ring with different sequence numbers or calls;
// or when one rank waits in a call that a rank which has exited never made (a process that exits
// normally posts, on its way out, the number of its last fleet call and of its last collective on
// each ring).
// Then the first rank to see it publishes the report and every rank ends its waits with it: a
// shared-memory ring's wait loop sees a flag, a Gloo ring's pending operations are failed, a wait
// on the store has its connection shut. A wait that failed otherwise (a peer that left because of
// the mismatch) is explained by the published report too (Explain).
//
// Besides, a wait whose transport can fail without waking it has a probe (WatchedWait::SetProbe),
// which the watch's thread asks at each look once the wait has lasted past the grace period; a
// wait found broken is interrupted there by this rank alone (no report is published for it; a
// report the others publish still explains the failure, CollectiveWatch::Explain). With
// --collective_check_s=0 there is no watch thread, and no probe either.
//
// Program collectives on NCCL rings are not watched (their waits run on the GPU).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace keel {

class StoreClient;

// The call a rank is in, in the user's words. Lives on the caller's stack for the length of the
// call; collectives made meanwhile on this thread are posted under it.
class CollectiveCall {
 public:
  virtual ~CollectiveCall() = default;
  // The same on every rank that makes this call: "fleet::metrics::sum", "op c_allreduce_sum of X".
  virtual std::string Name() const = 0;
  // This rank's particulars, shown after the name ("in run 12 of its program"); may be "".
  virtual std::string Detail() const { return ""; }

  // The innermost call of this thread's Scopes, or nullptr.
  static const CollectiveCall* Current();
  class Scope {
   public:
    explicit Scope(const CollectiveCall* call);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const CollectiveCall* prev_;
  };
};

// A call known by a fixed name (fleet's API).
class NamedCall : public CollectiveCall {
 public:
  explicit NamedCall(std::string name) : name_(std::move(name)) {}
  std::string Name() const override { return name_; }

 private:
  std::string name_;
};

// One wait as a rank posts it.
struct PostedWait {
  std::string channel;     // what numbers the calls: "fleet", "ring 0", "ring 3 node1"
  std::string where;       // the channel in the user's words: "fleet's eager ring", "ring 0"
  uint64_t seq = 0;        // the call's number on its channel (0: setting the ring up)
  bool exclusive = false;  // a fleet call: the rank's thread does nothing else until it returns
  std::string name, detail;
};

struct RankPost {
  int rank = 0;
  std::vector<PostedWait> waits;  // empty: not waiting long in any collective
  bool exited = false;            // the rank's process exited (posted as it exits)
  // Exited: the number of the last call it made on each channel it had ("fleet", its rings).
  std::map<std::string, uint64_t> last_seq;
};

// A post as stored (one line per wait, or "exited") and back; fields lose tabs and newlines.
std::string EncodePost(const RankPost& post);
RankPost DecodePost(int rank, const std::string& text);

// The report naming every rank's call when `posts` (one per rank, in rank order) show two ranks in
// collectives that cannot complete together; "" when they may all still finish.
std::string CollectiveMismatchReport(const std::vector<RankPost>& posts);

// A place this process can wait in a collective: a ring, a ring's setup, one of fleet's calls.
// Registered with the watch for its lifetime.
class WatchedWait {
 public:
  WatchedWait(std::string channel, std::string where, bool exclusive);
  ~WatchedWait();
  WatchedWait(const WatchedWait&) = delete;
  WatchedWait& operator=(const WatchedWait&) = delete;

  void SetNames(std::string channel, std::string where);
  // Ends this wait when the watch finds a mismatch, or when the probe finds the transport broken:
  // called by the watch's thread, under this wait's lock and only while the wait is active (so
  // whatever it uses is alive); again at each look while the wait stays active (a transport may
  // need a nudge per thing it waits for).
  void SetInterrupt(std::function<void()> interrupt);
  // Says whether the transport under this wait has failed ("" when sound, else why): called by
  // the watch's thread at each look while the wait has lasted past the grace period, under this
  // wait's lock. A wait whose probe answers is interrupted at once, by this rank alone (the
  // others learn of it as their transports fail). For a transport that can fail a connection
  // without waking the waits on it (Gloo's, for a send it had begun writing).
  void SetProbe(std::function<std::string()> probe);
  // What the probe answered when it ended this wait, or "".
  std::string broken() const;

  // The wait for call number `seq` on this channel starts (it started at `since`); the call is
  // CollectiveCall::Current() of this thread.
  void Begin(uint64_t seq,
             std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now());
  // It ended; when it had been posted, the post is cleared before this returns.
  void End();
  // Call number `seq` ran here without a Begin (it did not wait long): only counted.
  void Note(uint64_t seq) { last_seq_.store(seq, std::memory_order_relaxed); }
  bool active() const;
  // Whether the watch ended this wait (the report: CollectiveWatch::Get().Verdict()).
  bool interrupted() const { return interrupted_.load(std::memory_order_acquire); }

 private:
  friend class CollectiveWatch;
  mutable std::mutex mu_;
  std::string channel_, where_;
  bool exclusive_;
  std::function<void()> interrupt_;
  std::function<std::string()> probe_;
  std::string broken_;
  bool active_ = false, posted_ = false;
  uint64_t seq_ = 0;
  std::chrono::steady_clock::time_point since_;
  const CollectiveCall* call_ = nullptr;
  std::atomic<bool> interrupted_{false};
  std::atomic<uint64_t> last_seq_{0};  // the last call number begun or noted
};

// Begin on construction (when `wait` is set), End on destruction.
class WaitScope {
 public:
  WaitScope(WatchedWait* wait, uint64_t seq) : wait_(wait) {
    if (wait_) wait_->Begin(seq);
  }
  ~WaitScope() {
    if (wait_) wait_->End();
  }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  WatchedWait* wait_;
};

class CollectiveWatch {
 public:
  static CollectiveWatch& Get();

  // Starts watching for rank `rank` of `nranks` (nothing for one rank): `connect` opens the
  // watch's own store connection, now. --collective_check_s=0: off.
  void Start(int rank, int nranks, std::function<std::unique_ptr<StoreClient>()> connect);
  // Stops the thread and forgets the connection and any report (CommContext::Reset).
  void Stop();

  // The mismatch report that ended this process's waits, or "".
  std::string Verdict();
  // For a collective that failed with `error`: the mismatch report when this process has one or
  // a peer published one (asked of the store when this rank has posted), else `error`.
  std::string Explain(const std::string& error);

  // How long a wait lasts before it is posted (--collective_check_s).
  static std::chrono::milliseconds Grace();

 private:
  friend class WatchedWait;
  CollectiveWatch() = default;
  void Add(WatchedWait* w);
  void Remove(WatchedWait* w);
  // A posted wait ended: post again (without it).
  void Repost();
  void Loop();
  void Tick();
  // The active waits older than the grace period, marked posted. Under io_mu_.
  std::vector<PostedWait> SlowWaits(std::chrono::steady_clock::time_point now);
  // Posts `mine` when it changed. Under io_mu_.
  void Publish(const std::vector<PostedWait>& mine);
  // At exit (std::atexit): posts that this rank has left.
  void PostExit();
  // Asks the probes of the waits past the grace period; interrupts those it finds broken.
  void ProbeWaits(std::chrono::steady_clock::time_point now);
  // Records `report` and ends every active wait with it.
  void Decide(const std::string& report);
  void InterruptActive();
  StoreClient* Client();  // under io_mu_; nullptr when no connection can be had

  std::mutex list_mu_;
  std::vector<WatchedWait*> waits_;

  std::mutex mu_;  // the thread's state and the report
  std::condition_variable cv_;
  bool stop_ = true;
  std::thread thread_;
  std::string verdict_;
  std::atomic<bool> decided_{false};
  std::atomic<uint64_t> fleet_calls_{0};  // the highest number of a fleet call begun
  int rank_ = 0, nranks_ = 1;

  std::mutex io_mu_;  // the store connection and what was posted
  std::function<std::unique_ptr<StoreClient>()> connect_;
  std::unique_ptr<StoreClient> client_;
  bool broken_ = false;  // the connection failed: the watch stays quiet
  std::string posted_;   // this rank's post as last written
  // The last reading of the others' posts: the counter it was taken at, how many looks since
  // found the counter unchanged, and the report it gave.
  int64_t read_at_ = -1;
  int still_ = 0;
  std::string candidate_;
};

}  // namespace keel
