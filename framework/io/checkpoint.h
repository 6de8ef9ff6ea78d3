// Programs, checkpoints and inference models on disk: programs as binary ProgramDesc
// (`__model__`), a checkpoint's persistables (and training state) as safetensors, an inference
// model as the pair of both, published together. Every file is written atomically
// (atomic_file.h); loading validates the whole file against the program before it touches the
// scope, so a bad file leaves the scope as it was.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "framework/ir/program.h"
#include "framework/runtime/row_init.h"
#include "framework/runtime/scope.h"

namespace keel {

// ---- programs (binary ProgramDesc)
void SaveProgram(const Program& program, const std::string& path);
// Parses and validates (ValidateProgram: ops, slots, attributes, vars, blocks, shapes).
std::unique_ptr<Program> LoadProgram(const std::string& path);

// ---- persistables stored by rows
// A table that lives only on parameter servers (an is_distributed embedding, and its optimizer
// state of the table's shape) is written by the rows that exist, each created on first touch, and
// the rule every other row starts from. In the file: tensors "NAME@ROWS.ids" (int64 [n], sorted,
// distinct, each in [0, V)) and "NAME@ROWS.values" ([n, ...]: those rows), and metadata
// "keel.rows.NAME" (the rule, RowInitText). Loading it into a program that declares NAME [V, ...]
// (one process) fills the whole tensor: every row by the rule, then the stored rows.
struct StoredRows {
  RowInitRule init;
  std::vector<int64_t> ids;
  Tensor values;
  // Set when read from a file that holds the var whole (a one-process checkpoint): `ids` are then
  // 0..V-1, `values` the tensor, and `init` unknown.
  bool whole = false;
};
using RowsByVar = std::map<std::string, StoredRows>;

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
                       const std::set<std::string>& skip = {}, const RowsByVar& by_rows = {});
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
// `by_rows`: persistables written by rows (not read from the scope); each must be a persistable of
// `program`, its ids sorted, distinct and below the var's first dim, its values [n, ...] of its
// dtype, or nothing is written.
void save_checkpoint(const Scope& scope, const std::string& dirname, const Program& program,
                     const TrainingState& state, const std::set<std::string>& skip = {},
                     const RowsByVar& by_rows = {});
// save_checkpoint keeps the checkpoint it replaces as DIR/persistables.prev.safetensors (a hard
// link when the filesystem has them), so that a damaged latest one does not lose the run.
// load_checkpoint loads the persistables (as load_persistables) and returns the state (the
// executor's overload, executor/executor_io.h, also sets the run count of `program` to
// state.step, so random ops continue with the draws of that step); nullopt when the file has no
// training state. When the latest file is damaged (truncated, checksum mismatch) and the previous
// one is sound, it loads the previous one, saying so on stderr, and renames the damaged one
// "persistables.safetensors.damaged" (so the next save keeps the sound one as previous); when
// both are damaged, the error names the latest.
std::optional<TrainingState> load_checkpoint(Scope& scope, const Place& place,
                                             const std::string& dirname, const Program& program,
                                             const std::set<std::string>& skip = {});
// As load_checkpoint, but each var named in `*rows` (a persistable of `program`, not in `skip`)
// is not put in the scope: it comes back in `*rows` as the file holds it, by rows or whole
// (StoredRows::whole). A parameter server takes its share of a distributed table this way.
std::optional<TrainingState> load_checkpoint(Scope& scope, const Place& place,
                                             const std::string& dirname, const Program& program,
                                             const std::set<std::string>& skip, RowsByVar* rows);
// The training state in DIR's checkpoint without loading its tensors (the previous checkpoint's
// when the latest is damaged, as load_checkpoint); nullopt when DIR has no checkpoint file or the
// file no state. A corrupt file, with no sound previous one, is a keel::Error.
std::optional<TrainingState> ReadTrainingState(const std::string& dirname);
// Whether DIR holds a checkpoint file: the latest, or the previous one alone (the latest set
// aside as damaged).
bool HasCheckpoint(const std::string& dirname);

// A checkpoint file read whole and verified, to be loaded here or sent to a process that cannot
// read it (a rank on another node, whose save_dir is its own).
struct CheckpointFile {
  std::string path;   // the file read: DIR's latest, or its previous one
  std::string bytes;  // the whole file; its checksums were verified
  std::string crc32;  // of the bytes, 8 hex digits: equal files are the same checkpoint
  std::optional<TrainingState> state;
  std::string damaged;  // when `path` is the previous one: why the latest could not be read
};
// DIR's checkpoint as load_checkpoint chooses it (the previous one when the latest is damaged;
// with `set_aside_damaged`, saying so on stderr and renaming the damaged one as load_checkpoint
// does). nullopt when DIR has no checkpoint file; both damaged is a keel::Error naming the latest.
std::optional<CheckpointFile> ReadCheckpointFile(const std::string& dirname,
                                                 bool set_aside_damaged);
// A checkpoint file from `bytes` received from elsewhere (`path` names where they were read):
// verified and described as ReadCheckpointFile does; a damaged one is a keel::Error naming it.
CheckpointFile CheckpointFileFromBytes(std::string bytes, const std::string& path);
// Loads `file` into `scope` as load_checkpoint loads a folder's; errors name file.path.
std::optional<TrainingState> load_checkpoint(Scope& scope, const Place& place,
                                             const CheckpointFile& file, const Program& program,
                                             const std::set<std::string>& skip = {});

// ---- inference models
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
