#include "fleet/straggler_monitor.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fleet/fleet.h"
#include "framework/base/strings.h"
#include "framework/comm/comm_context.h"
#include "framework/comm/communicator.h"
#include "framework/error.h"

DEFINE_double(straggler_report_interval_s, 5,
              "Multi-worker: every this many seconds each rank reports its compute time per step "
              "and rank 0 logs ranks that fall behind (by rank, with how far); 0: off.");
DEFINE_double(straggler_factor, 1.5,
              "A rank whose compute time per step exceeds the median rank's by this factor (and "
              "costs the others at least 5% of their time) is logged as a straggler.");

namespace keel {
namespace fleet {

namespace {

using Clock = std::chrono::steady_clock;

struct Report {
  int64_t seq = 0, steps = 0, window_steps = 0;
  double compute_ms = -1;  // mean over the last interval; -1: no step in it
  double since_step_s = 0;
  // Of since_step_s, the time spent inside collectives (those that ended and the one running).
  double open_comm_s = 0;
  double step_ms = -1;  // mean wall time per step over the last interval; -1: no step in it
};

constexpr auto kRelog = std::chrono::seconds(30);  // a lasting condition is logged this often

std::string Fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// Rank 0: logs a rank that has finished no step for a long time (three report intervals, and ten
// of its usual steps) while it is in no collective and another rank waits inside one: its
// training thread is hung (or busy with something that is not training) while its process lives
// and reports. A slow rank still finishes steps; a stopped one stops reporting (logged apart).
void CheckHung(const std::map<int, Report>& reports, std::map<int, double>* step_s,
               std::map<int, bool>* hung, std::map<int, Clock::time_point>* logged) {
  const double interval = FLAGS_straggler_report_interval_s;
  for (const auto& [r, rep] : reports)
    if (rep.window_steps > 0 && rep.step_ms >= 0) (*step_s)[r] = rep.step_ms * 1e-3;
  for (const auto& [r, rep] : reports) {
    std::vector<std::string> waiting;
    for (const auto& [q, other] : reports)
      if (q != r && other.open_comm_s > interval) waiting.push_back(std::to_string(q));
    const double outside = rep.since_step_s - rep.open_comm_s;
    const double limit = std::max(3 * interval, 10 * (*step_s)[r]);
    const bool is_hung = rep.window_steps == 0 && outside > limit && !waiting.empty();
    auto last = logged->find(r);
    const bool quiet_long = last == logged->end() || Clock::now() - last->second > kRelog;
    if (is_hung && (!(*hung)[r] || quiet_long)) {
      LOG(WARNING) << "straggler: rank " << r << " has finished no step for "
                   << Fmt(rep.since_step_s) << " s (hung?), after " << rep.steps
                   << " step(s): it is in no collective, while rank(s) " << StrJoin(waiting, ", ")
                   << " wait for it in theirs";
      (*logged)[r] = Clock::now();
    } else if (!is_hung && (*hung)[r] && rep.window_steps > 0) {
      LOG(INFO) << "straggler: rank " << r << " finishes steps again (" << rep.steps
                << " step(s) done)";
    }
    (*hung)[r] = is_hung;
  }
}

}  // namespace

StragglerMonitor::StragglerMonitor() : last_step_end_(Clock::now()) {
  // NaN would pass "<= 0" and make the monitor's wait spin; infinity would never report.
  KEEL_ENFORCE(
      std::isfinite(FLAGS_straggler_report_interval_s) && FLAGS_straggler_report_interval_s >= 0,
      "--straggler_report_interval_s must be a finite number of seconds >= 0 (0: off), "
      "got ",
      FLAGS_straggler_report_interval_s);
  KEEL_ENFORCE(std::isfinite(FLAGS_straggler_factor) && FLAGS_straggler_factor > 1,
               "--straggler_factor must be a finite number > 1, got ", FLAGS_straggler_factor);
  if (!initialized() || worker_num() <= 1 || FLAGS_straggler_report_interval_s <= 0 ||
      !CommContext::Get().initialized())
    return;
  thread_ = std::thread([this] { Loop(); });
}

StragglerMonitor::~StragglerMonitor() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    // A request blocked on a dead network must not hold up the exit.
    if (store_ != nullptr) store_->Abort();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StragglerMonitor::StepDone() {
  if (!active()) return;
  const auto now = Clock::now();
  const int64_t comm = RingRegistry::Get().TotalCommNs();
  std::lock_guard<std::mutex> lk(mu_);
  double step_s = std::chrono::duration<double>(now - last_step_end_).count();
  double comm_s = static_cast<double>(comm - last_comm_ns_) * 1e-9;
  window_compute_s_ += std::max(0.0, step_s - comm_s);
  window_wall_s_ += step_s;
  ++window_steps_;
  ++steps_;
  last_step_end_ = now;
  last_comm_ns_ = comm;
}

void StragglerMonitor::Loop() {
  const CommConfig& cfg = CommContext::Get().config();
  const int rank = worker_index(), nranks = worker_num();
  const auto interval = std::chrono::duration<double>(FLAGS_straggler_report_interval_s);
  std::unique_ptr<StoreClient> store;
  try {
    // A connection of its own: the training thread's may be blocked in a long GET.
    store = std::make_unique<StoreClient>(cfg.store_host, cfg.store_port, cfg.token, cfg.timeout,
                                          StoreIdentity{rank, nranks, cfg.generation});
  } catch (const Error& e) {
    LOG(WARNING) << "straggler monitor off: " << e.what();
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
    store_ = store.get();
  }
  struct Forget {
    StragglerMonitor* m;
    ~Forget() {
      std::lock_guard<std::mutex> lk(m->mu_);
      m->store_ = nullptr;
    }
  } forget{this};
  const std::string prefix = "keel/straggler/" + std::to_string(cfg.generation) + "/";
  int64_t seq = 0;
  std::map<int, std::pair<int64_t, Clock::time_point>> last_seen;  // rank 0: seq, when it changed
  std::map<int, Clock::time_point> last_logged;
  std::map<int, bool> flagged;
  // Hung ranks: finishing no step while outside any collective, as their peers wait in theirs.
  std::map<int, double> step_s;  // each rank's mean step time when it last finished steps
  std::map<int, bool> hung;
  std::map<int, Clock::time_point> hung_logged;
  auto log_ok = [&](int r) {
    auto it = last_logged.find(r);
    return it == last_logged.end() || Clock::now() - it->second > std::chrono::seconds(30);
  };
  while (true) {
    Report mine;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (cv_.wait_for(lk, interval, [&] { return stop_; })) return;
      mine.seq = ++seq;
      mine.steps = steps_;
      mine.compute_ms = window_steps_ > 0 ? window_compute_s_ * 1e3 / window_steps_ : -1;
      mine.window_steps = window_steps_;
      mine.step_ms = window_steps_ > 0 ? window_wall_s_ * 1e3 / window_steps_ : -1;
      mine.since_step_s = std::chrono::duration<double>(Clock::now() - last_step_end_).count();
      mine.open_comm_s = static_cast<double>(RingRegistry::Get().TotalCommNs() - last_comm_ns_ +
                                             RingRegistry::Get().InFlightNs()) *
                         1e-9;
      window_compute_s_ = 0;
      window_wall_s_ = 0;
      window_steps_ = 0;
    }
    try {
      std::ostringstream os;
      os << mine.seq << " " << mine.steps << " " << mine.compute_ms << " " << mine.since_step_s
         << " " << mine.window_steps << " " << mine.open_comm_s << " " << mine.step_ms;
      store->Set(prefix + std::to_string(rank), os.str());
      if (rank != 0) continue;
      std::map<int, Report> reports;
      for (int r = 0; r < nranks; ++r) {
        if (!store->Check(prefix + std::to_string(r))) continue;
        std::istringstream is(store->Get(prefix + std::to_string(r), std::chrono::milliseconds(1)));
        Report rep;
        is >> rep.seq >> rep.steps >> rep.compute_ms >> rep.since_step_s >> rep.window_steps >>
            rep.open_comm_s >> rep.step_ms;
        reports[r] = rep;
        auto& seen = last_seen[r];
        if (seen.first != rep.seq) seen = {rep.seq, Clock::now()};
      }
      // Silent ranks: their monitor thread stopped posting (the process is stopped or hung).
      for (const auto& [r, seen] : last_seen) {
        double silent = std::chrono::duration<double>(Clock::now() - seen.second).count();
        if (silent > 3 * FLAGS_straggler_report_interval_s && log_ok(r)) {
          LOG(WARNING) << "straggler: rank " << r << " has not reported for " << Fmt(silent)
                       << " s (stopped or hung?); its last report: step " << reports[r].steps
                       << ", the others wait for it in their collectives";
          last_logged[r] = Clock::now();
        }
      }
      CheckHung(reports, &step_s, &hung, &hung_logged);
      std::vector<double> compute;
      for (const auto& [r, rep] : reports)
        if (rep.compute_ms >= 0) compute.push_back(rep.compute_ms);
      if (compute.size() < 2) continue;
      std::sort(compute.begin(), compute.end());
      const double median = compute[(compute.size() - 1) / 2];
      for (const auto& [r, rep] : reports) {
        if (rep.compute_ms < 0) continue;
        // Far behind: slower than the median by the factor, and the others lose at least 5% of
        // their time waiting for it.
        const double lost_s = (rep.compute_ms - median) * 1e-3 * rep.window_steps;
        const bool behind = rep.compute_ms > median * FLAGS_straggler_factor &&
                            lost_s >= 0.05 * FLAGS_straggler_report_interval_s;
        if (behind && (log_ok(r) || !flagged[r])) {
          LOG(WARNING) << "straggler: rank " << r << " computes " << Fmt(rep.compute_ms)
                       << " ms per step, the median rank " << Fmt(median) << " ms ("
                       << Fmt(rep.compute_ms / std::max(median, 1e-3))
                       << "x): " << Fmt(rep.compute_ms - median)
                       << " ms per step behind; the other ranks wait for it in every "
                          "all-reduce";
          last_logged[r] = Clock::now();
        } else if (!behind && flagged[r]) {
          LOG(INFO) << "straggler: rank " << r << " is back in line (" << Fmt(rep.compute_ms)
                    << " ms per step, median " << Fmt(median) << " ms)";
        }
        flagged[r] = behind;
      }
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!stop_) LOG(WARNING) << "straggler monitor stopped: " << e.what();
      return;
    }
  }
}

}  // namespace fleet
}  // namespace keel
