#include "transpiler/sync_batch_norm_pass.h"

#include <set>
#include <string>

namespace keel {
namespace transpiler {

namespace {

bool Training(const OpDesc& op) {
  for (const char* a : {"is_test", "use_global_stats"})
    if (op.HasAttr(a) && op.Attr<bool>(a)) return false;
  return true;
}

}  // namespace

void SyncBatchNormPass::Apply(Program& main, Program& /*startup*/) const {
  // The SavedMean vars of the rewritten forward ops: their grads (which read them) follow.
  std::set<std::string> synced_saved_means;
  for (int b = 0; b < main.num_blocks(); ++b)
    for (auto& op : main.block(b).ops()) {
      if (op->type() != "batch_norm" || !Training(*op)) continue;
      op->set_type("sync_batch_norm");
      op->SetAttr("ring_id", options_.ring_id);
      for (const std::string& v : op->Output("SavedMean")) synced_saved_means.insert(v);
    }
  for (int b = 0; b < main.num_blocks(); ++b)
    for (auto& op : main.block(b).ops()) {
      if (op->type() != "batch_norm_grad" || op->Input("SavedMean").size() != 1 ||
          synced_saved_means.count(op->Input("SavedMean")[0]) == 0)
        continue;
      op->set_type("sync_batch_norm_grad");
      op->SetAttr("ring_id", options_.ring_id);
    }
}

}  // namespace transpiler
}  // namespace keel
