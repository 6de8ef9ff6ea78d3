#include "framework/profiler/profiler.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <sstream>

#include "framework/error.h"
#include "framework/io/atomic_file.h"

DEFINE_string(profile, "",
              "Write a Chrome trace (chrome://tracing, ui.perfetto.dev) of every op and "
              "collective to this file, and print a per-op summary: keel train and keel bench "
              "at the end of their timed steps, other programs calling keel::Init when they "
              "exit; under keel launch each rank writes PATH.rankN.");

namespace keel {
namespace profiler {

namespace {

constexpr size_t kMaxEvents = size_t{1} << 22;

struct State {
  std::mutex mu;
  std::vector<Event> events;
  int64_t dropped = 0;
  int next_tid = 0;
  std::vector<std::string> thread_names;  // by tid
  std::atomic<int64_t> clock_offset_ns{0};
};

State& state() {
  static State* s = new State;
  return *s;
}

const std::chrono::steady_clock::time_point& Epoch() {
  static const auto epoch = std::chrono::steady_clock::now();
  return epoch;
}
// The epoch is fixed when the library loads (not at the first span), so a rank's trace times
// count from its own start; fleet::init measures the offset that maps them onto rank 0's.
[[maybe_unused]] const auto& g_epoch_at_load = Epoch();

int ThreadNumber() {
  thread_local int tid = -1;
  if (tid < 0) {
    State& s = state();
    char name[32] = "";
    pthread_getname_np(pthread_self(), name, sizeof(name));
    std::lock_guard<std::mutex> lock(s.mu);
    tid = s.next_tid++;
    s.thread_names.push_back(gettid() == getpid() ? std::string("main") : std::string(name));
  }
  return tid;
}

std::string JsonEscape(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (char c : in) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

namespace internal {

std::atomic<bool> g_enabled{false};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              Epoch())
      .count();
}

void Record(std::string name, const char* category, std::string detail, int64_t start_ns,
            int64_t end_ns) {
  int tid = ThreadNumber();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.events.size() >= kMaxEvents) {
    if (s.dropped++ == 0)
      LOG(WARNING) << "profiler: " << kMaxEvents << " events recorded; dropping the rest";
    return;
  }
  s.events.push_back(
      Event{std::move(name), category, std::move(detail), start_ns, end_ns - start_ns, tid});
}

}  // namespace internal

void Start() {
  Epoch();
  internal::g_enabled.store(true);
}

void Stop() { internal::g_enabled.store(false); }

void Reset() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.events.clear();
  s.dropped = 0;
}

std::vector<Event> Events() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.events;
}

int64_t Dropped() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.dropped;
}

void WriteChromeTrace(const std::string& path, int pid) {
  std::vector<Event> events = Events();
  std::ostringstream out;
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << pid
      << ", \"args\": {\"name\": \"keel rank " << pid << "\"}}";
  int threads;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    threads = state().next_tid;
  }
  for (int t = 0; t < threads; ++t)
    out << ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << t
        << ", \"args\": {\"name\": \"" << JsonEscape(ThreadName(t)) << "\"}}";
  const int64_t offset = ClockOffsetNs();
  char num[64];
  for (const Event& e : events) {
    out << ",\n{\"name\": \"" << JsonEscape(e.name) << "\", \"cat\": \"" << JsonEscape(e.category)
        << "\", \"ph\": \"X\", \"pid\": " << pid << ", \"tid\": " << e.tid;
    std::snprintf(num, sizeof(num), "%.3f", (e.start_ns + offset) / 1e3);
    out << ", \"ts\": " << num;
    std::snprintf(num, sizeof(num), "%.3f", e.dur_ns / 1e3);
    out << ", \"dur\": " << num;
    if (!e.detail.empty()) out << ", \"args\": {\"detail\": \"" << JsonEscape(e.detail) << "\"}";
    out << "}";
  }
  out << "\n]}\n";
  try {
    WriteFileAtomic(path, out.str());
  } catch (const Error& e) {
    KEEL_THROW("profiler: cannot write the trace: ", e.what());
  }
}

std::string Summary() {
  struct Row {
    int64_t calls = 0, total_ns = 0;
  };
  std::map<std::pair<std::string, std::string>, Row> rows;
  int64_t all_ns = 0;
  for (const Event& e : Events()) {
    Row& r = rows[{e.category, e.name}];
    ++r.calls;
    r.total_ns += e.dur_ns;
    all_ns += e.dur_ns;
  }
  std::vector<std::pair<std::pair<std::string, std::string>, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.total_ns > b.second.total_ns; });
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-6s %-28s %9s %12s %11s %7s\n", "kind", "name", "calls",
                "total_ms", "mean_us", "share");
  out << line;
  for (const auto& kv : sorted) {
    const Row& r = kv.second;
    std::snprintf(line, sizeof(line), "%-6s %-28s %9lld %12.3f %11.2f %6.1f%%\n",
                  kv.first.first.c_str(), kv.first.second.c_str(), static_cast<long long>(r.calls),
                  r.total_ns / 1e6, r.total_ns / 1e3 / static_cast<double>(r.calls),
                  all_ns > 0 ? 100.0 * r.total_ns / all_ns : 0.0);
    out << line;
  }
  return out.str();
}

std::string ThreadName(int tid) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (tid < 0 || tid >= static_cast<int>(s.thread_names.size())) return "";
  std::string name = s.thread_names[tid];
  return name.empty() ? "thread " + std::to_string(tid) : name;
}

void SetClockOffsetNs(int64_t offset_ns) { state().clock_offset_ns.store(offset_ns); }

int64_t ClockOffsetNs() { return state().clock_offset_ns.load(); }

std::string ProfilePathForRank(int rank, int nranks) {
  if (FLAGS_profile.empty()) return "";
  return nranks > 1 ? FLAGS_profile + ".rank" + std::to_string(rank) : FLAGS_profile;
}

bool Requested() { return !FLAGS_profile.empty(); }

namespace {
// Refuses --profile before anything runs when the trace could not be written at the end: its
// folder missing or not writable, or the file there but not a writable regular file. (Under
// several workers each writes PATH.rankN beside PATH.)
void CheckProfilePath() {
  const std::string& path = FLAGS_profile;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  struct stat st;
  KEEL_ENFORCE(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "--profile=", path, ": ", dir,
               " is not a directory, so the trace could not be written at the end");
  KEEL_ENFORCE(::access(dir.c_str(), W_OK | X_OK) == 0, "--profile=", path,
               ": cannot create files in ", dir);
  const bool absent = ::stat(path.c_str(), &st) != 0;
  KEEL_ENFORCE(absent || (S_ISREG(st.st_mode) && ::access(path.c_str(), W_OK) == 0),
               "--profile=", path, ": exists and is not a writable file");
}
}  // namespace

bool StartFromFlags() {
  if (FLAGS_profile.empty()) return false;
  CheckProfilePath();
  Reset();
  Start();
  return true;
}

namespace {
std::atomic<int> g_rank{0}, g_nranks{1};
std::atomic<bool> g_finished{false};
std::atomic<bool> g_rank_set{false};

// The first of `names` set to an integer in the environment, else `fallback`.
int EnvInt(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v != nullptr && *v != '\0') return std::atoi(v);
  }
  return fallback;
}

void FinishAtExit() {
  try {
    FinishFromFlags();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profiler: %s\n", e.what());
  }
}
}  // namespace

void SetRank(int rank, int nranks) {
  g_rank = rank;
  g_nranks = nranks;
  g_rank_set = true;
}

void StartFromFlagsUntilExit() {
  static bool armed = false;
  if (FLAGS_profile.empty() || armed) return;
  CheckProfilePath();
  armed = true;
  Start();
  std::atexit(FinishAtExit);
}

void FinishFromFlags() {
  if (FLAGS_profile.empty() || g_finished.exchange(true)) return;
  Stop();
  if (!g_rank_set) {  // a program that never called fleet::init: the launcher's variables
    g_rank = EnvInt({"PADDLE_TRAINER_ID", "RANK"}, 0);
    g_nranks = EnvInt({"PADDLE_TRAINERS_NUM", "WORLD_SIZE"}, 1);
  }
  const std::string path = ProfilePathForRank(g_rank, g_nranks);
  WriteChromeTrace(path, g_rank);
  std::fprintf(stderr, "profile of rank %d: %s\n%s", g_rank.load(), path.c_str(),
               Summary().c_str());
}

void Disarm() {
  Stop();
  g_finished = true;
}

}  // namespace profiler
}  // namespace keel
