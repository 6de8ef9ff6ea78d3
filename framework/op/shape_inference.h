// InferShapeContext: what a shape function sees. One function serves both at build time (over
// VarDescs, where -1 is an unknown batch dim) and at run time (over tensors).
#pragma once

#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/ir/program.h"
#include "framework/runtime/ddim.h"
#include "framework/runtime/dtype.h"

namespace keel {

class InferShapeContext {
 public:
  virtual ~InferShapeContext() = default;

  virtual const OpDesc& op() const = 0;
  virtual bool IsRuntime() const = 0;

  bool HasInput(const std::string& slot) const { return NumInputs(slot) > 0; }
  // True when the output slot has a real (non-@EMPTY@) var at index i.
  bool HasOutput(const std::string& slot, int i = 0) const;
  int NumInputs(const std::string& slot) const;
  int NumOutputs(const std::string& slot) const {
    return static_cast<int>(op().Output(slot).size());
  }
  const std::string& InputName(const std::string& slot, int i = 0) const;

  virtual DDim GetInputDim(const std::string& slot, int i = 0) const = 0;
  virtual DType GetInputDType(const std::string& slot, int i = 0) const = 0;
  virtual void SetOutputDim(const std::string& slot, const DDim& dims, int i = 0) = 0;
  virtual void SetOutputDType(const std::string& slot, DType dtype, int i = 0) = 0;

  std::vector<DDim> GetInputsDim(const std::string& slot) const;
  // Output `out` gets the shape and dtype of input `in`.
  void ShareDimAndDType(const std::string& in, const std::string& out, int i = 0) {
    SetOutputDim(out, GetInputDim(in, i), i);
    SetOutputDType(out, GetInputDType(in, i), i);
  }
  template <typename T>
  const T& Attr(const std::string& name) const {
    return op().Attr<T>(name);
  }

  // Dims equal, where at build time -1 matches anything.
  bool DimEq(int64_t a, int64_t b) const { return a == b || (!IsRuntime() && (a < 0 || b < 0)); }
  bool DimsEq(const DDim& a, const DDim& b) const;
};

// The dtype output `slot` of `op` gets when its shape function computes `computed` and its var is
// `declared`: `declared` where the op narrows that slot (OpTraits::narrows_outputs), `computed`
// is float32 and `declared` float16 or bfloat16; else `computed`. (Defined with the registry.)
DType NarrowedDType(const OpDesc& op, const std::string& slot, DType declared, DType computed);

}  // namespace keel

// Throws keel::Error from a shape function; the caller prefixes the op type and its vars.
#define KEEL_SHAPE_CHECK(cond, ...) KEEL_ENFORCE(cond, __VA_ARGS__)
