// Programs, checkpoints (persistables) and inference models on disk.
//
// Loading validates the whole file against the program before it touches the scope, so a bad file
// leaves the scope exactly as it was.
#include "framework/io/checkpoint.h"

#include <glog/logging.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "framework/base/strings.h"
#include "framework/error.h"
#include "framework/fault_point.h"
#include "framework/io/atomic_file.h"
#include "framework/io/prune.h"
#include "framework/io/safetensors.h"
#include "framework/op/validate_program.h"

namespace keel {
namespace {

// keel.version 2: the header checksum (keel.header_crc32) is required, as the data one is.
const std::map<std::string, std::string> kFormatMetadata = {{"format", "keel"},
                                                            {"keel.version", "2"}};
const std::string kFeedsKey = "keel.feeds";
const std::string kTargetsKey = "keel.targets";
const std::string kModelChecksumKey = "keel.model_crc32";
const std::string kTrainPrefix = "keel.train.";
const std::string kRowsPrefix = "keel.rows.";
const std::string kRowIdsSuffix = "@ROWS.ids";
const std::string kRowValuesSuffix = "@ROWS.values";
const std::string kPublishMarker = ".publishing";
const std::string kStagingPrefix = ".staging.";

std::string Crc32Hex(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t off = 0;
  while (off < bytes.size()) {  // zlib takes uInt lengths
    uInt n = static_cast<uInt>(std::min<size_t>(bytes.size() - off, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + off), n);
    off += n;
  }
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08lx", static_cast<unsigned long>(crc));
  return hex;
}

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

// Feed or target names as the params file records them: comma-separated ("" for none).
std::string JoinNames(const std::vector<std::string>& names, const char* what) {
  for (const auto& n : names)
    KEEL_ENFORCE(n.find(',') == std::string::npos, "save_inference_model: ", what, " name '", n,
                 "' contains ',', which the params file uses as separator");
  return StrJoin(names, ",");
}

std::vector<std::string> SplitNames(const std::string& s) {
  return s.empty() ? std::vector<std::string>{} : StrSplit(s, ',');
}

std::vector<const VarDesc*> PersistableVars(const Program& program,
                                            const std::set<std::string>& skip = {}) {
  std::vector<const VarDesc*> vars;
  for (const VarDesc* v : program.global_block().AllVars())
    if (v->persistable() && !skip.count(v->name())) vars.push_back(v);
  return vars;
}

// The persistables of `program` as CPU tensors (sharing memory when already on CPU). A var missing
// or uninitialized in `scope` is an error listing every such var.
NamedTensors CollectPersistables(const Scope& scope, const Program& program, const char* caller,
                                 const std::set<std::string>& skip = {}) {
  NamedTensors tensors;
  std::string missing;
  for (const VarDesc* v : PersistableVars(program, skip)) {
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

// The ids of stored rows, checked: sorted, distinct, each in [0, height).
void CheckRowIds(const std::vector<int64_t>& ids, int64_t height, const std::string& what) {
  for (size_t k = 0; k < ids.size(); ++k)
    KEEL_ENFORCE(ids[k] >= 0 && ids[k] < height && (k == 0 || ids[k - 1] < ids[k]), what,
                 ": stored row ids must be sorted, distinct and in [0, ", height, "); entry ", k,
                 " is ", ids[k]);
}

// `name`'s rows as the file holds them (tensors NAME@ROWS.*, metadata keel.rows.NAME), checked
// against `v`; nullopt when the file does not hold it by rows.
std::optional<StoredRows> FindStoredRows(const std::map<std::string, Tensor*>& by_name,
                                         const std::map<std::string, std::string>& metadata,
                                         const VarDesc& v, const std::string& path,
                                         const char* caller) {
  auto rule = metadata.find(kRowsPrefix + v.name());
  if (rule == metadata.end()) return std::nullopt;
  const std::string what = StrCat(caller, ": var '", v.name(), "' stored by rows in ", path);
  auto ids = by_name.find(v.name() + kRowIdsSuffix);
  auto values = by_name.find(v.name() + kRowValuesSuffix);
  KEEL_ENFORCE(ids != by_name.end() && values != by_name.end(), what, ": the file lacks ", v.name(),
               kRowIdsSuffix, " or ", v.name(), kRowValuesSuffix);
  StoredRows r;
  r.init = ParseRowInit(rule->second, what);
  const Tensor& it = *ids->second;
  const Tensor& vt = *values->second;
  KEEL_ENFORCE(it.dtype() == DType::kInt64 && it.dims().size() == 1, what, ": its ids are ",
               DTypeName(it.dtype()), " ", it.dims().str(), ", not int64 [n]");
  const std::vector<int64_t>& shape = v.shape();
  KEEL_ENFORCE(
      !shape.empty() && std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d >= 0; }),
      what, ": the program declares it ", v.dims().str(),
      ", and rows fill only a var of known dims");
  DDim want(shape);
  want[0] = it.numel();
  KEEL_ENFORCE(vt.dtype() == v.dtype() && vt.dims() == want, what, ": its values are ",
               DTypeName(vt.dtype()), " ", vt.dims().str(), ", the program wants ",
               DTypeName(v.dtype()), " ", want.str());
  r.ids.assign(it.data<int64_t>(), it.data<int64_t>() + it.numel());
  CheckRowIds(r.ids, shape[0], what);
  r.values = vt;
  return r;
}

// The whole tensor of dims `dims` (a float type) the rows stand for.
Tensor ExpandRows(const StoredRows& r, const DDim& dims, DType dtype, const std::string& what) {
  Tensor t;
  const int64_t height = dims[0], width = height == 0 ? 0 : dims.numel() / height;
  char* out = static_cast<char*>(t.Alloc(dtype, dims));
  const size_t row_bytes = SizeOf(dtype) * static_cast<size_t>(width);
  for (int64_t i = 0; i < height; ++i) {
    if (dtype == DType::kFloat32) {
      RowInit(r.init, i, width, reinterpret_cast<float*>(out) + i * width);
    } else {
      KEEL_ENFORCE(dtype == DType::kFloat64, what, ": rows of ", DTypeName(dtype),
                   " cannot be filled by a row initializer (float32 or float64 only)");
      RowInit(r.init, i, width, reinterpret_cast<double*>(out) + i * width);
    }
  }
  const char* src = static_cast<const char*>(r.values.raw_data());
  for (size_t k = 0; k < r.ids.size(); ++k)
    std::memcpy(out + r.ids[k] * row_bytes, src + k * row_bytes, row_bytes);
  return t;
}

// Checks `loaded` (read from `path`, with its `metadata`) against the persistables of `program`,
// then (and only then) stores them in `scope`, on `place` when given. A var the file holds by
// rows is filled whole; the vars named in `*as_rows` come back there instead.
void ValidateAndAssign(Scope& scope, const Place* place, NamedTensors loaded,
                       const std::map<std::string, std::string>& metadata, const std::string& path,
                       const Program& program, const char* caller,
                       const std::set<std::string>& skip = {}, RowsByVar* as_rows = nullptr) {
  std::map<std::string, Tensor*> by_name;
  for (auto& nt : loaded) by_name[nt.first] = &nt.second;

  std::vector<std::pair<std::string, Tensor*>> plan;
  std::vector<Tensor> expanded;
  expanded.reserve(PersistableVars(program, skip).size());
  RowsByVar rows_out;
  std::set<std::string> declared = skip;
  for (const VarDesc* v : PersistableVars(program, skip)) {
    declared.insert(v->name());
    declared.insert(v->name() + kRowIdsSuffix);
    declared.insert(v->name() + kRowValuesSuffix);
    const bool want_rows = as_rows != nullptr && as_rows->count(v->name());
    auto it = by_name.find(v->name());
    if (it == by_name.end()) {
      std::optional<StoredRows> r = FindStoredRows(by_name, metadata, *v, path, caller);
      KEEL_ENFORCE(r.has_value(), caller, ": persistable var '", v->name(), "' is not in ", path);
      if (want_rows) {
        rows_out[v->name()] = std::move(*r);
        continue;
      }
      expanded.push_back(ExpandRows(*r, v->dims(), v->dtype(), StrCat(caller, ": ", v->name())));
      plan.emplace_back(v->name(), &expanded.back());
      continue;
    }
    const Tensor& t = *it->second;
    KEEL_ENFORCE(t.dtype() == v->dtype(), caller, ": var '", v->name(), "' in ", path, " is ",
                 DTypeName(t.dtype()), ", the program declares ", DTypeName(v->dtype()));
    KEEL_ENFORCE(ShapeMatches(v->shape(), t.dims()), caller, ": var '", v->name(), "' in ", path,
                 " has shape ", t.dims().str(), ", the program declares ", v->dims().str());
    if (want_rows) {
      StoredRows r;
      r.whole = true;
      r.values = t;
      const int64_t height = t.dims().size() == 0 ? 1 : t.dims()[0];
      r.ids.resize(static_cast<size_t>(height));
      for (int64_t i = 0; i < height; ++i) r.ids[i] = i;
      rows_out[v->name()] = std::move(r);
      continue;
    }
    plan.emplace_back(v->name(), it->second);
  }
  if (as_rows != nullptr)
    for (const auto& [name, unused] : *as_rows)
      KEEL_ENFORCE(rows_out.count(name), caller, ": '", name,
                   "' is not a persistable var of the program (asked for by rows)");
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
  if (as_rows != nullptr) *as_rows = std::move(rows_out);
}

// Adds `rows` to `tensors` and `metadata` after checking them against `program`.
void AddStoredRows(const RowsByVar& rows, const Program& program, const char* caller,
                   NamedTensors* tensors, std::map<std::string, std::string>* metadata) {
  for (const auto& [name, r] : rows) {
    const VarDesc* v = program.global_block().FindVar(name);
    KEEL_ENFORCE(v != nullptr && v->persistable(), caller, ": '", name,
                 "' (given by rows) is not a persistable var of the program; nothing was written");
    const std::string what = StrCat(caller, ": rows of '", name, "'");
    const std::vector<int64_t>& shape = v->shape();
    KEEL_ENFORCE(!shape.empty() && shape[0] >= 0, what, ": the program declares it ",
                 v->dims().str(), "; nothing was written");
    CheckRowIds(r.ids, shape[0], what);
    DDim want(shape);
    want[0] = static_cast<int64_t>(r.ids.size());
    KEEL_ENFORCE(r.values.initialized() && r.values.dtype() == v->dtype() &&
                     ShapeMatches(want.vec(), r.values.dims()),
                 what, ": values are ",
                 r.values.initialized() ? r.values.dims().str() : std::string("missing"),
                 ", the program wants ", DTypeName(v->dtype()), " ", want.str(),
                 "; nothing was written");
    Tensor ids;
    int64_t* p =
        static_cast<int64_t*>(ids.Alloc(DType::kInt64, DDim({static_cast<int64_t>(r.ids.size())})));
    std::copy(r.ids.begin(), r.ids.end(), p);
    tensors->emplace_back(name + kRowIdsSuffix, ids);
    tensors->emplace_back(name + kRowValuesSuffix,
                          r.values.place().is_cpu() ? r.values : r.values.Clone(CPUPlace()));
    (*metadata)[kRowsPrefix + name] = RowInitText(r.init);
  }
}

}  // namespace

// ---------------------------------------------------------------- programs

void SaveProgram(const Program& program, const std::string& path) {
  WriteFileAtomic(path, program.SerializeToString());
}

std::unique_ptr<Program> LoadProgram(const std::string& path) {
  // A ProgramDesc is one protobuf message, which protobuf caps below 2 GiB; real ones are far
  // smaller, so a larger file is refused before it is read whole.
  std::unique_ptr<Program> program =
      Program::ParseFromString(ReadFile(path, size_t{1} << 30), path);
  ValidateProgram(*program, path);
  return program;
}

// ---------------------------------------------------------------- checkpoints

void save_persistables(const Scope& scope, const std::string& dirname, const Program& program,
                       const std::set<std::string>& skip, const RowsByVar& by_rows) {
  std::set<std::string> not_from_scope = skip;
  for (const auto& [name, unused] : by_rows) not_from_scope.insert(name);
  NamedTensors tensors = CollectPersistables(scope, program, "save_persistables", not_from_scope);
  std::map<std::string, std::string> metadata = kFormatMetadata;
  AddStoredRows(by_rows, program, "save_persistables", &tensors, &metadata);
  MakeDirs(dirname);
  SaveSafetensors(JoinPath(dirname, kPersistablesFile), tensors, metadata);
}

void save_checkpoint(const Scope& scope, const std::string& dirname, const Program& program,
                     const TrainingState& state, const std::set<std::string>& skip,
                     const RowsByVar& by_rows) {
  std::set<std::string> not_from_scope = skip;
  for (const auto& [name, unused] : by_rows) not_from_scope.insert(name);
  NamedTensors tensors = CollectPersistables(scope, program, "save_checkpoint", not_from_scope);
  std::map<std::string, std::string> metadata = kFormatMetadata;
  AddStoredRows(by_rows, program, "save_checkpoint", &tensors, &metadata);
  for (const auto& [k, v] : state.extra) metadata[kTrainPrefix + k] = v;
  metadata[kTrainPrefix + "step"] = std::to_string(state.step);
  metadata[kTrainPrefix + "seed"] = std::to_string(state.seed);
  metadata[kTrainPrefix + "world_size"] = std::to_string(state.world_size);
  MakeDirs(dirname);
  const std::string latest = JoinPath(dirname, kPersistablesFile);
  std::error_code ec;
  if (std::filesystem::is_regular_file(latest, ec)) {
    // The latest becomes the previous: a link under a temp name renamed over the previous one, so
    // a kill at any point leaves a sound latest and (after the first save) a previous; the temp
    // names a kill left between link and rename go first.
    RemoveStaleTemps(dirname, "." + kPreviousPersistablesFile + ".tmp.");
    const std::string prev = JoinPath(dirname, kPreviousPersistablesFile);
    const std::string tmp = JoinPath(dirname, TempNameFor(kPreviousPersistablesFile));
    if (::link(latest.c_str(), tmp.c_str()) == 0) {
      FaultPoint("checkpoint_keep_previous");
      // rename() of one hard link over another of the same file does nothing and succeeds: a
      // save killed after this rename but before the latest's left the two names on one file,
      // and the temp name would stay. It is unlinked whatever rename did.
      ::rename(tmp.c_str(), prev.c_str());
      ::unlink(tmp.c_str());
    } else {
      WriteFileAtomic(prev, ReadFile(latest));  // no hard links here: a copy
    }
  }
  SaveSafetensors(latest, tensors, metadata);
}

namespace {

// The "keel.train.*" entries of `metadata` (from `path`), or nullopt when it has none.
std::optional<TrainingState> StateFromMetadata(const std::map<std::string, std::string>& metadata,
                                               const std::string& path) {
  if (!metadata.count(kTrainPrefix + "step")) return std::nullopt;
  TrainingState st;
  auto number = [&](const std::string& key, auto* out) {
    auto it = metadata.find(kTrainPrefix + key);
    KEEL_ENFORCE(it != metadata.end(), path, ": training state lacks \"", kTrainPrefix, key, "\"");
    const std::string& v = it->second;
    KEEL_ENFORCE(
        !v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos,
        path, ": \"", kTrainPrefix, key, "\" is '", v, "', not a count");
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(std::stoull(v));
  };
  number("step", &st.step);
  number("seed", &st.seed);
  number("world_size", &st.world_size);
  KEEL_ENFORCE(st.step >= 0 && st.world_size >= 1, path, ": implausible training state (step ",
               st.step, ", world_size ", st.world_size, ")");
  for (const auto& [k, v] : metadata) {
    if (k.compare(0, kTrainPrefix.size(), kTrainPrefix) != 0) continue;
    std::string key = k.substr(kTrainPrefix.size());
    if (key != "step" && key != "seed" && key != "world_size") st.extra[key] = v;
  }
  return st;
}

}  // namespace

namespace {

// A checkpoint file chosen in a folder, decoded.
struct ChosenFile {
  std::string path, bytes, damaged;
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
};

// DIR's latest checkpoint file, or its previous one when the latest cannot be read (truncated, a
// checksum that does not match) and the previous can; both damaged: the latest's error. The bytes
// are kept when asked for.
ChosenFile ReadChosen(const std::string& dirname, bool keep_bytes) {
  ChosenFile f;
  auto read = [&](const std::string& path) {
    f.metadata.clear();
    f.bytes = ReadFile(path);
    f.tensors = DecodeSafetensors(f.bytes, path, &f.metadata);
    f.path = path;
  };
  try {
    read(JoinPath(dirname, kPersistablesFile));
  } catch (const Error& damaged) {
    const std::string prev = JoinPath(dirname, kPreviousPersistablesFile);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(prev, ec)) throw;
    try {
      read(prev);
    } catch (const Error&) {
      throw damaged;
    }
    f.damaged = damaged.what();
  }
  if (!keep_bytes) std::string().swap(f.bytes);
  return f;
}

// After ReadChosen fell back to the previous file: says so on stderr and sets the latest aside
// (best effort: another rank may have done it, the folder may be read-only), so that the next
// save does not keep the damaged file as its previous one.
void SetAsideDamaged(const std::string& dirname, const ChosenFile& f) {
  if (f.damaged.empty()) return;
  const std::string latest = JoinPath(dirname, kPersistablesFile);
  const bool aside = ::rename(latest.c_str(), (latest + ".damaged").c_str()) == 0;
  std::fprintf(stderr,
               "warning: %s\nwarning: the latest checkpoint is damaged%s; loading the previous "
               "one, %s\n",
               f.damaged.c_str(), aside ? " (set aside as .damaged)" : "", f.path.c_str());
}

}  // namespace

std::optional<TrainingState> load_checkpoint(Scope& scope, const Place& place,
                                             const std::string& dirname, const Program& program,
                                             const std::set<std::string>& skip) {
  return load_checkpoint(scope, place, dirname, program, skip, nullptr);
}

std::optional<TrainingState> load_checkpoint(Scope& scope, const Place& place,
                                             const std::string& dirname, const Program& program,
                                             const std::set<std::string>& skip, RowsByVar* rows) {
  ChosenFile f = ReadChosen(dirname, /*keep_bytes=*/false);
  SetAsideDamaged(dirname, f);
  std::optional<TrainingState> state = StateFromMetadata(f.metadata, f.path);
  ValidateAndAssign(scope, &place, std::move(f.tensors), f.metadata, f.path, program,
                    "load_checkpoint", skip, rows);
  return state;
}

std::optional<TrainingState> ReadTrainingState(const std::string& dirname) {
  if (!HasCheckpoint(dirname)) return std::nullopt;
  ChosenFile f = ReadChosen(dirname, /*keep_bytes=*/false);
  return StateFromMetadata(f.metadata, f.path);
}

std::optional<CheckpointFile> ReadCheckpointFile(const std::string& dirname,
                                                 bool set_aside_damaged) {
  if (!HasCheckpoint(dirname)) return std::nullopt;
  ChosenFile f = ReadChosen(dirname, /*keep_bytes=*/true);
  if (set_aside_damaged) SetAsideDamaged(dirname, f);
  CheckpointFile file;
  file.state = StateFromMetadata(f.metadata, f.path);
  file.path = std::move(f.path);
  file.crc32 = Crc32Hex(f.bytes);
  file.bytes = std::move(f.bytes);
  file.damaged = std::move(f.damaged);
  return file;
}

CheckpointFile CheckpointFileFromBytes(std::string bytes, const std::string& path) {
  std::map<std::string, std::string> metadata;
  DecodeSafetensors(bytes, path, &metadata);
  CheckpointFile file;
  file.state = StateFromMetadata(metadata, path);
  file.path = path;
  file.crc32 = Crc32Hex(bytes);
  file.bytes = std::move(bytes);
  return file;
}

std::optional<TrainingState> load_checkpoint(Scope& scope, const Place& place,
                                             const CheckpointFile& file, const Program& program,
                                             const std::set<std::string>& skip) {
  std::map<std::string, std::string> metadata;
  NamedTensors tensors = DecodeSafetensors(file.bytes, file.path, &metadata);
  std::optional<TrainingState> state = StateFromMetadata(metadata, file.path);
  ValidateAndAssign(scope, &place, std::move(tensors), metadata, file.path, program,
                    "load_checkpoint", skip);
  return state;
}

bool HasCheckpoint(const std::string& dirname) {
  std::error_code ec;
  return std::filesystem::is_regular_file(JoinPath(dirname, kPersistablesFile), ec) ||
         std::filesystem::is_regular_file(JoinPath(dirname, kPreviousPersistablesFile), ec);
}

void load_persistables(Scope& scope, const std::string& dirname, const Program& program,
                       const std::set<std::string>& skip) {
  const std::string path = JoinPath(dirname, kPersistablesFile);
  std::map<std::string, std::string> metadata;
  NamedTensors tensors = LoadSafetensors(path, &metadata);
  ValidateAndAssign(scope, nullptr, std::move(tensors), metadata, path, program,
                    "load_persistables", skip);
}

void load_persistables(Scope& scope, const Place& place, const std::string& dirname,
                       const Program& program, const std::set<std::string>& skip) {
  const std::string path = JoinPath(dirname, kPersistablesFile);
  std::map<std::string, std::string> metadata;
  NamedTensors tensors = LoadSafetensors(path, &metadata);
  ValidateAndAssign(scope, &place, std::move(tensors), metadata, path, program, "load_persistables",
                    skip);
}

// ---------------------------------------------------------------- inference models

namespace {

// The staging directory an interrupted publish of DIR committed to ("" when none): the name in
// DIR/.publishing when it is well formed and the directory exists.
std::string CommittedStaging(const std::string& dirname) {
  const std::string marker = JoinPath(dirname, kPublishMarker);
  std::error_code ec;
  if (!std::filesystem::exists(marker, ec)) return "";
  std::string name;
  try {
    name = ReadFile(marker);
  } catch (const Error&) {
    return "";  // removed meanwhile: the publish completed
  }
  if (name.compare(0, kStagingPrefix.size(), kStagingPrefix) != 0 ||
      name.find('/') != std::string::npos)
    return "";
  return std::filesystem::is_directory(JoinPath(dirname, name), ec) ? name : "";
}

// DIR/file as the last committed publish left it: from the staging directory while the file is
// still there, else from DIR. A rename between the two reads moves the file, so falling back
// from a vanished staged file to DIR reads the same bytes.
std::string ReadPublished(const std::string& dirname, const std::string& staging,
                          const std::string& file) {
  if (!staging.empty()) {
    const std::string staged = JoinPath(JoinPath(dirname, staging), file);
    std::error_code ec;
    if (std::filesystem::exists(staged, ec)) {
      try {
        return ReadFile(staged);
      } catch (const Error&) {
      }
    }
  }
  return ReadFile(JoinPath(dirname, file));
}

void RenameInto(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    int e = errno;
    KEEL_THROW("save_inference_model: rename ", from, " -> ", to, " failed: ", std::strerror(e));
  }
}

}  // namespace

void save_inference_model(const std::string& dirname, const std::vector<std::string>& feeds,
                          const std::vector<std::string>& targets, const Scope& scope,
                          const Program& program) {
  std::map<std::string, std::string> metadata = kFormatMetadata;
  metadata[kFeedsKey] = JoinNames(feeds, "feed");
  metadata[kTargetsKey] = JoinNames(targets, "target");
  std::unique_ptr<Program> pruned;
  try {
    pruned = PruneForInference(program, feeds, targets);
  } catch (const Error& e) {
    KEEL_THROW("save_inference_model to ", dirname, ": ", e.what(), "; nothing was written");
  }
  NamedTensors params = CollectPersistables(scope, *pruned, "save_inference_model");
  const std::string model_bytes = pruned->SerializeToString();
  metadata[kModelChecksumKey] = Crc32Hex(model_bytes);
  MakeDirs(dirname);

  // Staging directories of dead writers go, except one an interrupted publish committed to
  // (readers take files from it until this publish replaces the marker).
  auto remove_stale = [&] {
    const std::string committed = CommittedStaging(dirname);
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dirname, ec)) {
      std::string name = entry.path().filename().string();
      if (name != committed && IsStaleTempOf(name, kStagingPrefix))
        std::filesystem::remove_all(entry.path(), ec);
    }
  };
  remove_stale();
  std::error_code ec;
  // 1. The new pair, complete and durable, in a staging directory.
  const std::string staging = kStagingPrefix + TempNameFor("model").substr(1);
  const std::string stage_dir = JoinPath(dirname, staging);
  MakeDirs(stage_dir);
  WriteFileAtomic(JoinPath(stage_dir, kModelFile), model_bytes);
  SaveSafetensors(JoinPath(stage_dir, kParamsFile), params, metadata);
  SyncDirectory(dirname, stage_dir);
  // 2. The commit point: readers take the staged pair from now on.
  WriteFileAtomic(JoinPath(dirname, kPublishMarker), staging);
  FaultPoint("inference_after_commit");
  // 3. Into place, one file at a time; a kill in between is covered by the marker.
  RenameInto(JoinPath(stage_dir, kModelFile), JoinPath(dirname, kModelFile));
  FaultPoint("inference_between_renames");
  RenameInto(JoinPath(stage_dir, kParamsFile), JoinPath(dirname, kParamsFile));
  SyncDirectory(dirname, JoinPath(dirname, kModelFile));
  // 4. Done: the marker goes first, then the empty staging directory.
  ::unlink(JoinPath(dirname, kPublishMarker).c_str());
  std::filesystem::remove_all(stage_dir, ec);
  remove_stale();
  SyncDirectory(dirname, JoinPath(dirname, kPublishMarker));
}

InferenceModel load_inference_model(const std::string& dirname, Scope& scope, const Place& place) {
  const std::string model_path = JoinPath(dirname, kModelFile);
  const std::string params_path = JoinPath(dirname, kParamsFile);
  std::string model_bytes, checksum;
  NamedTensors params;
  std::map<std::string, std::string> metadata;
  // A publish that runs while we read may hand us one file of each pair: read again.
  for (int attempt = 0;; ++attempt) {
    const std::string staging = CommittedStaging(dirname);
    model_bytes = ReadPublished(dirname, staging, kModelFile);
    std::string params_bytes = ReadPublished(dirname, staging, kParamsFile);
    metadata.clear();
    params = DecodeSafetensors(params_bytes, params_path, &metadata);
    auto it = metadata.find(kModelChecksumKey);
    if (it == metadata.end() || it->second == Crc32Hex(model_bytes)) break;
    KEEL_ENFORCE(attempt < 2, model_path, " and ", params_path,
                 " belong to different saves (the params file records __model__ checksum ",
                 it->second, ", __model__ has ", Crc32Hex(model_bytes),
                 "); save the inference model again");
  }
  InferenceModel model;
  model.program = Program::ParseFromString(model_bytes, model_path);
  ValidateProgram(*model.program, model_path);
  for (const std::string* key : {&kFeedsKey, &kTargetsKey})
    KEEL_ENFORCE(metadata.count(*key), params_path, ": no \"", *key,
                 "\" in __metadata__ (not written by save_inference_model?)");
  model.feeds = SplitNames(metadata[kFeedsKey]);
  model.targets = SplitNames(metadata[kTargetsKey]);
  for (const auto* names : {&model.feeds, &model.targets})
    for (const auto& n : *names)
      KEEL_ENFORCE(model.program->global_block().HasVar(n), params_path, ": feed/target var '", n,
                   "' is not defined in ", model_path);
  ValidateAndAssign(scope, &place, std::move(params), metadata, params_path, *model.program,
                    "load_inference_model");
  return model;
}

}  // namespace keel
