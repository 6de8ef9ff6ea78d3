// layers::: the model-building calls. Each appends ops to the current main program (and, for
// parameters, initializer ops to the current startup program) and returns the output Var.
// Shapes are checked as each call appends its op, so a wrong shape fails at the user's line.
#pragma once

#include <string>
#include <vector>

#include "framework/dsl/initializer.h"
#include "framework/dsl/program_guard.h"

namespace keel {

struct ParamAttr {
  std::string name;                      // empty: "<layer>_N.w_0" / ".b_0"
  initializer::Initializer initializer;  // empty: the layer's default
  bool trainable = true;
  ParamAttr() = default;
  ParamAttr(const char* n) : name(n) {}  // NOLINT: ParamAttr("fc1.w") reads naturally
  ParamAttr(std::string n, initializer::Initializer init = nullptr, bool train = true)
      : name(std::move(n)), initializer(std::move(init)), trainable(train) {}
};

namespace layers {

// A user-fed input. Dims of -1 match any size at feed time (the batch).
Var data(const std::string& name, const std::vector<int64_t>& shape, DType dtype = DType::kFloat32,
         bool stop_gradient = true);

// A persistable parameter in main and startup, initialized by `attr.initializer` or `default_init`.
Var create_parameter(const std::vector<int64_t>& shape, DType dtype, const std::string& layer,
                     const std::string& suffix, const ParamAttr& attr,
                     const initializer::Initializer& default_init);

// How fc splits over the current tensor-parallel group (framework/dsl/tensor_parallel.h), as
// Megatron-LM does; with degree 1 every choice is the plain fc.
enum class Parallel {
  kNone,    // every rank holds all of W and b
  kColumn,  // W [in, size / n] and b [size / n] are this rank's columns: out = act(c_identity(x)
            // * W + b) is this rank's part of the output (size / n wide); c_identity all-reduces
            // x's gradient
  kRow,     // x is this rank's part of the input (in / n wide, e.g. a column layer's output), W
            // [in / n, size] its rows: out = act(mp_allreduce_sum(x * W) + b), b whole, added once
            // after the sum
};

// out = act(flatten(x, num_flatten_dims) * W + b); W: Xavier, b: zeros.
Var fc(Var x, int size, const std::string& act = "", int num_flatten_dims = 1,
       const ParamAttr& param_attr = {}, const ParamAttr& bias_attr = {}, bool with_bias = true,
       Parallel parallel = Parallel::kNone);

// Applies the named activation ("" is identity): tanh, relu, sigmoid, softmax.
Var activation(Var x, const std::string& act);
Var tanh(Var x);
Var relu(Var x);
Var sigmoid(Var x);
Var softmax(Var x, int axis = -1);

Var cross_entropy(Var input, Var label, bool soft_label = false, int ignore_index = -100);
Var softmax_with_cross_entropy(Var logits, Var label, bool soft_label = false,
                               int ignore_index = -100);
Var mean(Var x);
Var reduce_sum(Var x, std::vector<int> dim = {}, bool keep_dim = false);
Var reduce_mean(Var x, std::vector<int> dim = {}, bool keep_dim = false);
Var scale(Var x, float scale = 1.0f, float bias = 0.0f, bool bias_after_scale = true);
Var elementwise_add(Var x, Var y, int axis = -1);
Var elementwise_sub(Var x, Var y, int axis = -1);
Var elementwise_mul(Var x, Var y, int axis = -1);
Var elementwise_div(Var x, Var y, int axis = -1);
Var mul(Var x, Var y, int x_num_col_dims = 1, int y_num_col_dims = 1);
Var matmul(Var x, Var y, bool transpose_x = false, bool transpose_y = false, float alpha = 1.0f);
Var sums(const std::vector<Var>& xs);
Var cast(Var x, DType dtype);
Var reshape(Var x, const std::vector<int>& shape);
Var fill_constant(const std::vector<int64_t>& shape, DType dtype, float value);

}  // namespace layers
}  // namespace keel
