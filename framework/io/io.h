// Files: tensors and checkpoints as safetensors, programs as binary ProgramDesc (`__model__`).
// Every write goes to a temp file in the same directory, is fsync'ed and renamed into place, so a
// reader sees the old file or the new one, never half of one. Readers check every size and offset
// against the file before trusting it; a bad file is a keel::Error naming the file.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "framework/ir/program.h"
#include "framework/runtime/scope.h"
#include "framework/runtime/tensor.h"

namespace keel {


// ---- atomic files
// Writes `bytes` to `path` atomically (unnamed temp file, fsync, link, rename, fsync of the
// directory); removes the temps of `path` that dead writers on this host left. A file size limit
// (ulimit -f) or a full disk is a keel::Error naming the file, never a SIGXFSZ.
void WriteFileAtomic(const std::string& path, const std::string& bytes);
// Reads the whole file, at most `max_bytes` of it (0: no limit but the file's size), and at most
// 64 MiB of anything but a regular file (a device or a pipe, which has no size); a file that
// holds more is a keel::Error naming it and the limit, read no further.
std::string ReadFile(const std::string& path, size_t max_bytes = 0);
// Makes SIGXFSZ ignored if it has its default action, so that a write past the file size limit
// (ulimit -f) fails with EFBIG instead of killing the process; checked on every write (the
// program may have reset it since).
void IgnoreSigxfsz();
// " (the file size limit, ulimit -f, is N bytes)", or "" without a limit: for EFBIG messages.
std::string FileSizeLimitText();
// fsync of directory `dir`; `what` names the file whose entry it makes durable in errors.
void SyncDirectory(const std::string& dir, const std::string& what);
// ".<base>.tmp.<random>.<pid>@<host>": a temp name beside `base` that says who wrote it.
std::string TempNameFor(const std::string& base);
// Whether `name` starts with `prefix` (".<base>.tmp.") and was made by a dead process of this host.
bool IsStaleTempOf(const std::string& name, const std::string& prefix);
// Removes the entries of `dir` (files or directories) that IsStaleTempOf(prefix); returns how many.
int RemoveStaleTemps(const std::string& dir, const std::string& prefix);
// Before training: creates `dir`, writes and removes a probe file there, and checks that a file
// of `bytes` bytes fits the file size limit (warns when the disk has less free space). A
// keel::Error names `what` (the flag, e.g. "--save_dir") and the reason.
void CheckCanWrite(const std::string& dir, uint64_t bytes, const std::string& what);

// ---- safetensors (https://github.com/huggingface/safetensors format: u64 LE header length,
// JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, raw LE data)
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
std::string EncodeSafetensors(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {});
// `what` names the source in errors (usually the file path).
NamedTensors DecodeSafetensors(const std::string& bytes, const std::string& what,
                               std::map<std::string, std::string>* metadata = nullptr);
void SaveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata = {});
NamedTensors LoadSafetensors(const std::string& path,
                             std::map<std::string, std::string>* metadata = nullptr);

// ---- programs
void SaveProgram(const Program& program, const std::string& path);
// Parses and validates (ValidateProgram: ops, slots, attributes, vars, blocks, shapes).
std::unique_ptr<Program> LoadProgram(const std::string& path);

// ---- checkpoints
// File name of the persistables inside a checkpoint directory.
inline const std::string kPersistablesFile = "persistables.safetensors";
// The checkpoint before the latest, kept by save_checkpoint for load_checkpoint to fall back to.
inline const std::string kPreviousPersistablesFile = "persistables.prev.safetensors";
inline const std::string kModelFile = "__model__";
inline const std::string kParamsFile = "params.safetensors";

// Writes every persistable var of `program` found in `scope`, but those named in `skip`, to
// DIR/persistables.safetensors (creating DIR). Vars the scope lacks are an error naming them;
// nothing is written then.
void save_persistables(const Scope& scope, const std::string& dirname, const Program& program,
                       const std::set<std::string>& skip = {});
// Loads them back into `scope`; each persistable of `program` but those in `skip` must be in the
// file with the same dtype and shape (a keel::Error names the var, file and both shapes
// otherwise). Vars in `skip` are neither required nor read. With `place`, each tensor is put
// there (a CUDA place: copied to the device); without, it stays in host memory.
void load_persistables(Scope& scope, const std::string& dirname, const Program& program,
                       const std::set<std::string>& skip = {});
void load_persistables(Scope& scope, const Place& place, const std::string& dirname,
                       const Program& program, const std::set<std::string>& skip = {});

// ---- training checkpoints: the persistables plus where training stands, in one file
// (DIR/persistables.safetensors, its "keel.train.*" metadata), so a checkpoint is written and
// replaced atomically as a whole and a resumed run continues exactly where the saved one was.
struct TrainingState {
  int64_t step = 0;    // training steps completed
  uint64_t seed = 0;   // the seed of initialization, data order and dropout (0: none recorded)
  int world_size = 1;  // ranks that trained it (data shards depend on it)
  std::map<std::string, std::string> extra;  // further entries, stored as keel.train.<key>
};
void save_checkpoint(const Scope& scope, const std::string& dirname, const Program& program,
                     const TrainingState& state, const std::set<std::string>& skip = {});
// save_checkpoint keeps the checkpoint it replaces as DIR/persistables.prev.safetensors (a hard
// link when the filesystem has them), so that a damaged latest one does not lose the run.
// load_checkpoint loads the persistables (as load_persistables) and returns the state (the
// executor's overload, executor/executor_io.h, also sets the run count of `program` to
// state.step, so random ops continue with the draws of that step); nullopt when the file has no
// training state. When the latest file is damaged (truncated, checksum mismatch) and the previous one is
// sound, it loads the previous one, saying so on stderr, and renames the damaged one
// "persistables.safetensors.damaged" (so the next save keeps the sound one as previous); when
// both are damaged, the error names the latest.
std::optional<TrainingState> load_checkpoint(Scope& scope, const Place& place,
                                             const std::string& dirname, const Program& program,
                                             const std::set<std::string>& skip = {});
// The training state in DIR's checkpoint without loading its tensors (the previous checkpoint's
// when the latest is damaged, as load_checkpoint); nullopt when DIR has no checkpoint file or the
// file no state. A corrupt file, with no sound previous one, is a keel::Error.
std::optional<TrainingState> ReadTrainingState(const std::string& dirname);
// Whether DIR holds a checkpoint file: the latest, or the previous one alone (the latest set
// aside as damaged).
bool HasCheckpoint(const std::string& dirname);

// Keeps only the ops of block 0 needed to compute `targets` from `feeds`, drops backward and
// optimizer ops and unused vars.
std::unique_ptr<Program> PruneForInference(const Program& program,
                                           const std::vector<std::string>& feeds,
                                           const std::vector<std::string>& targets);

// Writes DIR/__model__ (the pruned program, with feed/fetch names recorded) and
// DIR/params.safetensors (the persistables that program uses), published as a pair: both are
// written to a staging directory DIR/.staging.*, then a marker DIR/.publishing naming it is
// written atomically (the commit point), then both are renamed into DIR and the marker removed.
// A reader that finds the marker takes each file from the staging directory while it is still
// there, so a writer killed anywhere leaves the old pair or the new one, never a mix. The params
// file records a checksum of __model__, and the loader refuses a pair that does not match.
void save_inference_model(const std::string& dirname, const std::vector<std::string>& feeds,
                          const std::vector<std::string>& targets, const Scope& scope,
                          const Program& program);

struct InferenceModel {
  std::unique_ptr<Program> program;
  std::vector<std::string> feeds, targets;
};
// Reads DIR/__model__ and loads DIR/params.safetensors into `scope`, on `place`.
InferenceModel load_inference_model(const std::string& dirname, Scope& scope, const Place& place);

}  // namespace keel
