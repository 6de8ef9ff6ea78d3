#include "trainer/resume.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "fleet/fleet.h"
#include "framework/base/strings.h"
#include "framework/comm/comm_context.h"
#include "framework/comm/store.h"
#include "framework/error.h"

namespace keel {

namespace {

// The file goes over the ring in pieces of this size: a byte-wise max with zeros from every other
// rank is the source's bytes, exactly.
constexpr uint64_t kChunkBytes = uint64_t{16} << 20;

// Each agreement of this process has store keys of its own (several Trainers in one job).
std::atomic<int> agreement_round{0};

// Fields as "<length>:<bytes>", so that any text (a path, an error) travels unchanged.
void PutField(std::string* out, const std::string& field) {
  *out += std::to_string(field.size()) + ":" + field;
}

std::string TakeField(const std::string& in, size_t* pos, const std::string& what) {
  const size_t colon = in.find(':', *pos);
  KEEL_ENFORCE(colon != std::string::npos && colon > *pos && colon - *pos <= 20, what,
               ": malformed report");
  const std::string digits = in.substr(*pos, colon - *pos);
  KEEL_ENFORCE(digits.find_first_not_of("0123456789") == std::string::npos, what,
               ": malformed report");
  const uint64_t n = std::stoull(digits);
  KEEL_ENFORCE(n <= in.size() - colon - 1, what, ": truncated report");
  *pos = colon + 1 + n;
  return in.substr(colon + 1, n);
}

std::string Pack(const RankCheckpoint& c) {
  std::string out;
  for (const std::string& f :
       {c.node, c.dir, std::string(c.has ? "1" : "0"), std::to_string(c.step), c.crc32,
        std::to_string(c.size), c.path, c.error})
    PutField(&out, f);
  return out;
}

RankCheckpoint Unpack(const std::string& in, const std::string& what) {
  RankCheckpoint c;
  size_t pos = 0;
  auto number = [&](const std::string& f) -> uint64_t {
    KEEL_ENFORCE(!f.empty() && f.size() <= 20 && f.find_first_not_of("0123456789") == f.npos, what,
                 ": malformed report");
    return std::stoull(f);
  };
  c.node = TakeField(in, &pos, what);
  c.dir = TakeField(in, &pos, what);
  c.has = TakeField(in, &pos, what) == "1";
  c.step = static_cast<int64_t>(number(TakeField(in, &pos, what)));
  c.crc32 = TakeField(in, &pos, what);
  c.size = number(TakeField(in, &pos, what));
  c.path = TakeField(in, &pos, what);
  c.error = TakeField(in, &pos, what);
  return c;
}

// "node 1 (10.0.0.2)": the node's address as the launcher gave it, else the host name.
std::string ThisNode() {
  const fleet::Role& r = fleet::role();
  std::string host = r.current_endpoint.substr(0, r.current_endpoint.rfind(':'));
  if (host.empty()) {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) == 0) host = name;
  }
  return "node " + std::to_string(r.node_rank()) + " (" + host + ")";
}

std::string Where(const RankCheckpoint& c) {
  if (c.dir.empty()) return "has no checkpoint folder to resume from";
  if (!c.error.empty()) return "cannot read its checkpoint in " + c.dir + ": " + c.error;
  if (!c.has) return "has no checkpoint in " + c.dir;
  return "has step " + std::to_string(c.step) + " in " + c.path;
}

// Every rank's report, through the store.
std::vector<RankCheckpoint> Exchange(const RankCheckpoint& mine, const std::string& prefix) {
  const int rank = fleet::worker_index(), world = fleet::worker_num();
  StoreClient& store = CommContext::Get().store("keel::Trainer: resume agreement");
  store.Set(prefix + std::to_string(rank), Pack(mine));
  std::vector<RankCheckpoint> all(world);
  for (int r = 0; r < world; ++r) {
    if (r == rank) {
      all[r] = mine;
      continue;
    }
    std::string got;
    try {
      got =
          store.GetUnlessPeerGone(prefix + std::to_string(r), CommContext::Get().config().timeout);
    } catch (const Error& e) {
      KEEL_THROW(
          "rank ", rank, " waited for rank ", r,
          " to say which checkpoint it has (every rank agrees on where to resume): ", e.what());
    }
    all[r] = Unpack(got, "the checkpoint report of rank " + std::to_string(r));
  }
  return all;
}

// The source's file to every rank; the receivers get its bytes.
std::string SendFile(int source, const std::string& bytes, uint64_t size, bool receive) {
  const bool sends = fleet::worker_index() == source;
  std::string out;
  if (receive) out.resize(size);
  for (uint64_t off = 0; off < size; off += kChunkBytes) {
    const uint64_t n = std::min(kChunkBytes, size - off);
    Tensor piece(DType::kUInt8, DDim({static_cast<int64_t>(n)}));
    auto* p = piece.data<uint8_t>();
    if (sends)
      std::memcpy(p, bytes.data() + off, n);
    else
      std::memset(p, 0, n);
    fleet::all_reduce(&piece, ReduceOp::kMax);
    if (receive) std::memcpy(out.data() + off, p, n);
  }
  return out;
}

}  // namespace

std::string RankCheckpoint::Describe(int rank) const {
  return "rank " + std::to_string(rank) + " on " + node;
}

ResumePlan PlanResume(const std::vector<RankCheckpoint>& ranks) {
  ResumePlan plan;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    if (ranks[r].has && (plan.source < 0 || ranks[r].step > ranks[plan.source].step))
      plan.source = r;
  if (plan.source < 0) return plan;
  const RankCheckpoint& src = ranks[plan.source];
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    if (!ranks[r].has || ranks[r].crc32 != src.crc32 || ranks[r].size != src.size)
      plan.receivers.push_back(r);
  return plan;
}

AgreedCheckpoint AgreeOnCheckpoint(std::optional<CheckpointFile> local, const std::string& dir,
                                   const std::string& error) {
  const int rank = fleet::worker_index();
  RankCheckpoint mine;
  mine.node = ThisNode();
  mine.dir = dir;
  mine.error = error;
  if (local) {
    mine.has = true;
    mine.step = local->state ? local->state->step : 0;
    mine.crc32 = local->crc32;
    mine.size = local->bytes.size();
    mine.path = local->path;
  }
  AgreedCheckpoint out;
  out.round = agreement_round.fetch_add(1);
  const std::string prefix = "keel/trainer/resume/" + std::to_string(out.round) + "/";
  out.ranks = Exchange(mine, prefix);
  // Rank 0 serves the store: it must not leave (on an error every rank finds in the reports)
  // before every rank has read its report.
  fleet::barrier_worker();
  const ResumePlan plan = PlanResume(out.ranks);
  out.source = plan.source;
  if (plan.source < 0) {
    // Nobody can resume; a damaged checkpoint is an error everywhere, not a silent fresh start.
    for (int r = 0; r < static_cast<int>(out.ranks.size()); ++r)
      KEEL_ENFORCE(out.ranks[r].error.empty(),
                   "no rank has a readable checkpoint to resume from: ", out.ranks[r].Describe(r),
                   " ", Where(out.ranks[r]));
    return out;
  }
  const RankCheckpoint& src = out.ranks[plan.source];
  const std::string from = out.ranks[plan.source].Describe(plan.source) + "'s checkpoint (step " +
                           std::to_string(src.step) + ", " + src.path + ")";
  if (rank == 0) {
    for (int r : plan.receivers)
      std::printf("%s %s: it is sent %s\n", out.ranks[r].Describe(r).c_str(),
                  Where(out.ranks[r]).c_str(), from.c_str());
    std::fflush(stdout);
  }
  const bool receive =
      std::find(plan.receivers.begin(), plan.receivers.end(), rank) != plan.receivers.end();
  if (!plan.receivers.empty()) {
    std::string bytes = SendFile(plan.source, rank == plan.source ? local->bytes : std::string(),
                                 src.size, receive);
    if (receive) {
      // A file that arrives damaged fails this rank's load, and so every rank's, naming it.
      local.reset();
      try {
        CheckpointFile got = CheckpointFileFromBytes(
            std::move(bytes), src.path + " (sent by rank " + std::to_string(plan.source) + ")");
        KEEL_ENFORCE(got.crc32 == src.crc32, "it arrived as ", src.size, " bytes of CRC-32 ",
                     got.crc32, ", not ", src.crc32);
        local = std::move(got);
        std::fprintf(stderr, "%s %s: resuming from %s, received from it\n",
                     mine.Describe(rank).c_str(), Where(mine).c_str(), from.c_str());
      } catch (const Error& e) {
        out.error = "receiving " + from + ": " + e.what();
      }
    }
  }
  out.file = std::move(local);
  out.received = receive;
  return out;
}

void CheckEveryRankResumed(const AgreedCheckpoint& agreed, int64_t loaded_step,
                           const std::string& error) {
  const int rank = fleet::worker_index(), world = fleet::worker_num();
  // Failures first, then the steps: one all-reduce.
  Tensor t(DType::kInt64, DDim({2 * static_cast<int64_t>(world)}));
  int64_t* v = t.data<int64_t>();
  std::fill(v, v + 2 * world, 0);
  v[rank] = error.empty() ? 0 : 1;
  v[world + rank] = loaded_step;
  StoreClient& store = CommContext::Get().store("keel::Trainer: resume agreement");
  const std::string prefix = "keel/trainer/resume-failed/" + std::to_string(agreed.round) + "/";
  if (!error.empty()) store.Set(prefix + std::to_string(rank), error);
  fleet::all_reduce(&t, ReduceOp::kSum);
  auto name = [&](int r) {
    return r < static_cast<int>(agreed.ranks.size()) ? agreed.ranks[r].Describe(r)
                                                     : "rank " + std::to_string(r);
  };
  for (int r = 0; r < world; ++r) {
    if (v[r] == 0) continue;
    std::string why = error;
    if (r != rank) {
      try {
        why = store.Get(prefix + std::to_string(r));
      } catch (const Error& e) {
        why = std::string("(its reason did not arrive: ") + e.what() + ")";
      }
    }
    // Rank 0 serves the store: every rank has read the reason before anyone leaves.
    try {
      fleet::barrier_worker();
    } catch (const Error&) {
      // a rank left already: the error below is the news
    }
    if (r == rank) KEEL_THROW(name(r), " could not resume: ", why);
    KEEL_THROW(name(r), " could not resume, so no rank trains: ", why);
  }
  std::vector<std::string> steps;
  bool same = true;
  for (int r = 0; r < world; ++r) {
    steps.push_back(name(r) + " at step " + std::to_string(v[world + r]));
    same = same && v[world + r] == v[world];
  }
  KEEL_ENFORCE(same, "the ranks resume from different steps: ", StrJoin(steps, ", "));
}

}  // namespace keel
