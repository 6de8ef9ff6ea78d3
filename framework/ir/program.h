// The program IR: Program > Block > (VarDesc, OpDesc). Wrappers over framework.proto that passes
// and the DSL edit; ToText() is the one deterministic text form that golden tests compare.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "framework/error.h"
#include "framework/runtime/ddim.h"
#include "framework/runtime/dtype.h"

namespace keel {

namespace proto {
class ProgramDesc;
}

struct BlockRef {
  int idx = 0;
  bool operator==(const BlockRef& o) const { return idx == o.idx; }
};

// A typed attribute value. Alternatives are listed in framework.proto's AttrType order.
using Attribute = std::variant<int, float, std::string, bool, std::vector<int>, std::vector<float>,
                               std::vector<std::string>, std::vector<bool>, int64_t,
                               std::vector<int64_t>, BlockRef, double>;

std::string AttrToString(const Attribute& a);
const char* AttrTypeName(const Attribute& a);

// Name of the gradient of `var`: "x" -> "x@GRAD".
inline std::string GradVarName(const std::string& var) { return var + "@GRAD"; }
// Marks an unused output slot argument (a gradient nobody needs).
inline const std::string kEmptyVarName = "@EMPTY@";

// Paddle's op roles; the transpiler keys on them.
enum class OpRole : int {
  kForward = 0,
  kBackward = 1,
  kOptimize = 2,
  kLoss = 256,
  kCollective = 4
};
inline const std::string kOpRoleAttr = "op_role";
inline const std::string kOpRoleVarAttr = "op_role_var";

class VarDesc {
 public:
  explicit VarDesc(std::string name) : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  void set_dtype(DType t) { dtype_ = t; }
  const std::vector<int64_t>& shape() const { return shape_; }
  DDim dims() const { return DDim(shape_); }
  void set_shape(const std::vector<int64_t>& s) { shape_ = s; }
  void set_dims(const DDim& d) { shape_ = d.vec(); }
  bool persistable() const { return persistable_; }
  void set_persistable(bool p) { persistable_ = p; }
  bool stop_gradient() const { return stop_gradient_; }
  void set_stop_gradient(bool s) { stop_gradient_ = s; }
  bool is_parameter() const { return is_parameter_; }
  void set_is_parameter(bool p) { is_parameter_ = p; }
  bool is_data() const { return is_data_; }
  void set_is_data(bool d) { is_data_ = d; }
  // Row-sparse (proto VarDesc.row_sparse): only ops whose slot accepts it may read it
  // (OpSchema::AcceptsRowSparse, checked by ValidateProgram).
  bool row_sparse() const { return row_sparse_; }
  void set_row_sparse(bool r) { row_sparse_ = r; }

 private:
  std::string name_;
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_;
  bool persistable_ = false;
  bool stop_gradient_ = false;
  bool is_parameter_ = false;
  bool is_data_ = false;
  bool row_sparse_ = false;
};

class OpDesc {
 public:
  // Slot name -> argument var names, in the order slots were set (schema order).
  using VarMap = std::vector<std::pair<std::string, std::vector<std::string>>>;

  explicit OpDesc(std::string type) : type_(std::move(type)) {}

  const std::string& type() const { return type_; }
  void set_type(const std::string& t) { type_ = t; }

  const VarMap& inputs() const { return inputs_; }
  const VarMap& outputs() const { return outputs_; }
  // Arguments of a slot; empty when the slot is absent.
  const std::vector<std::string>& Input(const std::string& slot) const;
  const std::vector<std::string>& Output(const std::string& slot) const;
  bool HasInput(const std::string& slot) const;
  bool HasOutput(const std::string& slot) const;
  void SetInput(const std::string& slot, std::vector<std::string> args);
  void SetOutput(const std::string& slot, std::vector<std::string> args);
  std::vector<std::string> InputArgumentNames() const;
  std::vector<std::string> OutputArgumentNames() const;
  void RenameInput(const std::string& from, const std::string& to);
  void RenameOutput(const std::string& from, const std::string& to);

  const std::map<std::string, Attribute>& attrs() const { return attrs_; }
  bool HasAttr(const std::string& name) const { return attrs_.count(name) > 0; }
  const Attribute& GetAttr(const std::string& name) const;
  void SetAttr(const std::string& name, Attribute value) { attrs_[name] = std::move(value); }
  void RemoveAttr(const std::string& name) { attrs_.erase(name); }
  // The attribute as T; a keel::Error naming op and attribute when absent or of another type.
  template <typename T>
  const T& Attr(const std::string& name) const {
    const Attribute& a = GetAttr(name);
    const T* v = std::get_if<T>(&a);
    KEEL_ENFORCE(v != nullptr, "op ", type_, ": attribute '", name, "' is ", AttrTypeName(a),
                 ", requested as another type");
    return *v;
  }

  std::string ToText() const;

 private:
  std::string type_;
  VarMap inputs_, outputs_;
  std::map<std::string, Attribute> attrs_;
};

class Program;

class Block {
 public:
  Block(Program* program, int idx, int parent_idx)
      : program_(program), idx_(idx), parent_idx_(parent_idx) {}

  int idx() const { return idx_; }
  int parent_idx() const { return parent_idx_; }
  Program* program() const { return program_; }

  // Returns the var named `name` in this block, creating it when absent.
  VarDesc* Var(const std::string& name);
  VarDesc* FindVar(const std::string& name) const;
  // Looks here, then in ancestor blocks.
  VarDesc* FindVarRecursive(const std::string& name) const;
  bool HasVar(const std::string& name) const { return FindVar(name) != nullptr; }
  // The var, or a keel::Error naming it and the block.
  VarDesc* MustFindVar(const std::string& name) const;
  void RemoveVar(const std::string& name);
  // Vars in creation order.
  std::vector<VarDesc*> AllVars() const;

  size_t num_ops() const { return ops_.size(); }
  OpDesc* op(size_t i) const { return ops_[i].get(); }
  const std::vector<std::unique_ptr<OpDesc>>& ops() const { return ops_; }
  OpDesc* AppendOp(const std::string& type);
  OpDesc* InsertOp(size_t index, const std::string& type);
  OpDesc* InsertOp(size_t index, std::unique_ptr<OpDesc> op);
  void RemoveOp(size_t index);
  void RemoveOps(size_t begin, size_t end);

 private:
  void Touch();
  Program* program_;
  int idx_, parent_idx_;
  std::map<std::string, std::unique_ptr<VarDesc>> vars_;
  std::vector<std::string> var_order_;
  std::vector<std::unique_ptr<OpDesc>> ops_;
};

class Program {
 public:
  Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  Block& global_block() { return *blocks_[0]; }
  const Block& global_block() const { return *blocks_[0]; }
  Block& block(int i) { return *blocks_.at(i); }
  const Block& block(int i) const { return *blocks_.at(i); }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  Block& AppendBlock(int parent_idx);

  int64_t random_seed() const { return random_seed_; }
  void set_random_seed(int64_t s) {
    random_seed_ = s;
    Touch();
  }

  // "fc" -> "fc_0", "fc_1", ...: names unique within this program.
  std::string UniqueName(const std::string& prefix);

  // Bumped on every structural change made through Block; executors key their plans on it.
  uint64_t version() const { return version_; }
  void Touch() { ++version_; }
  // A process-unique identity for plan caches (survives address reuse).
  uint64_t id() const { return id_; }

  void ToProto(proto::ProgramDesc* out) const;
  static std::unique_ptr<Program> FromProto(const proto::ProgramDesc& desc);
  std::string SerializeToString() const;
  // Parses a binary ProgramDesc; `what` names the source (a file) in errors.
  static std::unique_ptr<Program> ParseFromString(const std::string& bytes,
                                                  const std::string& what = "program");
  std::unique_ptr<Program> Clone() const;
  // A copy for evaluation: ops with an `is_test` attribute (batch_norm, dropout) switch to
  // inference; backward and optimizer ops, and the vars only they use, are dropped.
  std::unique_ptr<Program> clone_for_test() const;

  // The deterministic text form: vars in creation order, ops in order, attrs sorted by name.
  std::string ToText() const;
  // Block 0 as a Graphviz digraph: ops are boxes, vars ellipses (parameters shaded).
  std::string ToDot() const;
  // 64-bit FNV-1a over ToText(): equal programs have equal fingerprints.
  uint64_t Fingerprint() const;

 private:
  std::vector<std::unique_ptr<Block>> blocks_;
  std::map<std::string, int> name_counters_;
  int64_t random_seed_ = 0;
  uint64_t version_ = 0;
  uint64_t id_;
};

std::string VarToText(const VarDesc& v);
std::string FingerprintHex(uint64_t fp);

}  // namespace keel
