// Where the ranks of a job resume when their checkpoint folders are their own (a save_dir on each
// node's disk, not shared): each rank reads its folder, the ranks tell each other what they found
// through the store, and all of them resume from the newest checkpoint any of them can read. A
// rank that lacks it (no checkpoint, an older one, the previous one because its latest is
// damaged) is sent the file over the job's collectives, so every rank loads the same bytes, as if
// the folder were shared, and the run continues as an uninterrupted one would.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "framework/io/checkpoint.h"

namespace keel {

// What one rank found in its folder, as every rank is told.
struct RankCheckpoint {
  std::string node;   // "node 1 (10.0.0.2)"
  std::string dir;    // the folder it looked in ("": none)
  bool has = false;   // a readable checkpoint file there
  int64_t step = 0;   // the file's training step (0 when it has no training state)
  std::string crc32;  // of the file: equal files are the same checkpoint
  uint64_t size = 0;  // bytes
  std::string path;   // the file (the previous one when the latest is damaged)
  std::string error;  // why the folder's checkpoint could not be read (both files damaged)
  std::string Describe(int rank) const;  // "rank 1 on node 1 (10.0.0.2)"
};

// What every rank decides alike from every rank's report.
struct ResumePlan {
  int source = -1;             // the rank whose checkpoint the job resumes from; -1: none has one
  std::vector<int> receivers;  // the ranks whose own file is not that one: it is sent to them
};
// The newest readable checkpoint: the highest step, of equal steps the lowest rank's.
ResumePlan PlanResume(const std::vector<RankCheckpoint>& ranks);

// The outcome for this rank.
struct AgreedCheckpoint {
  std::optional<CheckpointFile> file;  // what this rank loads; nullopt: no rank has one
  bool received = false;               // the file was sent here by `source`
  int source = -1;
  std::vector<RankCheckpoint> ranks;  // every rank's report, by rank
  int round = 0;                      // which agreement of this process (its store keys)
  std::string error;                  // the file sent here could not be used: why
};

// The agreement, for a job of several ranks (every rank calls it at the same point between
// collectives). `local` is what this rank read in `dir` (nullopt with `error` when the folder's
// checkpoint could not be read). A keel::Error, on every rank, when no rank has a readable
// checkpoint but some rank's is damaged (naming that rank, its node and the file). Rank 0 reports
// on stdout which ranks receive the checkpoint; a receiving rank says so on stderr.
AgreedCheckpoint AgreeOnCheckpoint(std::optional<CheckpointFile> local, const std::string& dir,
                                   const std::string& error);

// After every rank tried to load the agreed checkpoint (`loaded_step`, or `error` when it could
// not): a keel::Error on every rank when any failed (naming it, its node and its reason) or the
// ranks stand at different steps, so no rank starts a step the others will not join.
void CheckEveryRankResumed(const AgreedCheckpoint& agreed, int64_t loaded_step,
                           const std::string& error);

}  // namespace keel
