// Tensor: shape + dtype + a byte offset into a shared Allocation.
//
// Invariant: mutable_data() reuses the current allocation whenever it is large enough, so a tensor
// that is a view (a slice of a fused buffer) keeps writing into that buffer.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/runtime/allocator.h"
#include "framework/runtime/ddim.h"
#include "framework/runtime/dtype.h"
#include "framework/runtime/place.h"

namespace keel {

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, const DDim& dims, const Place& place = CPUPlace()) {
    Alloc(dtype, dims, place);
  }

  // A fresh CPU tensor holding `values` in `dims`.
  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, const DDim& dims) {
    KEEL_ENFORCE(dims.numel() == static_cast<int64_t>(values.size()), "FromVector: ", values.size(),
                 " values do not fill shape ", dims.str());
    Tensor t(DTypeOf<T>::value, dims);
    if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
    return t;
  }

  const DDim& dims() const { return dims_; }
  DType dtype() const { return dtype_; }
  const Place& place() const { return place_; }
  int64_t numel() const { return dims_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * SizeOf(dtype_); }
  bool initialized() const { return holder_ != nullptr; }
  const std::shared_ptr<Allocation>& holder() const { return holder_; }
  size_t offset() const { return offset_; }

  // Sets the shape without touching memory (the next mutable_data allocates if needed).
  Tensor& Resize(const DDim& dims) {
    dims_ = dims;
    return *this;
  }
  void set_dtype(DType t) { dtype_ = t; }

  // Storage for dims() x dtype at `place`, reusing the existing allocation when it fits.
  void* mutable_data(DType dtype, const Place& place = CPUPlace());
  template <typename T>
  T* mutable_data(const Place& place = CPUPlace()) {
    return static_cast<T*>(mutable_data(DTypeOf<T>::value, place));
  }
  // Allocates for dims x dtype; as mutable_data but sets the shape first.
  void* Alloc(DType dtype, const DDim& dims, const Place& place = CPUPlace()) {
    dims_ = dims;
    return mutable_data(dtype, place);
  }

  const void* raw_data() const {
    CHECK_INIT();
    return static_cast<const char*>(holder_->ptr()) + offset_;
  }
  void* raw_data() {
    CHECK_INIT();
    return static_cast<char*>(holder_->ptr()) + offset_;
  }
  template <typename T>
  const T* data() const {
    CheckType(DTypeOf<T>::value);
    return static_cast<const T*>(raw_data());
  }
  template <typename T>
  T* data() {
    CheckType(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }

  // The single element of a one-element tensor (CPU), converted to T.
  template <typename T>
  T item() const;

  // Makes `a` this tensor's memory (offset 0, a's place); the next mutable_data keeps it when it
  // is large enough.
  void ResetHolder(std::shared_ptr<Allocation> a) {
    place_ = a->place();
    holder_ = std::move(a);
    offset_ = 0;
  }
  // This tensor becomes another name for `src`'s memory (same allocation, offset, shape).
  void ShareDataWith(const Tensor& src) { *this = src; }
  // A view of rows [begin, end) of the first dimension, sharing memory.
  Tensor Slice(int64_t begin, int64_t end) const;
  // A view of `dims` starting `elem_offset` elements in, sharing memory.
  Tensor View(const DDim& dims, int64_t elem_offset = 0) const;
  // A deep copy (to `place`).
  Tensor Clone(const Place& place) const;
  Tensor Clone() const { return Clone(place_); }
  // Copies src's contents into this tensor's memory, which must already have src's size.
  void CopyFrom(const Tensor& src);
  // Releases memory; dims and dtype stay.
  void clear() {
    holder_.reset();
    offset_ = 0;
  }

  std::string DebugString(int max_elems = 8) const;

 private:
  void CHECK_INIT() const {
    KEEL_ENFORCE(holder_ != nullptr, "tensor of shape ", dims_.str(), " is not initialized");
  }
  void CheckType(DType t) const {
    KEEL_ENFORCE(t == dtype_, "tensor holds ", DTypeName(dtype_), ", accessed as ", DTypeName(t));
  }

  DDim dims_;
  DType dtype_ = DType::kFloat32;
  Place place_;
  std::shared_ptr<Allocation> holder_;
  size_t offset_ = 0;
};

// Calls f(T{}) with T the C++ type of a compute dtype; throws for storage-only types.
template <typename F>
decltype(auto) VisitDType(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32:
      return f(float{});
    case DType::kFloat64:
      return f(double{});
    case DType::kInt32:
      return f(int32_t{});
    case DType::kInt64:
      return f(int64_t{});
    case DType::kBool:
      return f(bool{});
    case DType::kUInt8:
      return f(uint8_t{});
    case DType::kInt8:
      return f(int8_t{});
    default:
      KEEL_THROW("no compute type for dtype ", DTypeName(t));
  }
}

template <typename T>
T Tensor::item() const {
  KEEL_ENFORCE(numel() == 1, "item() needs a one-element tensor, got shape ", dims_.str());
  KEEL_ENFORCE(place_.is_cpu(), "item() needs a CPU tensor, got ", place_.str());
  return VisitDType(dtype_, [&](auto v) -> T {
    using V = decltype(v);
    return static_cast<T>(*static_cast<const V*>(raw_data()));
  });
}

}  // namespace keel
