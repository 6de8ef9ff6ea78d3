// Files: tensors and checkpoints as safetensors, programs as binary ProgramDesc (`__model__`).
// Every write goes to a temp file in the same directory, is fsync'ed and renamed into place, so a
// reader sees the old file or the new one, never half of one. Readers check every size and offset
// against the file before trusting it; a bad file is a keel::Error naming the file.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/ir/program.h"
#include "framework/runtime/scope.h"
#include "framework/runtime/tensor.h"

namespace keel {

class Executor;

// ---- atomic files
// Writes `bytes` to `path` atomically (temp file, fsync, rename, fsync of the directory).
void WriteFileAtomic(const std::string& path, const std::string& bytes);
std::string ReadFile(const std::string& path);

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
inline const std::string kModelFile = "__model__";
inline const std::string kParamsFile = "params.safetensors";

// Writes every persistable var of `program` found in `scope` to DIR/persistables.safetensors
// (creating DIR). Vars the scope lacks are an error naming them; nothing is written then.
void save_persistables(const Scope& scope, const std::string& dirname, const Program& program);
void save_persistables(Executor& exe, const std::string& dirname, const Program& program);
// Loads them back into `scope`; each must be declared persistable in `program` with the same
// dtype and shape (a keel::Error names the var, file and both shapes otherwise).
void load_persistables(Scope& scope, const std::string& dirname, const Program& program);
void load_persistables(Executor& exe, const std::string& dirname, const Program& program);

// Keeps only the ops of block 0 needed to compute `targets` from `feeds`, drops backward and
// optimizer ops and unused vars.
std::unique_ptr<Program> PruneForInference(const Program& program,
                                           const std::vector<std::string>& feeds,
                                           const std::vector<std::string>& targets);

// Writes DIR/__model__ (the pruned program, with feed/fetch names recorded) and
// DIR/params.safetensors (the persistables that program uses).
void save_inference_model(const std::string& dirname, const std::vector<std::string>& feeds,
                          const std::vector<std::string>& targets, Executor& exe,
                          const Program& program);

struct InferenceModel {
  std::unique_ptr<Program> program;
  std::vector<std::string> feeds, targets;
};
// Reads DIR/__model__ and loads DIR/params.safetensors into exe's scope.
InferenceModel load_inference_model(const std::string& dirname, Executor& exe);

}  // namespace keel
