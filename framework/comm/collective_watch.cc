// The collective watch (collective_watch.h): the waits it knows, its thread and what it posts.
#include "framework/comm/collective_watch.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <cstdlib>

#include "framework/comm/store.h"
#include "framework/error.h"

DEFINE_double(collective_check_s, 1.0,
              "Seconds a collective waits before this rank posts what it waits in to the store "
              "and compares it with the other ranks' posts: ranks in calls that cannot complete "
              "together (a collective only some ranks make) then fail at once, naming each "
              "rank's call, instead of after --comm_timeout_s. 0: off.");

namespace keel {

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kLook = std::chrono::milliseconds(250);  // how often the thread looks
constexpr int kStillLooks = 2;  // looks with no post changing before a report is trusted
// The change counter: every post adds 1, the report adds kReported.
constexpr int64_t kReported = int64_t{1} << 40;
constexpr auto kConnectTimeout = std::chrono::milliseconds(10000);
const char kChangesKey[] = "keel/watch/changes";
const char kReportKey[] = "keel/watch/report";

std::string PostKey(int rank) { return "keel/watch/rank" + std::to_string(rank); }

}  // namespace

// ---------------------------------------------------------------- WatchedWait

WatchedWait::WatchedWait(std::string channel, std::string where, bool exclusive)
    : channel_(std::move(channel)), where_(std::move(where)), exclusive_(exclusive) {
  CollectiveWatch::Get().Add(this);
}

WatchedWait::~WatchedWait() { CollectiveWatch::Get().Remove(this); }

void WatchedWait::SetNames(std::string channel, std::string where) {
  std::lock_guard<std::mutex> lk(mu_);
  channel_ = std::move(channel);
  where_ = std::move(where);
}

void WatchedWait::SetInterrupt(std::function<void()> interrupt) {
  std::lock_guard<std::mutex> lk(mu_);
  interrupt_ = std::move(interrupt);
}

void WatchedWait::Begin(uint64_t seq, Clock::time_point since) {
  std::lock_guard<std::mutex> lk(mu_);
  active_ = true;
  posted_ = false;
  seq_ = seq;
  since_ = since;
  call_ = CollectiveCall::Current();
  last_seq_.store(seq, std::memory_order_relaxed);
  if (exclusive_) {
    std::atomic<uint64_t>& calls = CollectiveWatch::Get().fleet_calls_;
    for (uint64_t c = calls.load(); c < seq && !calls.compare_exchange_weak(c, seq);) {
    }
  }
  // After a mismatch was found nothing is waited for any more.
  if (CollectiveWatch::Get().decided_.load(std::memory_order_acquire) && !interrupted_) {
    interrupted_.store(true, std::memory_order_release);
    if (interrupt_) interrupt_();
  }
}

void WatchedWait::End() {
  bool posted;
  {
    std::lock_guard<std::mutex> lk(mu_);
    posted = posted_;
    active_ = false;
    posted_ = false;
    call_ = nullptr;
  }
  if (posted) CollectiveWatch::Get().Repost();
}

void WatchedWait::SetProbe(std::function<std::string()> probe) {
  std::lock_guard<std::mutex> lk(mu_);
  probe_ = std::move(probe);
}

std::string WatchedWait::broken() const {
  std::lock_guard<std::mutex> lk(mu_);
  return broken_;
}

bool WatchedWait::active() const {
  std::lock_guard<std::mutex> lk(mu_);
  return active_;
}

// ---------------------------------------------------------------- CollectiveWatch

CollectiveWatch& CollectiveWatch::Get() {
  static CollectiveWatch* w = new CollectiveWatch;  // never destroyed: waits outlive statics
  return *w;
}

std::chrono::milliseconds CollectiveWatch::Grace() {
  return std::chrono::milliseconds(static_cast<int64_t>(FLAGS_collective_check_s * 1000));
}

void CollectiveWatch::Add(WatchedWait* w) {
  std::lock_guard<std::mutex> lk(list_mu_);
  waits_.push_back(w);
}

void CollectiveWatch::Remove(WatchedWait* w) {
  std::lock_guard<std::mutex> lk(list_mu_);
  waits_.erase(std::remove(waits_.begin(), waits_.end(), w), waits_.end());
}

void CollectiveWatch::Start(int rank, int nranks,
                            std::function<std::unique_ptr<StoreClient>()> connect) {
  Stop();
  if (nranks <= 1 || FLAGS_collective_check_s <= 0) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    rank_ = rank;
    nranks_ = nranks;
    stop_ = false;
  }
  {
    // Connected now, so that a rank that exits can say so on its way out.
    std::lock_guard<std::mutex> io(io_mu_);
    connect_ = std::move(connect);
    Client();
  }
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit([] { CollectiveWatch::Get().PostExit(); }); });
  std::lock_guard<std::mutex> lk(mu_);
  thread_ = std::thread([this] { Loop(); });
}

void CollectiveWatch::PostExit() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
  }
  std::lock_guard<std::mutex> io(io_mu_);
  StoreClient* c = broken_ ? nullptr : client_.get();
  if (c == nullptr) return;
  try {
    RankPost post;
    post.exited = true;
    post.last_seq["fleet"] = fleet_calls_.load();
    {
      std::lock_guard<std::mutex> lk(list_mu_);
      for (WatchedWait* w : waits_) {
        std::lock_guard<std::mutex> wl(w->mu_);
        if (w->exclusive_) continue;
        uint64_t& last = post.last_seq[w->channel_];
        last = std::max(last, w->last_seq_.load(std::memory_order_relaxed));
      }
    }
    c->Set(PostKey(rank_), EncodePost(post));
    c->Add(kChangesKey, 1);
  } catch (const Error&) {
    // The store's server (rank 0) may have exited first: nobody is left to tell.
  }
}

void CollectiveWatch::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> io(io_mu_);
    client_.reset();
    connect_ = nullptr;
    broken_ = false;
    posted_.clear();
    read_at_ = -1;
    still_ = 0;
    candidate_.clear();
  }
  std::lock_guard<std::mutex> lk(mu_);
  verdict_.clear();
  decided_.store(false, std::memory_order_release);
}

std::string CollectiveWatch::Verdict() {
  std::lock_guard<std::mutex> lk(mu_);
  return verdict_;
}

std::string CollectiveWatch::Explain(const std::string& error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!verdict_.empty()) return verdict_;
    if (stop_) return error;
  }
  std::lock_guard<std::mutex> io(io_mu_);
  if (decided_.load(std::memory_order_acquire)) return Verdict();
  // Only over a connection the watch already has: a rank that never posted took no part in a
  // report, and an error path must not wait to connect to a store that may be gone.
  StoreClient* c = broken_ ? nullptr : client_.get();
  if (c == nullptr) return error;
  try {
    if (c->Add(kChangesKey, 0) < kReported) return error;
    const std::string report = c->Get(kReportKey, kConnectTimeout);
    Decide(report);
    return report;
  } catch (const Error& e) {
    VLOG(1) << "collective watch: cannot read a report: " << e.what();
    return error;
  }
}

StoreClient* CollectiveWatch::Client() {
  if (broken_) return nullptr;
  if (!client_ && connect_) {
    try {
      client_ = connect_();
    } catch (const Error& e) {
      LOG(WARNING) << "collective watch: no store connection (" << e.what()
                   << "); collectives only some ranks make wait until --comm_timeout_s";
      broken_ = true;
    }
  }
  return client_.get();
}

void CollectiveWatch::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, kLook, [&] { return stop_; });
    if (stop_) break;
    lk.unlock();
    Tick();
    lk.lock();
  }
}

std::vector<PostedWait> CollectiveWatch::SlowWaits(Clock::time_point now) {
  const auto grace = Grace();
  std::vector<PostedWait> slow;
  std::lock_guard<std::mutex> lk(list_mu_);
  for (WatchedWait* w : waits_) {
    std::lock_guard<std::mutex> wl(w->mu_);
    if (!w->active_ || now - w->since_ < grace) continue;
    w->posted_ = true;
    PostedWait p;
    p.channel = w->channel_;
    p.where = w->where_;
    p.seq = w->seq_;
    p.exclusive = w->exclusive_;
    p.name = w->call_ ? w->call_->Name() : "a collective";
    p.detail = w->call_ ? w->call_->Detail() : "";
    slow.push_back(std::move(p));
  }
  return slow;
}

void CollectiveWatch::Publish(const std::vector<PostedWait>& mine) {
  RankPost post;
  post.waits = mine;
  const std::string text = EncodePost(post);
  if (text == posted_) return;
  StoreClient* c = Client();
  if (c == nullptr) return;
  c->Set(PostKey(rank_), text);
  c->Add(kChangesKey, 1);
  posted_ = text;
}

void CollectiveWatch::Repost() {
  try {
    std::lock_guard<std::mutex> io(io_mu_);
    if (decided_.load(std::memory_order_acquire) || broken_) return;  // the report's evidence
    std::vector<PostedWait> mine = SlowWaits(Clock::now());
    if (mine.empty() && posted_.empty()) return;
    Publish(mine);
  } catch (const Error& e) {
    VLOG(1) << "collective watch: cannot update this rank's post: " << e.what();
  }
}

void CollectiveWatch::Tick() {
  std::lock_guard<std::mutex> io(io_mu_);
  if (decided_.load(std::memory_order_acquire)) {
    InterruptActive();  // waits begun since the report, and those that have yet to end
    return;
  }
  const Clock::time_point now = Clock::now();
  ProbeWaits(now);
  if (broken_) return;
  const std::vector<PostedWait> mine = SlowWaits(now);
  if (mine.empty() && posted_.empty()) {
    read_at_ = -1;
    candidate_.clear();
    return;  // the usual case: no store traffic at all
  }
  try {
    Publish(mine);
    StoreClient* c = Client();
    if (mine.empty() || c == nullptr) {
      read_at_ = -1;
      candidate_.clear();
      return;
    }
    const int64_t changes = c->Add(kChangesKey, 0);
    if (changes >= kReported) {
      Decide(c->Get(kReportKey, kConnectTimeout));
      return;
    }
    if (changes != read_at_) {
      // A post changed since the last reading: read them all again.
      std::vector<RankPost> posts(static_cast<size_t>(nranks_));
      for (int r = 0; r < nranks_; ++r) {
        posts[r].rank = r;
        if (r == rank_)
          posts[r].waits = mine;
        else if (c->Check(PostKey(r)))
          posts[r] = DecodePost(r, c->Get(PostKey(r), kConnectTimeout));
      }
      candidate_ = CollectiveMismatchReport(posts);
      read_at_ = changes;
      still_ = 0;
      return;
    }
    if (candidate_.empty() || ++still_ < kStillLooks) return;
    c->Set(kReportKey, candidate_);
    c->Add(kChangesKey, kReported);
    Decide(candidate_);
  } catch (const Error& e) {
    LOG(WARNING) << "collective watch: the store failed (" << e.what()
                 << "); collectives only some ranks make wait until --comm_timeout_s";
    broken_ = true;
    client_.reset();
  }
}

void CollectiveWatch::Decide(const std::string& report) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!verdict_.empty()) return;
    verdict_ = report;
    decided_.store(true, std::memory_order_release);
  }
  LOG(ERROR) << report;
  InterruptActive();
}

void CollectiveWatch::ProbeWaits(Clock::time_point now) {
  const auto grace = Grace();
  std::lock_guard<std::mutex> lk(list_mu_);
  for (WatchedWait* w : waits_) {
    std::lock_guard<std::mutex> wl(w->mu_);
    if (!w->active_ || !w->probe_ || now - w->since_ < grace) continue;
    if (w->broken_.empty()) {
      w->broken_ = w->probe_();
      if (w->broken_.empty()) continue;
      LOG(ERROR) << "collective watch: " << w->where_ << " is broken (" << w->broken_
                 << "); ending its wait";
    }
    // Again at each look until the wait ends.
    w->interrupted_.store(true, std::memory_order_release);
    if (w->interrupt_) w->interrupt_();
  }
}

void CollectiveWatch::InterruptActive() {
  std::lock_guard<std::mutex> lk(list_mu_);
  for (WatchedWait* w : waits_) {
    std::lock_guard<std::mutex> wl(w->mu_);
    if (!w->active_) continue;
    // A wait already interrupted that is still active is nudged again.
    w->interrupted_.store(true, std::memory_order_release);
    if (w->interrupt_) w->interrupt_();
  }
}

}  // namespace keel
