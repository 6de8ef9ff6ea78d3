// AmpPass: automatic mixed precision as a rewrite of the forward program (Paddle's
// `rewrite_program` for AMP O1), so that backward, built afterwards, differentiates the casts too.
//
// Requires: main's global block holds forward ops only (no op with op_role Backward or Optimize:
//   the pass runs before append_backward); every var an op reads is declared with its dtype.
// Guarantees:
//   Each op is classified in program order:
//     white (mul, matmul, conv2d and `white_list`): runs in `dtype`;
//     black (softmax, the losses, reductions, exp/log, lookup_table... and `black_list`): float32;
//     gray (element-wise, activations, pooling, batch/layer norm, dropout, shape ops...): white
//       when an input comes from a white op and none from a black one, black when one comes from
//       a black op, else left as it is (its inputs are parameters or data: float32);
//     any other op: black (float32 where nothing says otherwise, as Paddle does).
//   An op classified white whose (place, dtype) kernel, or its `<type>_grad` kernel, is not
//   registered stays float32 (black), and the pass logs that once per op type.
//   Before a white op, each float32 input becomes `<var>.cast_bf16` / `.cast_fp16` (cast op);
//   before a black op each low-precision input becomes `<var>.cast_fp32`. A cast var is made once
//   and reused by every later reader until its source is written again, so a weight read by several
//   ops is cast once per step. batch_norm and layer_norm cast X only: Scale, Bias and the running
//   statistics stay float32, and so do their outputs other than Y. Output dtypes follow from
//   compile-time shape inference of the rewritten op.
//   A custom white/black list entry overrides the built-in lists (an op in both is an error).
//   With o2 (level O2, after the rewrite above): every float32 parameter that forward reads only
//   through casts to `dtype` becomes a `dtype` parameter: those casts go and their readers read the
//   parameter itself; a float32 persistable "<param>.master" (AmpMasterName) is declared in main
//   and startup; startup's ops write the master instead, and a cast master -> param is appended
//   to startup. Parameters read in float32 (batch/layer norm's Scale and Bias, black ops) stay
//   float32. o2_params() lists the parameters made low, in the order main declares them.
// Leaves alone: startup (without o2: parameters stay float32, O1), ops in sub-blocks, int and
//   bool inputs.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "framework/runtime/dtype.h"
#include "framework/runtime/place.h"
#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

struct AmpOptions {
  DType dtype = DType::kBFloat16;                // kBFloat16 or kFloat16
  Place::Kind place = Place::Kind::kCPU;         // whose kernels decide what runs low
  std::set<std::string> white_list, black_list;  // custom_white_list / custom_black_list
  // false: classify by the lists alone, whatever kernels `place` has (`keel inspect` of a program
  // for another machine; goldens). An op without its kernel then fails when it runs.
  bool check_kernels = true;
  // AMP O2: low-precision parameters with float32 masters (see above).
  bool o2 = false;
};

// The built-in lists (op types keel registers; Paddle's, for the ops keel has).
const std::set<std::string>& AmpWhiteList();
const std::set<std::string>& AmpBlackList();
const std::set<std::string>& AmpGrayList();

class AmpPass : public Pass {
 public:
  explicit AmpPass(AmpOptions options);
  std::string name() const override { return "amp"; }
  void Apply(Program& main, Program& startup) const override;
  // With o2, the parameters the last Apply made low.
  const std::vector<std::string>& o2_params() const { return o2_params_; }

 private:
  void MakeParametersLow(Program& main, Program& startup) const;
  AmpOptions options_;
  mutable std::vector<std::string> o2_params_;
};

// AMP O2's float32 master of a low-precision parameter: "<param>.master".
std::string AmpMasterName(const std::string& param);

// The suffix of a cast var made for `dtype`: "bf16", "fp16", "fp32".
std::string AmpDTypeSuffix(DType dtype);

}  // namespace transpiler
}  // namespace keel
