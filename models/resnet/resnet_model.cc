#include "models/resnet/resnet_model.h"

#include <memory>

#include "framework/dsl/nn_layers.h"
#include "framework/dsl/pipeline.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/dsl/tensor_parallel.h"
#include "framework/op/image_layout.h"

namespace keel {
namespace models {

namespace {

// batch_norm -> act in layout `fmt`; channels_sharded: a Column conv's share of the channels.
Var Bn(Var x, const std::string& act, const std::string& fmt, bool channels_sharded = false) {
  return layers::batch_norm(x, act, false, 0.9f, 1e-5f, {}, {}, false, false, channels_sharded,
                            fmt);
}

// conv (no bias: batch_norm follows) -> batch_norm -> act
Var ConvBn(Var x, int filters, int k, int stride, const std::string& act, const std::string& fmt) {
  Var c = layers::conv2d(x, filters, k, stride, (k - 1) / 2, 1, 1, "", {}, {}, /*with_bias=*/false,
                         layers::Parallel::kNone, fmt);
  return Bn(c, act, fmt);
}

// Under a TensorParallelGuard the two convolutions split Megatron-style, the channels playing the
// columns: the first holds this rank's share of the output channels (with its batch norm's), the
// second takes them and all-reduces its partial sums; the second batch norm, the shortcut and the
// sum are replicated. One all-reduce forward (the second conv's) and one backward (the first's
// input gradient) per block.
Var BasicBlock(Var x, int filters, int stride, const std::string& fmt) {
  Var h = layers::conv2d(x, filters, 3, stride, 1, 1, 1, "", {}, {}, /*with_bias=*/false,
                         layers::Parallel::kColumn, fmt);
  h = Bn(h, "relu", fmt, /*channels_sharded=*/true);
  h = layers::conv2d(h, filters, 3, 1, 1, 1, 1, "", {}, {}, /*with_bias=*/false,
                     layers::Parallel::kRow, fmt);
  h = Bn(h, "", fmt);
  Var shortcut = x;
  const int64_t channels = x.shape()[ChannelAxis(ParseImageLayout(fmt), 4)];
  if (stride != 1 || channels != filters) shortcut = ConvBn(x, filters, 1, stride, "", fmt);
  return layers::relu(layers::elementwise_add(h, shortcut));
}

}  // namespace

ClassifierOutputs resnet_cifar(Var image, Var label, int depth, int classes, int pp_degree,
                               const std::string& data_format) {
  KEEL_ENFORCE(depth >= 8 && (depth - 2) % 6 == 0, "resnet: depth must be 6n+2, got ", depth);
  KEEL_ENFORCE(data_format == "NCHW" || data_format == "NHWC", "resnet: data_format '", data_format,
               "' must be NCHW or NHWC");
  const int n = (depth - 2) / 6;
  const int tp = current_tensor_parallel().degree;
  KEEL_ENFORCE(16 % tp == 0, "resnet: the tensor-parallel degree ", tp,
               " must divide the 16 channels of its narrowest blocks");
  KEEL_ENFORCE(pp_degree >= 1 && pp_degree <= 3 * n, "resnet: pipeline degree ", pp_degree,
               " must be 1..", 3 * n, " (each stage holds whole basic blocks; depth ", depth,
               " has ", 3 * n, ")");
  // Without a pipeline no stage is marked: the ops are those of the plain model.
  std::unique_ptr<PipelineStageGuard> on_stage;
  auto block_stage = [&](int j) {
    if (pp_degree == 1) return;
    on_stage.reset();  // the previous guard first: guards restore what they found
    on_stage = std::make_unique<PipelineStageGuard>(j * pp_degree / (3 * n));
  };
  block_stage(0);
  // Channels last: the NCHW images transposed once, every layer after in NHWC.
  Var h = data_format == "NHWC" ? layers::transpose(image, {0, 2, 3, 1}) : image;
  h = ConvBn(h, 16, 3, 1, "relu", data_format);
  for (int stage = 0; stage < 3; ++stage)
    for (int b = 0; b < n; ++b) {
      block_stage(stage * n + b);
      h = BasicBlock(h, 16 << stage, stage > 0 && b == 0 ? 2 : 1, data_format);
      recompute_checkpoint(h);  // each block's output: recompute keeps these alone
    }
  h = layers::pool2d(h, 8, "avg", 1, 0, /*global_pooling=*/true, false, true, data_format);
  Var logits = layers::fc(h, classes);
  Var loss = layers::mean(layers::softmax_with_cross_entropy(logits, label));
  Var acc = layers::accuracy(layers::softmax(logits), label, 1);
  return {logits, loss, acc};
}

}  // namespace models
}  // namespace keel
