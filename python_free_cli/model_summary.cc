#include "python_free_cli/model_summary.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

namespace keel {
namespace cli {

namespace {

// Elements per sample: -1 (the batch) counts as 1.
int64_t NumelPerSample(const VarDesc* v) {
  int64_t n = 1;
  for (int64_t d : v->shape()) n *= d < 0 ? 1 : d;
  return n;
}

std::string Grouped(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

std::string Si(double v) {
  const char* units[] = {"", " K", " M", " G", " T"};
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.2f%s" : "%.0f%s", v, units[u]);
  return buf;
}

std::string Shape(const VarDesc* v) {
  std::string s = "[";
  for (size_t i = 0; i < v->shape().size(); ++i)
    s += (i ? ", " : "") + std::to_string(v->shape()[i]);
  return s + "]";
}

const VarDesc* First(const Block& b, const OpDesc& op, const std::string& slot, bool input) {
  if (input ? !op.HasInput(slot) : !op.HasOutput(slot)) return nullptr;
  const auto& names = input ? op.Input(slot) : op.Output(slot);
  return names.empty() ? nullptr : b.FindVarRecursive(names[0]);
}

// FLOPs of one forward op for one sample.
double OpFlops(const Block& b, const OpDesc& op) {
  static const std::set<std::string> kNoMath = {
      "feed",          "fetch",     "reshape",        "flatten",         "squeeze",
      "unsqueeze",     "transpose", "concat",         "split",           "lookup_table",
      "fill_constant", "cast",      "assign",         "fill_zeros_like", "top_k",
      "arg_max",       "accuracy",  "uniform_random", "gaussian_random"};
  if (kNoMath.count(op.type())) return 0;
  const std::string out_slot = op.HasOutput("Out") ? "Out" : op.HasOutput("Y") ? "Y" : "";
  const VarDesc* out = out_slot.empty() ? nullptr : First(b, op, out_slot, false);
  if (op.type() == "mul") {
    // Out = X * Y, Y: [K..., M...] folded at y_num_col_dims; each output element takes K madds.
    // The attribute comes from a file: clamped to Y's rank, unknown dims counting 1.
    const VarDesc* y = First(b, op, "Y", true);
    const int64_t ycols = op.HasAttr("y_num_col_dims") ? op.Attr<int>("y_num_col_dims") : 1;
    double k = 1;
    for (int64_t i = 0; y && i < std::min<int64_t>(ycols, y->shape().size()); ++i)
      k *= std::max<int64_t>(y->shape()[i], 1);
    return out ? 2.0 * NumelPerSample(out) * k : 0;
  }
  if (op.type() == "matmul") {
    const VarDesc* x = First(b, op, "X", true);
    bool tx = op.HasAttr("transpose_X") && op.Attr<bool>("transpose_X");
    if (!x || !out || x->shape().empty()) return 0;
    const auto& xs = x->shape();
    int64_t k = xs.size() == 1 ? xs[0] : tx ? xs[xs.size() - 2] : xs.back();
    return 2.0 * NumelPerSample(out) * (k < 0 ? 1 : k);
  }
  if (op.type() == "conv2d") {
    const VarDesc* f = First(b, op, "Filter", true);
    const VarDesc* o = First(b, op, "Output", false);
    if (!f || !o || f->shape().empty() || f->shape()[0] <= 0) return 0;  // no filters: no math
    return 2.0 * NumelPerSample(o) * (static_cast<double>(NumelPerSample(f)) / f->shape()[0]);
  }
  if (op.type() == "pool2d") {
    const VarDesc* x = First(b, op, "X", true);
    return x ? static_cast<double>(NumelPerSample(x)) : 0;
  }
  if (op.type() == "batch_norm" || op.type() == "layer_norm") {
    const VarDesc* x = First(b, op, "X", true);
    return x ? 2.0 * NumelPerSample(x) : 0;
  }
  return out ? static_cast<double>(NumelPerSample(out)) : 0;
}

}  // namespace

ModelSummary SummarizeModel(const Program& program, const std::string& title) {
  const Block& b = program.global_block();
  // Persistables that forward ops read or write, in declaration order.
  std::set<std::string> forward_vars;
  std::map<std::string, double> flops_by_type;
  int forward_ops = 0;
  ModelSummary s;
  for (const auto& op : b.ops()) {
    int role = op->HasAttr(kOpRoleAttr) ? op->Attr<int>(kOpRoleAttr) : 0;
    const int not_forward = static_cast<int>(OpRole::kBackward) |
                            static_cast<int>(OpRole::kOptimize) |
                            static_cast<int>(OpRole::kCollective);
    if (role & not_forward) continue;
    ++forward_ops;
    for (const std::string& n : op->InputArgumentNames()) forward_vars.insert(n);
    for (const std::string& n : op->OutputArgumentNames()) forward_vars.insert(n);
    double f = OpFlops(b, *op);
    if (f > 0) flops_by_type[op->type()] += f;
    s.flops_per_sample += f;
  }
  std::ostringstream out;
  out << "# " << title << ": " << forward_ops << " forward ops\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%-40s %-22s %14s\n", "parameter", "shape", "count");
  out << line;
  std::vector<const VarDesc*> buffers;
  for (const VarDesc* v : b.AllVars()) {
    if (v->is_parameter()) {
      std::snprintf(line, sizeof(line), "%-40s %-22s %14s\n", v->name().c_str(),
                    (std::string(DTypeName(v->dtype())) + Shape(v)).c_str(),
                    Grouped(NumelPerSample(v)).c_str());
      out << line;
      s.parameters += NumelPerSample(v);
    } else if (v->persistable() && forward_vars.count(v->name())) {
      buffers.push_back(v);
      s.buffers += NumelPerSample(v);
    }
  }
  if (!buffers.empty()) {
    std::snprintf(line, sizeof(line), "%-40s %-22s %14s\n", "state (not trained)", "shape",
                  "count");
    out << line;
    for (const VarDesc* v : buffers) {
      std::snprintf(line, sizeof(line), "%-40s %-22s %14s\n", v->name().c_str(),
                    (std::string(DTypeName(v->dtype())) + Shape(v)).c_str(),
                    Grouped(NumelPerSample(v)).c_str());
      out << line;
    }
  }
  out << "trainable parameters: " << Grouped(s.parameters) << "\n";
  out << "state not trained:    " << Grouped(s.buffers) << "\n";
  out << "total:                " << Grouped(s.parameters + s.buffers) << "\n";
  out << "forward FLOPs per sample: " << Si(s.flops_per_sample);
  std::vector<std::pair<double, std::string>> by;
  for (auto& [type, f] : flops_by_type) by.push_back({f, type});
  std::sort(by.rbegin(), by.rend());
  std::string sep = " (";
  for (auto& [f, type] : by) {
    char part[96];
    std::snprintf(part, sizeof(part), "%s %.1f%%", type.c_str(),
                  100.0 * f / std::max(1.0, s.flops_per_sample));
    out << sep << part;
    sep = ", ";
  }
  out << (by.empty() ? "" : ")") << "\n";
  // Exact counts by op type, for scripts and tests.
  for (auto& [f, type] : by) {
    std::snprintf(line, sizeof(line), "  flops %-22s %.0f\n", type.c_str(), f);
    out << line;
  }
  s.text = out.str();
  return s;
}

}  // namespace cli
}  // namespace keel
