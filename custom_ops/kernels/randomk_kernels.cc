// Kernels: TfdistRandomK.
//
// Random-k: a uniformly random k-subset of the positions (Floyd's algorithm on a
// bitmap, from (seed, n, k) alone), emitted in index order with its values.
// Argument checks shared with top-k: sparsify_common.h.
#include <cstdint>
#include <vector>

#include "kernels/compression_common.h"
#include "kernels/sparsify_common.h"
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
class RandomKOp : public OpKernel {
 public:
  explicit RandomKOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t n, k, seed;
    OP_REQUIRES_OK(ctx, ReadSelectArgs(ctx, "TfdistRandomK", &n, &k));
    OP_REQUIRES_OK(ctx, ReadSeed(ctx, 2, "TfdistRandomK", &seed));
    const T* x = ctx->input(0).flat<T>().data();
    Tensor* values_t = nullptr;
    Tensor* indices_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &values_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({k}), &indices_t));
    if (k == 0) return;
    T* values = values_t->flat<T>().data();
    int32_t* indices = indices_t->flat<int32_t>().data();

    // Floyd's algorithm marks a uniformly random m-subset in a bitmap: for j in
    // [n - m, n) draw t in [0, j]; mark t, or j if t is already marked. With
    // k > n / 2 it draws the n - k positions left out instead.
    const bool complement = k > n / 2;
    const int64_t m = complement ? n - k : k;
    const int64_t words = (n + 63) / 64;
    std::vector<uint64_t> bitmap(words, 0);
    const CounterRng rng(seed, Stream::kRandomK);
    for (int64_t j = n - m; j < n; ++j) {
      const uint64_t t = rng.Below(static_cast<uint64_t>(j), static_cast<uint64_t>(j) + 1);
      const uint64_t pick = ((bitmap[t >> 6] >> (t & 63)) & 1) ? static_cast<uint64_t>(j) : t;
      bitmap[pick >> 6] |= uint64_t{1} << (pick & 63);
    }
    if (complement) {
      for (uint64_t& word : bitmap) word = ~word;
      if (n % 64 != 0) bitmap[words - 1] &= (uint64_t{1} << (n % 64)) - 1;
    }
    // Emit marked positions in order: per block of words, count, then write.
    const int64_t blocks = NumBlocks(words, 2048);
    std::vector<int64_t> offset(blocks + 1, 0);
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      int64_t count = 0;
      for (int64_t w = BlockBegin(b, blocks, words); w < BlockBegin(b + 1, blocks, words); ++w) {
        count += __builtin_popcountll(bitmap[w]);
      }
      offset[b + 1] = count;
    });
    for (int64_t b = 0; b < blocks; ++b) offset[b + 1] += offset[b];
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      int64_t out = offset[b];
      for (int64_t w = BlockBegin(b, blocks, words); w < BlockBegin(b + 1, blocks, words); ++w) {
        for (uint64_t word = bitmap[w]; word != 0; word &= word - 1) {
          const int64_t i = w * 64 + __builtin_ctzll(word);
          indices[out] = static_cast<int32_t>(i);
          values[out] = x[i];
          ++out;
        }
      }
    });
  }
};

#define TFDIST_REGISTER_RANDOM_K(T)                                                 \
  REGISTER_KERNEL_BUILDER(                                                          \
      Name("TfdistRandomK").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      RandomKOp<T>);
TFDIST_REGISTER_RANDOM_K(float)
TFDIST_REGISTER_RANDOM_K(double)
TFDIST_REGISTER_RANDOM_K(Eigen::half)
TFDIST_REGISTER_RANDOM_K(Eigen::bfloat16)
#undef TFDIST_REGISTER_RANDOM_K

}  // namespace
}  // namespace compression
}  // namespace tfdist
