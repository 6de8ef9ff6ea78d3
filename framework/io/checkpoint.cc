// Programs, checkpoints (persistables) and inference models on disk.
//
// Loading validates the whole file against the program before it touches the scope, so a bad file
// leaves the scope exactly as it was.
#include <glog/logging.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/error.h"
#include "framework/io/io.h"
#include "framework/op/validate_program.h"

namespace keel {
namespace {

const std::map<std::string, std::string> kFormatMetadata = {{"format", "keel"},
                                                            {"keel.version", "1"}};
const std::string kFeedsKey = "keel.feeds";
const std::string kTargetsKey = "keel.targets";

std::string JoinPath(const std::string& dir, const std::string& file) {
  if (dir.empty()) return file;
  return dir.back() == '/' ? dir + file : dir + "/" + file;
}

void MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  KEEL_ENFORCE(!ec, dir, ": cannot create directory: ", ec.message());
  KEEL_ENFORCE(std::filesystem::is_directory(dir, ec), dir, ": exists and is not a directory");
}

std::string Join(const std::vector<std::string>& names, const char* what) {
  std::string s;
  for (const auto& n : names) {
    KEEL_ENFORCE(n.find(',') == std::string::npos, "save_inference_model: ", what, " name '", n,
                 "' contains ',', which the params file uses as separator");
    if (!s.empty()) s += ",";
    s += n;
  }
  return s;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t begin = 0;
  for (;;) {
    size_t comma = s.find(',', begin);
    out.push_back(s.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

std::vector<const VarDesc*> PersistableVars(const Program& program) {
  std::vector<const VarDesc*> vars;
  for (const VarDesc* v : program.global_block().AllVars())
    if (v->persistable()) vars.push_back(v);
  return vars;
}

// The persistables of `program` as CPU tensors (sharing memory when already on CPU). A var missing
// or uninitialized in `scope` is an error listing every such var.
NamedTensors CollectPersistables(const Scope& scope, const Program& program, const char* caller) {
  NamedTensors tensors;
  std::string missing;
  for (const VarDesc* v : PersistableVars(program)) {
    const Variable* var = scope.FindVar(v->name());
    if (var == nullptr || !var->tensor().initialized()) {
      missing += (missing.empty() ? "" : ", ") + v->name() +
                 (var == nullptr ? " (not in scope)" : " (uninitialized)");
      continue;
    }
    const Tensor& t = var->tensor();
    tensors.emplace_back(v->name(), t.place().is_cpu() ? t : t.Clone(CPUPlace()));
  }
  KEEL_ENFORCE(missing.empty(), caller, ": persistable vars missing from the scope: ", missing,
               "; nothing was written");
  return tensors;
}

// A declared dim of -1 (unknown) matches any size.
bool ShapeMatches(const std::vector<int64_t>& declared, const DDim& actual) {
  if (static_cast<int>(declared.size()) != actual.size()) return false;
  for (size_t i = 0; i < declared.size(); ++i)
    if (declared[i] >= 0 && declared[i] != actual[static_cast<int>(i)]) return false;
  return true;
}

// Checks `loaded` (read from `path`) against the persistables of `program`, then (and only then)
// stores them in `scope`, on `place` when given.
void ValidateAndAssign(Scope& scope, const Place* place, NamedTensors loaded,
                       const std::string& path, const Program& program, const char* caller) {
  std::map<std::string, Tensor*> by_name;
  for (auto& nt : loaded) by_name[nt.first] = &nt.second;

  std::vector<std::pair<std::string, Tensor*>> plan;
  std::set<std::string> declared;
  for (const VarDesc* v : PersistableVars(program)) {
    declared.insert(v->name());
    auto it = by_name.find(v->name());
    KEEL_ENFORCE(it != by_name.end(), caller, ": persistable var '", v->name(), "' is not in ",
                 path);
    const Tensor& t = *it->second;
    KEEL_ENFORCE(t.dtype() == v->dtype(), caller, ": var '", v->name(), "' in ", path, " is ",
                 DTypeName(t.dtype()), ", the program declares ", DTypeName(v->dtype()));
    KEEL_ENFORCE(ShapeMatches(v->shape(), t.dims()), caller, ": var '", v->name(), "' in ", path,
                 " has shape ", t.dims().str(), ", the program declares ", v->dims().str());
    plan.emplace_back(v->name(), it->second);
  }
  for (const auto& nt : loaded)
    if (!declared.count(nt.first))
      LOG(WARNING) << caller << ": " << path << " holds '" << nt.first
                   << "', which the program does not declare persistable; ignored";

  for (auto& [name, src] : plan) {
    Tensor* dst = scope.Var(name)->mutable_tensor();
    Place want = place ? *place : (dst->initialized() ? dst->place() : CPUPlace());
    if (dst->initialized() && dst->dtype() == src->dtype() && dst->dims() == src->dims() &&
        dst->place() == want) {
      dst->CopyFrom(*src);  // in place: views into a fused buffer keep seeing the values
    } else if (!want.is_cpu()) {
      *dst = src->Clone(want);
    } else {
      *dst = std::move(*src);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- programs

void SaveProgram(const Program& program, const std::string& path) {
  WriteFileAtomic(path, program.SerializeToString());
}

std::unique_ptr<Program> LoadProgram(const std::string& path) {
  std::unique_ptr<Program> program = Program::ParseFromString(ReadFile(path), path);
  ValidateProgram(*program, path);
  return program;
}

// ---------------------------------------------------------------- checkpoints

void save_persistables(const Scope& scope, const std::string& dirname, const Program& program) {
  NamedTensors tensors = CollectPersistables(scope, program, "save_persistables");
  MakeDirs(dirname);
  SaveSafetensors(JoinPath(dirname, kPersistablesFile), tensors, kFormatMetadata);
}

void save_persistables(Executor& exe, const std::string& dirname, const Program& program) {
  save_persistables(exe.scope(), dirname, program);
}

void load_persistables(Scope& scope, const std::string& dirname, const Program& program) {
  const std::string path = JoinPath(dirname, kPersistablesFile);
  ValidateAndAssign(scope, nullptr, LoadSafetensors(path), path, program, "load_persistables");
}

void load_persistables(Executor& exe, const std::string& dirname, const Program& program) {
  const std::string path = JoinPath(dirname, kPersistablesFile);
  ValidateAndAssign(exe.scope(), &exe.place(), LoadSafetensors(path), path, program,
                    "load_persistables");
}

// ---------------------------------------------------------------- inference models

void save_inference_model(const std::string& dirname, const std::vector<std::string>& feeds,
                          const std::vector<std::string>& targets, Executor& exe,
                          const Program& program) {
  std::map<std::string, std::string> metadata = kFormatMetadata;
  metadata[kFeedsKey] = Join(feeds, "feed");
  metadata[kTargetsKey] = Join(targets, "target");
  std::unique_ptr<Program> pruned;
  try {
    pruned = PruneForInference(program, feeds, targets);
  } catch (const Error& e) {
    KEEL_THROW("save_inference_model to ", dirname, ": ", e.what(), "; nothing was written");
  }
  NamedTensors params = CollectPersistables(exe.scope(), *pruned, "save_inference_model");
  MakeDirs(dirname);
  SaveProgram(*pruned, JoinPath(dirname, kModelFile));
  SaveSafetensors(JoinPath(dirname, kParamsFile), params, metadata);
}

InferenceModel load_inference_model(const std::string& dirname, Executor& exe) {
  InferenceModel model;
  model.program = LoadProgram(JoinPath(dirname, kModelFile));
  const std::string params_path = JoinPath(dirname, kParamsFile);
  std::map<std::string, std::string> metadata;
  NamedTensors params = LoadSafetensors(params_path, &metadata);
  for (const std::string* key : {&kFeedsKey, &kTargetsKey})
    KEEL_ENFORCE(metadata.count(*key), params_path, ": no \"", *key,
                 "\" in __metadata__ (not written by save_inference_model?)");
  model.feeds = Split(metadata[kFeedsKey]);
  model.targets = Split(metadata[kTargetsKey]);
  for (const auto* names : {&model.feeds, &model.targets})
    for (const auto& n : *names)
      KEEL_ENFORCE(model.program->global_block().HasVar(n), params_path, ": feed/target var '", n,
                   "' is not defined in ", JoinPath(dirname, kModelFile));
  ValidateAndAssign(exe.scope(), &exe.place(), std::move(params), params_path, *model.program,
                    "load_inference_model");
  return model;
}

}  // namespace keel
