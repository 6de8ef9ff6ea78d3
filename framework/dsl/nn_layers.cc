#include "framework/dsl/nn_layers.h"

#include "framework/dsl/tensor_parallel.h"
#include "framework/op/image_layout.h"

namespace keel {
namespace layers {

namespace {

Program& Main() { return default_main_program(); }

// A fresh temporary "<prefix>.tmp_N" in the main program's global block.
std::string TmpName(const std::string& prefix) { return Main().UniqueName(prefix + ".tmp"); }

// Marks the named vars as carrying no gradient (statistics, masks).
void StopGradient(const std::vector<std::string>& names) {
  for (auto& n : names) Main().global_block().MustFindVar(n)->set_stop_gradient(true);
}

// The layout `attr` (data_format or data_layout) names; a keel::Error for any other value.
ImageLayout LayoutOf(const char* layer, Var input, const char* attr, const std::string& value) {
  KEEL_ENFORCE(IsImageLayoutName(value), "layers::", layer, "(", input.name(), "): ", attr, " '",
               value, "' must be NCHW or NHWC (AnyLayout: NCHW)");
  return ParseImageLayout(value);
}

// The channel count of an input in `layout` (dim 1, or the last), which must be known to size
// parameters.
int64_t Channels(const char* layer, Var input, int min_rank,
                 ImageLayout layout = ImageLayout::kNCHW) {
  const DDim d = input.shape();
  KEEL_ENFORCE(d.size() >= min_rank, "layers::", layer, "(", input.name(), "): input has shape ",
               d.str(), ", needs rank >= ", min_rank, " (", ImageLayoutName(layout), ")");
  const int axis = ChannelAxis(layout, d.size());
  KEEL_ENFORCE(d[axis] > 0, "layers::", layer, "(", input.name(), "): input shape ", d.str(),
               " has an unknown channel dim ", axis, " (", ImageLayoutName(layout), ")");
  return d[axis];
}

}  // namespace

Var conv2d(Var input, int num_filters, int filter_size, int stride, int padding, int dilation,
           int groups, const std::string& act, const ParamAttr& param_attr,
           const ParamAttr& bias_attr, bool with_bias, Parallel parallel,
           const std::string& data_format) {
  const ImageLayout layout = LayoutOf("conv2d", input, "data_format", data_format);
  const int64_t C = Channels("conv2d", input, 4, layout);
  KEEL_ENFORCE(num_filters > 0 && filter_size > 0 && groups > 0, "layers::conv2d(", input.name(),
               "): num_filters ", num_filters, ", filter_size ", filter_size, " and groups ",
               groups, " must be positive");
  KEEL_ENFORCE(C % groups == 0 && num_filters % groups == 0, "layers::conv2d(", input.name(),
               "): input channels ", C, " and num_filters ", num_filters, " must divide by groups ",
               groups, " (input ", input.shape().str(), ")");
  Program& prog = Main();
  Block& block = prog.global_block();
  const std::string layer = prog.UniqueName("conv2d");
  const DType dt = input.dtype();
  const int tp = current_tensor_parallel().degree;
  if (tp == 1) parallel = Parallel::kNone;
  const bool column = parallel == Parallel::kColumn, row = parallel == Parallel::kRow;
  KEEL_ENFORCE(parallel == Parallel::kNone || groups == 1, "layers::conv2d(", input.name(),
               "): a tensor-parallel convolution (parallel=", column ? "Column" : "Row",
               ") takes groups=1, got ", groups);
  KEEL_ENFORCE(!column || num_filters % tp == 0, "layers::conv2d(", input.name(),
               ", parallel=Column): num_filters ", num_filters,
               " does not divide by the tensor-parallel degree ", tp);
  // The whole layer's W is [num_filters, C', k, k], C' the whole layer's input channels (a row
  // layer's input is this rank's C of them).
  const std::vector<int64_t> whole = {num_filters, (row ? C * tp : C) / groups, filter_size,
                                      filter_size};
  Var w = parallel == Parallel::kNone
              ? create_parameter(whole, dt, layer, "w_0", param_attr, initializer::MSRA())
              : create_sharded_parameter(whole, column ? 0 : 1, dt, layer, "w_0", param_attr,
                                         initializer::MSRA());
  if (column) input = c_identity(input);
  std::string out = prog.UniqueName(layer + ".tmp");
  AppendOp(block, "conv2d", {{"Input", {input.name()}}, {"Filter", {w.name()}}},
           {{"Output", {out}}},
           {{"strides", std::vector<int>{stride, stride}},
            {"paddings", std::vector<int>{padding, padding}},
            {"dilations", std::vector<int>{dilation, dilation}},
            {"groups", groups},
            {"data_format", std::string(ImageLayoutName(layout))}});
  if (row) out = mp_allreduce_sum(Var(&block, out)).name();
  if (with_bias) {
    Var b = column ? create_sharded_parameter({num_filters}, 0, dt, layer, "b_0", bias_attr,
                                              initializer::Constant(0.0f))
                   : create_parameter({num_filters}, dt, layer, "b_0", bias_attr,
                                      initializer::Constant(0.0f));
    std::string sum = prog.UniqueName(layer + ".tmp");
    AppendOp(block, "elementwise_add", {{"X", {out}}, {"Y", {b.name()}}}, {{"Out", {sum}}},
             {{"axis", ChannelAxis(layout, 4)}});
    out = sum;
  }
  return activation(Var(&block, out), act);
}

Var pool2d(Var input, int pool_size, const std::string& pool_type, int pool_stride,
           int pool_padding, bool global_pooling, bool ceil_mode, bool exclusive,
           const std::string& data_format) {
  const ImageLayout layout = LayoutOf("pool2d", input, "data_format", data_format);
  Program& prog = Main();
  Block& block = prog.global_block();
  std::string out = TmpName(prog.UniqueName("pool2d"));
  AppendOp(block, "pool2d", {{"X", {input.name()}}}, {{"Out", {out}}},
           {{"pooling_type", pool_type},
            {"ksize", std::vector<int>{pool_size, pool_size}},
            {"strides", std::vector<int>{pool_stride, pool_stride}},
            {"paddings", std::vector<int>{pool_padding, pool_padding}},
            {"global_pooling", global_pooling},
            {"ceil_mode", ceil_mode},
            {"exclusive", exclusive},
            {"data_format", std::string(ImageLayoutName(layout))}});
  return Var(&block, out);
}

Var batch_norm(Var input, const std::string& act, bool is_test, float momentum, float epsilon,
               const ParamAttr& param_attr, const ParamAttr& bias_attr, bool use_global_stats,
               bool sync, bool channels_sharded, const std::string& data_layout) {
  const ImageLayout layout = LayoutOf("batch_norm", input, "data_layout", data_layout);
  const int64_t C = Channels("batch_norm", input, 2, layout);
  Program& prog = Main();
  Block& block = prog.global_block();
  const std::string layer = prog.UniqueName("batch_norm");
  const DType dt = input.dtype();
  const int tp = channels_sharded ? current_tensor_parallel().degree : 1;
  KEEL_ENFORCE(tp == 1 || !sync, "layers::batch_norm(", input.name(),
               "): sync and channels_sharded together are not built in the DSL; use "
               "DistributedStrategy::sync_batch_norm, which syncs each shard over its "
               "data-parallel ring and checks the job has replicas to sync with");
  // This rank's C channels of the layer's tp * C (tp = 1: all of them).
  auto param = [&](const char* suffix, const ParamAttr& attr, float value) {
    return tp == 1 ? create_parameter({C}, dt, layer, suffix, attr, initializer::Constant(value))
                   : create_sharded_parameter({C * tp}, 0, dt, layer, suffix, attr,
                                              initializer::Constant(value));
  };
  Var scale = param("w_0", param_attr, 1.0f);
  Var bias = param("b_0", bias_attr, 0.0f);
  // Moving stats: persistable, saved with the model, never trained.
  Var mean = param("w_1", ParamAttr("", nullptr, false), 0.0f);
  Var var = param("w_2", ParamAttr("", nullptr, false), 1.0f);
  const std::string y = prog.UniqueName(layer + ".tmp");
  const std::string saved_mean = prog.UniqueName(layer + ".tmp");
  const std::string saved_var = prog.UniqueName(layer + ".tmp");
  const bool synced = sync && !is_test && !use_global_stats;  // ring_id: 0, its default
  AppendOp(block, synced ? "sync_batch_norm" : "batch_norm",
           {{"X", {input.name()}},
            {"Scale", {scale.name()}},
            {"Bias", {bias.name()}},
            {"Mean", {mean.name()}},
            {"Variance", {var.name()}}},
           {{"Y", {y}},
            {"MeanOut", {mean.name()}},
            {"VarianceOut", {var.name()}},
            {"SavedMean", {saved_mean}},
            {"SavedVariance", {saved_var}}},
           {{"momentum", momentum},
            {"epsilon", epsilon},
            {"is_test", is_test},
            {"use_global_stats", use_global_stats},
            {"data_layout", std::string(ImageLayoutName(layout))}});
  StopGradient({saved_mean, saved_var});
  return activation(Var(&block, y), act);
}

Var dropout(Var x, float dropout_prob, bool is_test, int seed,
            const std::string& dropout_implementation) {
  Program& prog = Main();
  Block& block = prog.global_block();
  const std::string layer = prog.UniqueName("dropout");
  const std::string out = prog.UniqueName(layer + ".tmp");
  const std::string mask = prog.UniqueName(layer + ".tmp");
  AppendOp(block, "dropout", {{"X", {x.name()}}}, {{"Out", {out}}, {"Mask", {mask}}},
           {{"dropout_prob", dropout_prob},
            {"is_test", is_test},
            {"seed", seed},
            {"fix_seed", seed != 0},
            {"dropout_implementation", dropout_implementation}});
  StopGradient({mask});
  return Var(&block, out);
}

Var layer_norm(Var input, int begin_norm_axis, float epsilon, const ParamAttr& param_attr,
               const ParamAttr& bias_attr) {
  const DDim d = input.shape();
  KEEL_ENFORCE(begin_norm_axis >= 1 && begin_norm_axis < d.size(), "layers::layer_norm(",
               input.name(), "): begin_norm_axis ", begin_norm_axis, " must lie in [1, ", d.size(),
               ") for input ", d.str());
  int64_t R = 1;
  for (int i = begin_norm_axis; i < d.size(); ++i) {
    KEEL_ENFORCE(d[i] > 0, "layers::layer_norm(", input.name(), "): input shape ", d.str(),
                 " has an unknown dim ", i, " among the normalized ones");
    R *= d[i];
  }
  Program& prog = Main();
  Block& block = prog.global_block();
  const std::string layer = prog.UniqueName("layer_norm");
  const DType dt = input.dtype();
  Var scale = create_parameter({R}, dt, layer, "w_0", param_attr, initializer::Constant(1.0f));
  Var bias = create_parameter({R}, dt, layer, "b_0", bias_attr, initializer::Constant(0.0f));
  const std::string y = prog.UniqueName(layer + ".tmp");
  const std::string mean = prog.UniqueName(layer + ".tmp");
  const std::string var = prog.UniqueName(layer + ".tmp");
  AppendOp(block, "layer_norm",
           {{"X", {input.name()}}, {"Scale", {scale.name()}}, {"Bias", {bias.name()}}},
           {{"Y", {y}}, {"Mean", {mean}}, {"Variance", {var}}},
           {{"begin_norm_axis", begin_norm_axis}, {"epsilon", epsilon}});
  StopGradient({mean, var});
  return Var(&block, y);
}

}  // namespace layers
}  // namespace keel
