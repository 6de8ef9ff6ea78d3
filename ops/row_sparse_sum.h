// The sum of row-sparse addends (the gradients of is_sparse embeddings), shared by `sum` with
// row_sparse (gradients of one table summed on a trainer) and the parameter servers'
// `merge_sparse_grad` (the trainers' parts of one gradient): Out's rows are the union of the
// inputs' rows, sorted and unique; each is the sum over the inputs holding it, in input order,
// then times `scale`. CPU tensors of T.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "framework/op/execution_context.h"

namespace keel {

template <typename T>
void SumRowSparseInputs(ExecutionContext& ctx, T scale) {
  const std::string& op = ctx.op().type();
  const int n = ctx.NumInputs("X");
  std::vector<int64_t> rows;
  int64_t height = -1, width = -1;
  for (int i = 0; i < n; ++i) {
    const Variable* v = ctx.InputVar("X", i);
    KEEL_ENFORCE(v != nullptr && v->is_row_sparse(), "op ", op, ": X[", i, "] ('",
                 ctx.op().Input("X")[i], "') holds a dense tensor, not rows");
    const Tensor& t = ctx.Input("X", i);
    KEEL_ENFORCE(height < 0 || v->height() == height, "op ", op, ": X[", i, "] stands for ",
                 v->height(), " rows, X[0] for ", height);
    height = v->height();
    if (t.dims()[0] > 0) {
      const int64_t w = t.numel() / t.dims()[0];
      KEEL_ENFORCE(width < 0 || w == width, "op ", op, ": X[", i, "]'s rows are ", w,
                   " wide, earlier ones ", width);
      width = w;
    }
    rows.insert(rows.end(), v->rows().begin(), v->rows().end());
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  if (width < 0) width = 0;
  // Summed aside first: Out may be one of the inputs.
  std::vector<T> sum(rows.size() * width, T(0));
  for (int i = 0; i < n; ++i) {
    const Variable* v = ctx.InputVar("X", i);
    const T* x = ctx.Input("X", i).data<T>();
    for (size_t k = 0; k < v->rows().size(); ++k) {
      const int64_t at = std::lower_bound(rows.begin(), rows.end(), v->rows()[k]) - rows.begin();
      for (int64_t j = 0; j < width; ++j) sum[at * width + j] += x[k * width + j];
    }
  }
  if (scale != T(1))
    for (T& s : sum) s *= scale;
  Tensor* out = ctx.Output("Out");
  DDim dims = ctx.Input("X", 0).dims();
  dims[0] = static_cast<int64_t>(rows.size());
  out->Resize(dims);
  std::copy(sum.begin(), sum.end(), out->mutable_data<T>(ctx.place()));
  ctx.OutputVar("Out")->SetRows(height, std::move(rows));
}

}  // namespace keel
