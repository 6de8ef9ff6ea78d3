// layers:: for convolutional and normalized nets: conv2d, pool2d, batch_norm, dropout, layer_norm
// (Paddle Fluid 1.x signatures). Like layers.h, each call appends its op(s) to the current main
// program, parameters' initializers to the startup program, and checks shapes as it appends. Inputs
// are NCHW, or channels last ([N, H, W, C]) where a layer's data_format / data_layout says NHWC
// (docs/channels-last.md); the parameters are the same in either layout.
#pragma once

#include <string>

#include "framework/dsl/layers.h"

namespace keel {
namespace layers {

// out = act(conv2d(input, W) + b): W [num_filters, C / groups, filter_size, filter_size] (MSRA
// normal by default), b [num_filters] (zeros) added along the channel dim. `parallel` splits it
// over the current tensor-parallel group as fc does (layers.h; degree 1: the plain conv2d), the
// channels playing the columns: Column holds num_filters / n of the output channels (W and b
// sharded on dim 0, the input through c_identity); Row takes this rank's C input channels of the
// layer's n * C (W sharded on dim 1), all-reduces the partial sums, then adds the whole b. Both
// need groups = 1; the initial W is the whole layer's, split (so TP = n starts as TP = 1).
// data_format "NHWC": input [N, H, W, C], out [N, Ho, Wo, num_filters], b added along the last dim.
Var conv2d(Var input, int num_filters, int filter_size, int stride = 1, int padding = 0,
           int dilation = 1, int groups = 1, const std::string& act = "",
           const ParamAttr& param_attr = {}, const ParamAttr& bias_attr = {}, bool with_bias = true,
           Parallel parallel = Parallel::kNone, const std::string& data_format = "NCHW");

// pool_type "max" or "avg"; exclusive: avg ignores padded positions. data_format "NHWC": input
// [N, H, W, C].
Var pool2d(Var input, int pool_size, const std::string& pool_type = "max", int pool_stride = 1,
           int pool_padding = 0, bool global_pooling = false, bool ceil_mode = false,
           bool exclusive = true, const std::string& data_format = "NCHW");

// out = act(batch_norm(input)) over dim 1 (NHWC: the last): scale "<layer>.w_0" (ones), bias
// "<layer>.b_0" (zeros), moving mean "<layer>.w_1" (zeros) and variance "<layer>.w_2" (ones),
// persistable and not trained, updated in place by each training step. use_global_stats: training
// normalizes with the moving stats too and leaves them unchanged (fine-tuning with frozen
// statistics). sync: in training (not is_test, not use_global_stats) the op is sync_batch_norm on
// ring 0, whose statistics are those of every rank's batch together (docs/sync-batch-norm.md);
// alone in its job it computes batch_norm's result (with the unbiased moving variance).
// channels_sharded: the input's C channels are this rank's share of a Column conv2d's output
// (tensor parallelism): scale, bias and the moving statistics are this rank's C of the layer's n *
// C, sharded on dim 0 (a channel's statistics need no other rank's channels, so the result is TP =
// 1's); not with sync. data_layout "NHWC": the channels are the input's last dim.
Var batch_norm(Var input, const std::string& act = "", bool is_test = false, float momentum = 0.9f,
               float epsilon = 1e-5f, const ParamAttr& param_attr = {},
               const ParamAttr& bias_attr = {}, bool use_global_stats = false, bool sync = false,
               bool channels_sharded = false, const std::string& data_layout = "NCHW");

// dropout_implementation "upscale_in_train" (default) or "downgrade_in_infer"; seed 0: from the
// program's random_seed.
Var dropout(Var x, float dropout_prob, bool is_test = false, int seed = 0,
            const std::string& dropout_implementation = "upscale_in_train");

// Normalizes over the dims from begin_norm_axis; scale "<layer>.w_0" (ones) and bias "<layer>.b_0"
// (zeros) of that many elements.
Var layer_norm(Var input, int begin_norm_axis = 1, float epsilon = 1e-5f,
               const ParamAttr& param_attr = {}, const ParamAttr& bias_attr = {});

}  // namespace layers
}  // namespace keel
