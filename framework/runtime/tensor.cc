#include "framework/runtime/tensor.h"

#include <algorithm>
#include <sstream>

#include "framework/runtime/float16.h"

namespace keel {

void* Tensor::mutable_data(DType dtype, const Place& place) {
  KEEL_ENFORCE(dims_.known(), "cannot allocate a tensor of unknown shape ", dims_.str());
  dtype_ = dtype;
  int64_t bytes = 0;
  KEEL_ENFORCE(!__builtin_mul_overflow(dims_.numel(), static_cast<int64_t>(SizeOf(dtype)), &bytes),
               "a tensor of shape ", dims_.str(), " and dtype ", DTypeName(dtype),
               " needs more than 2^63 bytes");
  size_t need = static_cast<size_t>(bytes);
  if (holder_ == nullptr || holder_->place() != place || holder_->size() < offset_ + need) {
    holder_ = Allocate(place, need);
    offset_ = 0;
  }
  place_ = place;
  return static_cast<char*>(holder_->ptr()) + offset_;
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  KEEL_ENFORCE(dims_.size() >= 1, "Slice needs rank >= 1, got shape ", dims_.str());
  KEEL_ENFORCE(0 <= begin && begin <= end && end <= dims_[0], "Slice [", begin, ", ", end,
               ") outside first dimension of ", dims_.str());
  DDim d = dims_;
  d[0] = end - begin;
  return View(d, begin * dims_.prod(1, dims_.size()));
}

Tensor Tensor::View(const DDim& dims, int64_t elem_offset) const {
  CHECK_INIT();
  size_t off = offset_ + static_cast<size_t>(elem_offset) * SizeOf(dtype_);
  KEEL_ENFORCE(off + dims.numel() * SizeOf(dtype_) <= holder_->size(), "view of ", dims.str(),
               " at element ", elem_offset, " exceeds the allocation of ", holder_->size(),
               " bytes");
  Tensor t = *this;
  t.dims_ = dims;
  t.offset_ = off;
  return t;
}

Tensor Tensor::Clone(const Place& place) const {
  Tensor t;
  t.Alloc(dtype_, dims_, place);
  if (initialized()) MemCopy(place, t.raw_data(), place_, raw_data(), nbytes());
  return t;
}

void Tensor::CopyFrom(const Tensor& src) {
  KEEL_ENFORCE(src.dims_.numel() == dims_.numel() && src.dtype_ == dtype_,
               "CopyFrom: ", DTypeName(src.dtype_), src.dims_.str(), " into ", DTypeName(dtype_),
               dims_.str());
  MemCopy(place_, raw_data(), src.place_, src.raw_data(), nbytes());
}

std::string Tensor::DebugString(int max_elems) const {
  std::ostringstream os;
  os << DTypeName(dtype_) << dims_.str();
  if (!initialized() || !place_.is_cpu()) return os.str();
  os << " {";
  int64_t n = std::min<int64_t>(numel(), max_elems);
  auto print = [&](auto v) {
    using V = decltype(v);
    const V* p = static_cast<const V*>(raw_data());
    for (int64_t i = 0; i < n; ++i) os << (i ? ", " : "") << +Widen(p[i]);
  };
  if (dtype_ == DType::kFloat16) {
    print(float16{});
  } else if (dtype_ == DType::kBFloat16) {
    print(bfloat16{});
  } else {
    VisitDType(dtype_, print);
  }
  if (numel() > n) os << ", ...";
  os << "}";
  return os.str();
}

}  // namespace keel
