// Profiler: timed spans of what a process runs (every op the executor runs, every collective),
// written as a Chrome trace (chrome://tracing, ui.perfetto.dev) and summarized per name.
//
// Off by default, and then a span costs one relaxed atomic load. On with --profile=FILE (or
// FLAGS_profile=FILE in the environment) in any program that calls keel::Init: the trace is
// written at exit (keel train and keel bench write it after their timed steps), with ".rankN"
// appended under keel launch; or with profiler::Start() from a program.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace keel {
namespace profiler {

struct Event {
  std::string name;      // op type, or a collective's name
  std::string category;  // "op", "comm", ...
  std::string detail;    // e.g. the op's index and first output
  int64_t start_ns = 0;  // since the profiler's epoch
  int64_t dur_ns = 0;
  int tid = 0;  // small per-thread number, in order of first event (see ThreadName)
};

namespace internal {
extern std::atomic<bool> g_enabled;
int64_t NowNs();
void Record(std::string name, const char* category, std::string detail, int64_t start_ns,
            int64_t end_ns);
}  // namespace internal

inline bool Enabled() { return internal::g_enabled.load(std::memory_order_relaxed); }

// Starts recording (keeping what was recorded before); Stop pauses it.
void Start();
void Stop();
// Drops every recorded event.
void Reset();
// A copy of the events recorded so far, in recording order.
std::vector<Event> Events();
// The name of thread `tid` (its pthread name when it recorded its first event).
std::string ThreadName(int tid);
// Events dropped because the buffer (1<<22 events) was full.
int64_t Dropped();

// Writes the events as Chrome trace JSON to `path` atomically; `pid` labels the process (its
// rank), each thread is named ("main", "keel-ring0", ...), and timestamps are on rank 0's clock
// once fleet has aligned the clocks (SetClockOffsetNs). Throws keel::Error naming the path when it
// cannot be written.
void WriteChromeTrace(const std::string& path, int pid = 0);
// Per (category, name): calls, total, mean and share of the total, largest total first, as a
// fixed-width table.
std::string Summary();

// Nanoseconds added to this process's timestamps in the trace, so that the ranks' traces share
// rank 0's clock: fleet::init measures the offset through the job's store when --profile is set
// (fleet/fleet.cc). Set before the trace is written.
void SetClockOffsetNs(int64_t offset_ns);
// The offset set (0 until then).
int64_t ClockOffsetNs();

// The --profile flag, for the CLI: "" when off; under several workers the rank's own file.
std::string ProfilePathForRank(int rank, int nranks);
// Whether --profile is set.
bool Requested();
// Turns the profiler on when --profile is set, dropping what was recorded before (keel train and
// bench profile their steps only). Returns whether it is on. Both Start functions throw
// keel::Error naming the flag when the trace could not be written there (checked now, not after
// the last step).
bool StartFromFlags();
// keel::Init calls it: with --profile set, records from now on and, when the process exits,
// writes the trace (FinishFromFlags) unless that ran before. So --profile works in any program
// built on the library.
void StartFromFlagsUntilExit();
// This process's rank and world, for the trace's file name and pid (fleet::init sets them).
void SetRank(int rank, int nranks);
// With --profile set, once: stops, writes the trace to ProfilePathForRank and prints the
// per-op summary to stderr. Throws keel::Error naming the path when it cannot be written.
void FinishFromFlags();
// Stops recording and writes nothing at exit (keel launch and inspect, which run no ops).
void Disarm();

// Times a span from construction to destruction when the profiler is on.
class RecordEvent {
 public:
  RecordEvent(const char* category, const std::string& name, const std::string& detail = {}) {
    if (Enabled()) {
      on_ = true;
      category_ = category;
      name_ = name;
      detail_ = detail;
      start_ = internal::NowNs();
    }
  }
  ~RecordEvent() {
    if (on_)
      internal::Record(std::move(name_), category_, std::move(detail_), start_, internal::NowNs());
  }
  RecordEvent(const RecordEvent&) = delete;
  RecordEvent& operator=(const RecordEvent&) = delete;

 private:
  bool on_ = false;
  const char* category_ = nullptr;
  std::string name_, detail_;
  int64_t start_ = 0;
};

}  // namespace profiler
}  // namespace keel
