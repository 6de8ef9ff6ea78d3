// The collective watch's posts and its report (collective_watch.h): what each rank waits in, as
// stored, and the conclusion that ranks are in calls that cannot complete together.
#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "framework/base/strings.h"
#include "framework/comm/collective_watch.h"
#include "framework/error.h"

namespace keel {

namespace {

thread_local const CollectiveCall* g_current_call = nullptr;

// Fields are tab-separated, posts newline-separated.
std::string Field(std::string s) {
  std::replace(s.begin(), s.end(), '\t', ' ');
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

const PostedWait* FleetCallOf(const RankPost& p) {
  for (const PostedWait& w : p.waits)
    if (w.exclusive) return &w;
  return nullptr;
}

constexpr char kExited[] = "exited";

// Whether `left` (exited) made call `w` before it exited: then `w` completes (its post is about
// to go).
bool Joined(const RankPost& left, const PostedWait& w) {
  auto it = left.last_seq.find(w.channel);
  return it != left.last_seq.end() && w.seq <= it->second;
}

// Whether ranks a and b wait in collectives that cannot complete together.
bool CannotMeet(const RankPost& a, const RankPost& b) {
  if (a.exited || b.exited) {
    if (a.exited && b.exited) return false;
    const RankPost& left = a.exited ? a : b;
    for (const PostedWait& w : (a.exited ? b : a).waits)
      if (!Joined(left, w)) return true;
    return false;
  }
  if (a.waits.empty() || b.waits.empty()) return false;  // a rank busy elsewhere may yet come
  const PostedWait* fa = FleetCallOf(a);
  const PostedWait* fb = FleetCallOf(b);
  // Fleet calls are made in order by the thread that also runs the programs: two different ones
  // never meet, and a rank in one runs no program until it returns.
  if (fa && fb && (fa->seq != fb->seq || fa->name != fb->name)) return true;
  if ((fa != nullptr) != (fb != nullptr)) return true;
  for (const PostedWait& wa : a.waits)
    for (const PostedWait& wb : b.waits)
      if (!wa.exclusive && !wb.exclusive && wa.channel == wb.channel &&
          (wa.seq != wb.seq || wa.name != wb.name))
        return true;
  return false;
}

std::string Named(const PostedWait& w) {
  return w.detail.empty() ? w.name : w.name + " " + w.detail;
}

std::string OnChannel(const PostedWait& w) {
  return w.seq == 0 ? "setting up " + w.where : StrCat(w.where, ", collective #", w.seq);
}

// "fleet::metrics::sum (fleet call #4; on fleet's eager ring, collective #2)" or
// "op c_allreduce_sum of x@GRAD in run 6 of its program (ring 0, collective #14)".
std::string Describe(const RankPost& p) {
  if (p.exited) {
    auto fleet = p.last_seq.find("fleet");
    return StrCat("exited",
                  fleet != p.last_seq.end() && fleet->second > 0
                      ? StrCat(" after fleet call #", fleet->second)
                      : std::string(),
                  " (its program returned or called exit)");
  }
  if (p.waits.empty()) return "in no collective for as long (busy elsewhere, or stopped)";
  std::vector<std::string> parts;
  const PostedWait* fleet = FleetCallOf(p);
  std::vector<const PostedWait*> rest;
  for (const PostedWait& w : p.waits)
    if (!w.exclusive) rest.push_back(&w);
  if (fleet) {
    std::string s = Named(*fleet) + " (fleet call #" + std::to_string(fleet->seq);
    for (auto it = rest.begin(); it != rest.end();) {
      if ((*it)->name != fleet->name) {
        ++it;
        continue;
      }
      s += (*it)->seq == 0 ? "; " + OnChannel(**it) : "; on " + OnChannel(**it);
      it = rest.erase(it);
    }
    parts.push_back(s + ")");
  }
  for (const PostedWait* w : rest) parts.push_back(Named(*w) + " (" + OnChannel(*w) + ")");
  return StrJoin(parts, ", and ");
}

}  // namespace

const CollectiveCall* CollectiveCall::Current() { return g_current_call; }

CollectiveCall::Scope::Scope(const CollectiveCall* call) : prev_(g_current_call) {
  g_current_call = call;
}

CollectiveCall::Scope::~Scope() { g_current_call = prev_; }

std::string EncodePost(const RankPost& post) {
  if (post.exited) {
    std::string out = std::string(kExited) + "\n";
    for (const auto& [channel, seq] : post.last_seq) out += StrCat(Field(channel), '\t', seq, '\n');
    return out;
  }
  std::string out;
  for (const PostedWait& w : post.waits)
    out += StrCat(Field(w.channel), '\t', Field(w.where), '\t', w.seq, '\t', w.exclusive ? 1 : 0,
                  '\t', Field(w.name), '\t', Field(w.detail), '\n');
  return out;
}

RankPost DecodePost(int rank, const std::string& text) {
  RankPost post;
  post.rank = rank;
  std::istringstream lines(text);
  std::string line;
  const std::string exited = std::string(kExited) + "\n";
  if (text.compare(0, exited.size(), exited) == 0) {
    post.exited = true;
    std::getline(lines, line);
    while (std::getline(lines, line)) {
      std::vector<std::string> f = StrSplit(line, '\t');
      if (f.size() == 2) post.last_seq[f[0]] = std::strtoull(f[1].c_str(), nullptr, 10);
    }
    return post;
  }
  std::vector<PostedWait>& waits = post.waits;
  while (std::getline(lines, line)) {
    std::vector<std::string> f = StrSplit(line, '\t');
    if (f.size() != 6) continue;  // not a post this version wrote
    PostedWait w;
    w.channel = f[0];
    w.where = f[1];
    w.seq = std::strtoull(f[2].c_str(), nullptr, 10);
    w.exclusive = f[3] == "1";
    w.name = f[4];
    w.detail = f[5];
    waits.push_back(std::move(w));
  }
  return post;
}

std::string CollectiveMismatchReport(const std::vector<RankPost>& posts) {
  const RankPost* a = nullptr;
  const RankPost* b = nullptr;
  for (size_t i = 0; i < posts.size() && a == nullptr; ++i)
    for (size_t j = i + 1; j < posts.size(); ++j)
      if (CannotMeet(posts[i], posts[j])) {
        a = &posts[i];
        b = &posts[j];
        break;
      }
  if (a == nullptr) return "";
  if (b->exited) std::swap(a, b);
  constexpr size_t kShown = 16;
  std::string report = a->exited
                           ? StrCat("collective mismatch: rank ", a->rank, " exited while rank ",
                                    b->rank, " waits in a collective call it would have to join:")
                           : StrCat("collective mismatch: ranks ", a->rank, " and ", b->rank,
                                    " wait in collective calls that cannot complete together:");
  for (size_t i = 0; i < posts.size() && i < kShown; ++i)
    report += StrCat("\n  rank ", posts[i].rank, ": ", Describe(posts[i]));
  if (posts.size() > kShown) report += StrCat("\n  (", posts.size() - kShown, " more ranks)");
  report +=
      "\nEvery rank must make the same collective calls in the same order; a collective that "
      "only some ranks reach (a metric inside `if (fleet::is_first_worker())`, a training step "
      "one rank skips) waits for the others forever.";
  return report;
}

}  // namespace keel
