#include "framework/ir/program.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <set>
#include <sstream>

#include <glog/logging.h>

#include "framework/ir/framework.pb.h"

namespace keel {

namespace {

const std::vector<std::string> kNoArgs;

std::string FloatText(double f) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", f);
  return buf;
}

template <typename T, typename F>
std::string ListText(const std::vector<T>& v, F f) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += f(v[i]);
  }
  return s + "]";
}

const std::vector<std::string>& FindSlot(const OpDesc::VarMap& m, const std::string& slot) {
  for (auto& kv : m)
    if (kv.first == slot) return kv.second;
  return kNoArgs;
}

void SetSlot(OpDesc::VarMap* m, const std::string& slot, std::vector<std::string> args) {
  for (auto& kv : *m)
    if (kv.first == slot) {
      kv.second = std::move(args);
      return;
    }
  m->emplace_back(slot, std::move(args));
}

std::string SlotsText(const OpDesc::VarMap& m) {
  std::string s;
  for (size_t i = 0; i < m.size(); ++i) {
    if (i) s += ", ";
    s += m[i].first + ": ";
    s += m[i].second.size() == 1 ? m[i].second[0]
                                 : ListText(m[i].second, [](const std::string& x) { return x; });
  }
  return s;
}

std::atomic<uint64_t> g_next_program_id{1};

}  // namespace

const char* AttrTypeName(const Attribute& a) {
  static const char* kNames[] = {"int",     "float", "string", "bool",   "ints",  "floats",
                                 "strings", "bools", "int64",  "int64s", "block", "double"};
  return kNames[a.index()];
}

std::string AttrToString(const Attribute& a) {
  struct Visitor {
    std::string operator()(int v) const { return std::to_string(v); }
    std::string operator()(float v) const { return FloatText(v); }
    std::string operator()(double v) const { return FloatText(v); }
    std::string operator()(const std::string& v) const { return "\"" + v + "\""; }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return std::to_string(v) + "L"; }
    std::string operator()(const BlockRef& v) const { return "block" + std::to_string(v.idx); }
    std::string operator()(const std::vector<int>& v) const {
      return ListText(v, [](int x) { return std::to_string(x); });
    }
    std::string operator()(const std::vector<float>& v) const {
      return ListText(v, [](float x) { return FloatText(x); });
    }
    std::string operator()(const std::vector<std::string>& v) const {
      return ListText(v, [](const std::string& x) { return "\"" + x + "\""; });
    }
    std::string operator()(const std::vector<bool>& v) const {
      std::vector<int> b(v.begin(), v.end());
      return ListText(b, [](int x) { return std::string(x ? "true" : "false"); });
    }
    std::string operator()(const std::vector<int64_t>& v) const {
      return ListText(v, [](int64_t x) { return std::to_string(x) + "L"; });
    }
  };
  return std::visit(Visitor{}, a);
}

// ---------------------------------------------------------------- OpDesc

const std::vector<std::string>& OpDesc::Input(const std::string& slot) const {
  return FindSlot(inputs_, slot);
}
const std::vector<std::string>& OpDesc::Output(const std::string& slot) const {
  return FindSlot(outputs_, slot);
}
bool OpDesc::HasInput(const std::string& slot) const { return !Input(slot).empty(); }
bool OpDesc::HasOutput(const std::string& slot) const { return !Output(slot).empty(); }
void OpDesc::SetInput(const std::string& slot, std::vector<std::string> args) {
  SetSlot(&inputs_, slot, std::move(args));
}
void OpDesc::SetOutput(const std::string& slot, std::vector<std::string> args) {
  SetSlot(&outputs_, slot, std::move(args));
}

std::vector<std::string> OpDesc::InputArgumentNames() const {
  std::vector<std::string> r;
  for (auto& kv : inputs_) r.insert(r.end(), kv.second.begin(), kv.second.end());
  return r;
}
std::vector<std::string> OpDesc::OutputArgumentNames() const {
  std::vector<std::string> r;
  for (auto& kv : outputs_) r.insert(r.end(), kv.second.begin(), kv.second.end());
  return r;
}

void OpDesc::RenameInput(const std::string& from, const std::string& to) {
  for (auto& kv : inputs_) std::replace(kv.second.begin(), kv.second.end(), from, to);
}
void OpDesc::RenameOutput(const std::string& from, const std::string& to) {
  for (auto& kv : outputs_) std::replace(kv.second.begin(), kv.second.end(), from, to);
}

const Attribute& OpDesc::GetAttr(const std::string& name) const {
  auto it = attrs_.find(name);
  KEEL_ENFORCE(it != attrs_.end(), "op ", type_, " has no attribute '", name, "'");
  return it->second;
}

std::string OpDesc::ToText() const {
  std::string s = type_ + "(" + SlotsText(inputs_) + ") -> (" + SlotsText(outputs_) + ")";
  if (!attrs_.empty()) {
    s += " {";
    bool first = true;
    for (auto& kv : attrs_) {
      if (!first) s += ", ";
      first = false;
      s += kv.first + "=" + AttrToString(kv.second);
    }
    s += "}";
  }
  return s;
}

// ---------------------------------------------------------------- Block

void Block::Touch() { program_->Touch(); }

VarDesc* Block::Var(const std::string& name) {
  KEEL_ENFORCE(!name.empty(), "a variable needs a name (block ", idx_, ")");
  auto& slot = vars_[name];
  if (!slot) {
    slot = std::make_unique<VarDesc>(name);
    var_order_.push_back(name);
    Touch();
  }
  return slot.get();
}

VarDesc* Block::FindVar(const std::string& name) const {
  auto it = vars_.find(name);
  return it == vars_.end() ? nullptr : it->second.get();
}

VarDesc* Block::FindVarRecursive(const std::string& name) const {
  for (const Block* b = this; b;) {
    if (VarDesc* v = b->FindVar(name)) return v;
    b = b->parent_idx_ >= 0 ? &program_->block(b->parent_idx_) : nullptr;
  }
  return nullptr;
}

VarDesc* Block::MustFindVar(const std::string& name) const {
  VarDesc* v = FindVarRecursive(name);
  KEEL_ENFORCE(v != nullptr, "variable '", name, "' is not defined in block ", idx_);
  return v;
}

void Block::RemoveVar(const std::string& name_ref) {
  const std::string name = name_ref;  // name_ref may live in the VarDesc erased below
  if (vars_.erase(name)) {
    var_order_.erase(std::find(var_order_.begin(), var_order_.end(), name));
    Touch();
  }
}

std::vector<VarDesc*> Block::AllVars() const {
  std::vector<VarDesc*> r;
  r.reserve(var_order_.size());
  for (auto& n : var_order_) r.push_back(vars_.at(n).get());
  return r;
}

OpDesc* Block::AppendOp(const std::string& type) { return InsertOp(ops_.size(), type); }

OpDesc* Block::InsertOp(size_t index, const std::string& type) {
  return InsertOp(index, std::make_unique<OpDesc>(type));
}

OpDesc* Block::InsertOp(size_t index, std::unique_ptr<OpDesc> op) {
  CHECK_LE(index, ops_.size());
  OpDesc* raw = op.get();
  ops_.insert(ops_.begin() + index, std::move(op));
  Touch();
  return raw;
}

void Block::RemoveOp(size_t index) { RemoveOps(index, index + 1); }

void Block::RemoveOps(size_t begin, size_t end) {
  CHECK_LE(begin, end);
  CHECK_LE(end, ops_.size());
  ops_.erase(ops_.begin() + begin, ops_.begin() + end);
  Touch();
}

// ---------------------------------------------------------------- Program

Program::Program() : id_(g_next_program_id++) {
  blocks_.push_back(std::make_unique<Block>(this, 0, -1));
}

Block& Program::AppendBlock(int parent_idx) {
  blocks_.push_back(std::make_unique<Block>(this, num_blocks(), parent_idx));
  Touch();
  return *blocks_.back();
}

std::string Program::UniqueName(const std::string& prefix) {
  for (;;) {
    std::string name = prefix + "_" + std::to_string(name_counters_[prefix]++);
    bool taken = false;
    for (auto& b : blocks_) taken = taken || b->HasVar(name) || b->HasVar(name + ".w_0");
    if (!taken) return name;
  }
}

namespace {

void AttrToProto(const std::string& name, const Attribute& a, proto::OpDesc::Attr* p) {
  p->set_name(name);
  p->set_type(static_cast<proto::AttrType>(a.index()));
  struct V {
    proto::OpDesc::Attr* p;
    void operator()(int v) { p->set_i(v); }
    void operator()(float v) { p->set_f(v); }
    void operator()(double v) { p->set_d(v); }
    void operator()(const std::string& v) { p->set_s(v); }
    void operator()(bool v) { p->set_b(v); }
    void operator()(int64_t v) { p->set_l(v); }
    void operator()(const BlockRef& v) { p->set_block_idx(v.idx); }
    void operator()(const std::vector<int>& v) { p->mutable_ints()->Add(v.begin(), v.end()); }
    void operator()(const std::vector<float>& v) { p->mutable_floats()->Add(v.begin(), v.end()); }
    void operator()(const std::vector<std::string>& v) {
      for (auto& s : v) p->add_strings(s);
    }
    void operator()(const std::vector<bool>& v) {
      for (bool b : v) p->add_bools(b);
    }
    void operator()(const std::vector<int64_t>& v) { p->mutable_longs()->Add(v.begin(), v.end()); }
  };
  std::visit(V{p}, a);
}

Attribute AttrFromProto(const proto::OpDesc::Attr& p) {
  switch (p.type()) {
    case proto::INT:
      return p.i();
    case proto::FLOAT:
      return p.f();
    case proto::STRING:
      return p.s();
    case proto::BOOLEAN:
      return p.b();
    case proto::INTS:
      return std::vector<int>(p.ints().begin(), p.ints().end());
    case proto::FLOATS:
      return std::vector<float>(p.floats().begin(), p.floats().end());
    case proto::STRINGS:
      return std::vector<std::string>(p.strings().begin(), p.strings().end());
    case proto::BOOLEANS:
      return std::vector<bool>(p.bools().begin(), p.bools().end());
    case proto::LONG:
      return static_cast<int64_t>(p.l());
    case proto::LONGS:
      return std::vector<int64_t>(p.longs().begin(), p.longs().end());
    case proto::BLOCK:
      return BlockRef{p.block_idx()};
    case proto::DOUBLE:
      return p.d();
  }
  KEEL_THROW("attribute '", p.name(), "' has unknown type code ", static_cast<int>(p.type()));
}

}  // namespace

void Program::ToProto(proto::ProgramDesc* out) const {
  out->Clear();
  out->set_random_seed(random_seed_);
  for (auto& b : blocks_) {
    proto::BlockDesc* pb = out->add_blocks();
    pb->set_idx(b->idx());
    pb->set_parent_idx(b->parent_idx());
    for (VarDesc* v : b->AllVars()) {
      proto::VarDesc* pv = pb->add_vars();
      pv->set_name(v->name());
      pv->set_dtype(static_cast<proto::DataType>(v->dtype()));
      for (int64_t d : v->shape()) pv->add_shape(d);
      pv->set_persistable(v->persistable());
      pv->set_stop_gradient(v->stop_gradient());
      pv->set_is_parameter(v->is_parameter());
      pv->set_is_data(v->is_data());
      if (v->row_sparse()) pv->set_row_sparse(true);
    }
    for (auto& op : b->ops()) {
      proto::OpDesc* po = pb->add_ops();
      po->set_type(op->type());
      for (auto& kv : op->inputs()) {
        auto* pvar = po->add_inputs();
        pvar->set_parameter(kv.first);
        for (auto& a : kv.second) pvar->add_arguments(a);
      }
      for (auto& kv : op->outputs()) {
        auto* pvar = po->add_outputs();
        pvar->set_parameter(kv.first);
        for (auto& a : kv.second) pvar->add_arguments(a);
      }
      for (auto& kv : op->attrs()) AttrToProto(kv.first, kv.second, po->add_attrs());
    }
  }
}

std::unique_ptr<Program> Program::FromProto(const proto::ProgramDesc& desc) {
  auto prog = std::make_unique<Program>();
  prog->random_seed_ = desc.random_seed();
  KEEL_ENFORCE(desc.blocks_size() >= 1, "program has no blocks");
  for (int bi = 0; bi < desc.blocks_size(); ++bi) {
    const auto& pb = desc.blocks(bi);
    KEEL_ENFORCE(pb.idx() == bi, "block ", bi, " carries index ", pb.idx());
    KEEL_ENFORCE(pb.parent_idx() < bi, "block ", bi, " has parent ", pb.parent_idx(),
                 " that does not precede it");
    Block& b = bi == 0 ? prog->global_block() : prog->AppendBlock(pb.parent_idx());
    for (const auto& pv : pb.vars()) {
      KEEL_ENFORCE(proto::DataType_IsValid(pv.dtype()), "variable '", pv.name(),
                   "' has unknown dtype code ", static_cast<int>(pv.dtype()));
      VarDesc* v = b.Var(pv.name());
      v->set_dtype(static_cast<DType>(pv.dtype()));
      v->set_shape(std::vector<int64_t>(pv.shape().begin(), pv.shape().end()));
      v->set_persistable(pv.persistable());
      v->set_stop_gradient(pv.stop_gradient());
      v->set_is_parameter(pv.is_parameter());
      v->set_is_data(pv.is_data());
      v->set_row_sparse(pv.row_sparse());
    }
    for (const auto& po : pb.ops()) {
      OpDesc* op = b.AppendOp(po.type());
      for (const auto& pvar : po.inputs())
        op->SetInput(pvar.parameter(),
                     std::vector<std::string>(pvar.arguments().begin(), pvar.arguments().end()));
      for (const auto& pvar : po.outputs())
        op->SetOutput(pvar.parameter(),
                      std::vector<std::string>(pvar.arguments().begin(), pvar.arguments().end()));
      for (const auto& pa : po.attrs()) op->SetAttr(pa.name(), AttrFromProto(pa));
    }
  }
  return prog;
}

std::string Program::SerializeToString() const {
  proto::ProgramDesc desc;
  ToProto(&desc);
  std::string s;
  CHECK(desc.SerializeToString(&s));
  return s;
}

std::unique_ptr<Program> Program::ParseFromString(const std::string& bytes,
                                                  const std::string& what) {
  proto::ProgramDesc desc;
  KEEL_ENFORCE(desc.ParseFromString(bytes), what, ": not a valid keel program (", bytes.size(),
               " bytes failed to parse as ProgramDesc)");
  try {
    return FromProto(desc);
  } catch (const Error& e) {
    KEEL_THROW(what, ": ", e.what());
  }
}

std::unique_ptr<Program> Program::Clone() const {
  proto::ProgramDesc desc;
  ToProto(&desc);
  auto p = FromProto(desc);
  p->name_counters_ = name_counters_;
  return p;
}

std::unique_ptr<Program> Program::clone_for_test() const {
  auto p = Clone();
  for (int bi = 0; bi < p->num_blocks(); ++bi) {
    Block& b = p->block(bi);
    for (size_t i = b.num_ops(); i-- > 0;) {
      OpDesc* op = b.op(i);
      int role = op->HasAttr(kOpRoleAttr) ? op->Attr<int>(kOpRoleAttr) : 0;
      if ((role & ~static_cast<int>(OpRole::kLoss)) != static_cast<int>(OpRole::kForward)) {
        b.RemoveOp(i);
        continue;
      }
      if (op->HasAttr("is_test")) op->SetAttr("is_test", true);
    }
    std::set<std::string> used;
    for (auto& op : b.ops()) {
      for (auto& n : op->InputArgumentNames()) used.insert(n);
      for (auto& n : op->OutputArgumentNames()) used.insert(n);
    }
    for (VarDesc* v : b.AllVars())
      if (!used.count(v->name()) && !v->is_data() && !v->persistable()) b.RemoveVar(v->name());
  }
  return p;
}

std::string VarToText(const VarDesc& v) {
  std::string s = "var " + v.name() + " : " + DTypeName(v.dtype()) +
                  ListText(v.shape(), [](int64_t d) { return std::to_string(d); });
  if (v.is_data()) s += " data";
  if (v.persistable()) s += " persistable";
  if (v.is_parameter()) s += " parameter";
  if (v.stop_gradient()) s += " stop_gradient";
  if (v.row_sparse()) s += " row_sparse";
  return s;
}

std::string Program::ToText() const {
  std::ostringstream os;
  os << "program seed=" << random_seed_ << "\n";
  for (auto& b : blocks_) {
    os << "block " << b->idx() << " parent=" << b->parent_idx() << "\n";
    for (VarDesc* v : b->AllVars()) os << "  " << VarToText(*v) << "\n";
    for (auto& op : b->ops()) os << "  " << op->ToText() << "\n";
  }
  return os.str();
}

std::string Program::ToDot() const {
  std::ostringstream os;
  os << "digraph program {\n  rankdir=TB;\n  node [fontsize=10];\n";
  const Block& b = global_block();
  auto quoted = [](const std::string& s) { return "\"" + s + "\""; };
  for (VarDesc* v : b.AllVars()) {
    os << "  " << quoted("v:" + v->name()) << " [shape=ellipse, label=" << quoted(v->name())
       << (v->is_parameter() ? ", style=filled, fillcolor=lightgrey" : "") << "];\n";
  }
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const OpDesc& op = *b.op(i);
    std::string id = quoted("op:" + std::to_string(i));
    os << "  " << id << " [shape=box, label=" << quoted(op.type()) << "];\n";
    for (auto& in : op.InputArgumentNames())
      if (in != kEmptyVarName) os << "  " << quoted("v:" + in) << " -> " << id << ";\n";
    for (auto& out : op.OutputArgumentNames())
      if (out != kEmptyVarName) os << "  " << id << " -> " << quoted("v:" + out) << ";\n";
  }
  os << "}\n";
  return os.str();
}

uint64_t Program::Fingerprint() const {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : ToText()) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string FingerprintHex(uint64_t fp) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fp));
  return buf;
}

}  // namespace keel
