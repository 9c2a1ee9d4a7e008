// Elementwise reduction kernels of the UCX engine (one per supported dtype).
#ifndef TFDIST_CUSTOM_OPS_UCX_REDUCE_H_
#define TFDIST_CUSTOM_OPS_UCX_REDUCE_H_

#include <cstdint>

#include "Eigen/Core"
#include "ucx/transport.h"

namespace tfdist_ucx {
namespace reduce_internal {

template <typename T>
inline void Add(char* dst, const char* a, const char* b, int64_t n) {
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<Array>(reinterpret_cast<T*>(dst), n) =
      Eigen::Map<const Array>(reinterpret_cast<const T*>(a), n) +
      Eigen::Map<const Array>(reinterpret_cast<const T*>(b), n);
}

}  // namespace reduce_internal

// dst = a + b elementwise over `n` elements; `a` may be `dst`.
inline void Reduce(DType dtype, char* dst, const char* a, const char* b, int64_t n) {
  using reduce_internal::Add;
  switch (dtype) {
    case DType::kF16: return Add<Eigen::half>(dst, a, b, n);
    case DType::kBF16: return Add<Eigen::bfloat16>(dst, a, b, n);
    case DType::kF32: return Add<float>(dst, a, b, n);
    case DType::kF64: return Add<double>(dst, a, b, n);
    case DType::kI32: return Add<int32_t>(dst, a, b, n);
    case DType::kI64: return Add<int64_t>(dst, a, b, n);
  }
}

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_REDUCE_H_
