#include "executor/graph_capture.h"

#include "framework/op/op_registry.h"

namespace keel {

GraphCapturePolicy::Action GraphCapturePolicy::Next(const std::string& key, bool* drop_graph) {
  *drop_graph = false;
  if (!keyed_ || key != key_) {
    *drop_graph = captured_;
    captured_ = false;
    plain_runs_ = 0;
    key_ = key;
    keyed_ = true;
  }
  if (captured_) return Action::kReplay;
  if (plain_runs_ >= kWarmupRuns) return Action::kCapture;
  ++plain_runs_;
  return Action::kPlain;
}

std::string FeedSignature(const FeedMap& feed) {
  std::string s;
  for (auto& kv : feed) {  // a std::map: in name order
    const Tensor& t = kv.second;
    s += kv.first + ":" + DTypeName(t.dtype()) + t.dims().str() +
         (t.place().is_cpu() ? "@host" : "@" + t.place().str()) + ";";
  }
  return s;
}

std::string GraphCaptureBlocker(const Program& program, int block_idx) {
  const Block& block = program.block(block_idx);
  for (size_t i = 0; i < block.num_ops(); ++i) {
    const OpDesc* op = block.op(i);
    const std::string at = "op #" + std::to_string(i) + " " + op->type();
    if (op->HasAttr("sub_block"))
      return at + " runs a sub-block, and its condition comes to the host every step";
    const std::string& why = OpRegistry::Traits(op->type()).not_capturable;
    if (!why.empty()) return at + " " + why;
  }
  return "";
}

}  // namespace keel
