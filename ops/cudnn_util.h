// What the cuDNN op files share (CUDA builds only): the cuDNN data type of T, owning descriptor
// wrappers, and NCHW or NHWC tensor descriptors from DDims. cuDNN 9 keeps this "legacy" descriptor
// API beside its graph API; keel uses it because conv, pool and batch_norm map onto it one call
// each.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <type_traits>

#include "framework/runtime/cuda_context.h"
#include "framework/runtime/ddim.h"
#include "framework/runtime/float16.h"

namespace keel {

template <typename T>
constexpr cudnnDataType_t CudnnType() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || kIsHalf<T>,
                "float, double or a 16-bit float");
  return std::is_same_v<T, double>     ? CUDNN_DATA_DOUBLE
         : std::is_same_v<T, float16>  ? CUDNN_DATA_HALF
         : std::is_same_v<T, bfloat16> ? CUDNN_DATA_BFLOAT16
                                       : CUDNN_DATA_FLOAT;
}

// alpha/beta scalars: cuDNN reads double for double data and float for the others (the 16-bit
// types included).
template <typename T>
struct CudnnScalars {
  Acc<T> one = 1, zero = 0;
};

class TensorDesc {
 public:
  TensorDesc() { KEEL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_)); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  // [n, c, h, w], packed NCHW, or with CUDNN_TENSOR_NHWC packed channels last (the dims still
  // name n, c, h, w).
  void Set(cudnnDataType_t t, int64_t n, int64_t c, int64_t h, int64_t w,
           cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW) {
    KEEL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_, format, t, int(n), int(c), int(h), int(w)));
  }
  // A 4-D [N, C, H, W] tensor (its NCHW dims), laid out as `format` says.
  void Set4d(cudnnDataType_t t, const DDim& d, cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW) {
    Set(t, d[0], d[1], d[2], d[3], format);
  }
  // [N, C, ...] as [N, C, S, 1] with S the product of the trailing dims (1 for [N, C]): what a
  // per-channel op such as batch_norm sees is the same.
  void SetPerChannel(cudnnDataType_t t, const DDim& d) {
    Set(t, d[0], d[1], d.prod(2, d.size()), 1);
  }
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

class FilterDesc {
 public:
  FilterDesc() { KEEL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d_)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  // [M, C / groups, kh, kw]; CUDNN_TENSOR_NHWC: the memory holds [M, kh, kw, C / groups].
  void Set(cudnnDataType_t t, const DDim& f, cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW) {
    KEEL_CUDNN_CHECK(
        cudnnSetFilter4dDescriptor(d_, t, format, int(f[0]), int(f[1]), int(f[2]), int(f[3])));
  }
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc() { KEEL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d_)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return d_; }

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

class PoolDesc {
 public:
  PoolDesc() { KEEL_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&d_)); }
  ~PoolDesc() { cudnnDestroyPoolingDescriptor(d_); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
  cudnnPoolingDescriptor_t get() const { return d_; }

 private:
  cudnnPoolingDescriptor_t d_ = nullptr;
};

}  // namespace keel
