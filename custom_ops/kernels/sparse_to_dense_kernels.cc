// Kernels: TfdistSparseToDense.
//
// Sparse to dense: a vector of n zeros with values[j] added at indices[j]
// (duplicate indices add up); the inverse of the selection kernels' output.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/compression_common.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfdist {
namespace compression {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

template <typename T>
class SparseToDenseOp : public OpKernel {
 public:
  explicit SparseToDenseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values_t = ctx->input(0);
    const Tensor& indices_t = ctx->input(1);
    const Tensor& n_t = ctx->input(2);
    OP_REQUIRES(ctx, values_t.dims() == 1 && indices_t.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistSparseToDense: `values` and `indices` must be vectors; "
                    "received shapes ", values_t.shape().DebugString(), " and ",
                    indices_t.shape().DebugString(), ".")));
    OP_REQUIRES(ctx, values_t.NumElements() == indices_t.NumElements(),
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistSparseToDense: `values` and `indices` must have the same "
                    "length; received ", values_t.NumElements(), " values and ",
                    indices_t.NumElements(), " indices.")));
    OP_REQUIRES(ctx, n_t.dims() == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistSparseToDense: `n` must be a scalar; received shape ",
                    n_t.shape().DebugString(), ".")));
    const int64_t n = n_t.scalar<int32_t>()();
    OP_REQUIRES(ctx, n >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistSparseToDense: `n` must be >= 0; received n=", n, ".")));
    const int64_t count = indices_t.NumElements();
    const int32_t* indices = indices_t.flat<int32_t>().data();
    const T* values = values_t.flat<T>().data();

    // Find the first out-of-range index, if any (blocks in parallel).
    const int64_t check_blocks = NumBlocks(count, kStreamBlock);
    std::vector<int64_t> first_bad(check_blocks, -1);
    ParallelBlocks(ctx, check_blocks, [&](int64_t b) {
      const int64_t end = BlockBegin(b + 1, check_blocks, count);
      for (int64_t j = BlockBegin(b, check_blocks, count); j < end; ++j) {
        if (indices[j] < 0 || indices[j] >= n) {
          first_bad[b] = j;
          return;
        }
      }
    });
    for (int64_t bad : first_bad) {
      OP_REQUIRES(ctx, bad < 0,
                  absl::InvalidArgumentError(absl::StrCat(
                      "TfdistSparseToDense: indices[", bad, "] = ", indices[bad],
                      " is out of range [0, n) for n=", n, ".")));
    }

    Tensor* dense_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &dense_t));
    T* dense = dense_t->flat<T>().data();
    const int64_t fill_blocks = NumBlocks(n, kStreamBlock);
    ParallelBlocks(ctx, fill_blocks, [&](int64_t b) {
      const int64_t begin = BlockBegin(b, fill_blocks, n);
      std::fill(dense + begin, dense + BlockBegin(b + 1, fill_blocks, n), T(0));
    });
    for (int64_t j = 0; j < count; ++j) dense[indices[j]] += values[j];
  }
};

#define TFDIST_REGISTER_SPARSE_TO_DENSE(T)                                                \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("TfdistSparseToDense").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      SparseToDenseOp<T>);
TFDIST_REGISTER_SPARSE_TO_DENSE(float)
TFDIST_REGISTER_SPARSE_TO_DENSE(double)
#undef TFDIST_REGISTER_SPARSE_TO_DENSE

}  // namespace
}  // namespace compression
}  // namespace tfdist
