// Helpers shared by the quantization kernels (QSGD, TernGrad, scaled sign, 8-bit
// min-max, generic bit packing): argument checks, chunked packing loops, and the
// vectorized reductions the encoders start with.
//
// Every encoder is one reduction pass (norm, max, mean or min/max, per block of a
// size fixed by n, combined in block order) and one pass that computes a chunk
// of codes into a small buffer with a vectorizable loop and packs it; every
// decoder unpacks a chunk and expands it. Stochastic rounding draws element i's
// uniform number from (seed, i) alone, so the codes do not depend on the
// thread count.
#ifndef TFDIST_CUSTOM_OPS_KERNELS_QUANTIZE_COMMON_H_
#define TFDIST_CUSTOM_OPS_KERNELS_QUANTIZE_COMMON_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/compression_common.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfdist {
namespace compression {

inline absl::Status RequireVector(const tensorflow::Tensor& t, const char* op, const char* arg) {
  if (t.dims() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `", arg, "` must be a vector (the Python wrapper flattens tensors); "
        "received shape ", t.shape().DebugString(), "."));
  }
  return absl::OkStatus();
}

inline absl::Status RequireScalar(const tensorflow::Tensor& t, const char* op, const char* arg) {
  if (t.dims() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `", arg, "` must be a scalar; received shape ", t.shape().DebugString(),
        "."));
  }
  return absl::OkStatus();
}

// Reads the element count n (scalar input `n_input`) of a decoder and checks that
// `packed` holds exactly ceil(n * bits / 8) bytes.
inline absl::Status ReadDecodeArgs(tensorflow::OpKernelContext* ctx, const char* op,
                                   int packed_input, int n_input, int bits, int64_t* n) {
  const tensorflow::Tensor& packed = ctx->input(packed_input);
  TF_RETURN_IF_ERROR(RequireVector(packed, op, "packed"));
  TF_RETURN_IF_ERROR(RequireScalar(ctx->input(n_input), op, "n"));
  *n = ctx->input(n_input).scalar<int32_t>()();
  if (*n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": `n` must be >= 0; received n=", *n, "."));
  }
  const int64_t want = PackedBytes(*n, bits);
  if (packed.NumElements() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `packed` has ", packed.NumElements(), " bytes but n=", *n, " codes of ",
        bits, " bits need ", want, ". Pass the n (and levels) used to encode."));
  }
  return absl::OkStatus();
}

// Runs fn(begin, count) over chunks of at most kChunk elements; chunks start at
// multiples of 8, so each one packs into its own bytes. Blocks depend only on n.
template <typename Fn>
void ForChunks(tensorflow::OpKernelContext* ctx, int64_t n, const Fn& fn) {
  const int64_t groups = NumGroups(n);
  const int64_t blocks = NumBlocks(groups, kStreamBlock / 8);
  ParallelBlocks(ctx, blocks, [&](int64_t b) {
    const int64_t begin = BlockBegin(b, blocks, groups) * 8;
    const int64_t end = std::min(BlockBegin(b + 1, blocks, groups) * 8, n);
    for (int64_t c = begin; c < end; c += kChunk) fn(c, std::min(kChunk, end - c));
  });
}

// GCC/Clang vector types: the reductions below use them so that they vectorize
// without -ffast-math (which would be needed to reorder scalar float sums).
typedef float F2 __attribute__((vector_size(8)));
typedef double D2 __attribute__((vector_size(16)));
typedef float F4 __attribute__((vector_size(16)));
typedef uint32_t U4 __attribute__((vector_size(16)));

inline F4 LoadF4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline U4 LoadU4(const float* p) {
  U4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Sum of x_i^2 (kSquare) or |x_i| over x[begin, end), in float64, serially: four
// two-lane accumulators, then the scalar tail; a fixed order, so deterministic.
template <bool kSquare>
double SumRange(const float* x, int64_t begin, int64_t end) {
  D2 acc[4] = {};
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    for (int j = 0; j < 4; ++j) {
      F2 f;
      std::memcpy(&f, x + i + 2 * j, sizeof(f));
      const D2 d = __builtin_convertvector(f, D2);
      acc[j] += kSquare ? d * d : (d < 0 ? -d : d);
    }
  }
  const D2 lanes = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  double total = lanes[0] + lanes[1];
  for (; i < end; ++i) {
    const double d = x[i];
    total += kSquare ? d * d : std::fabs(d);
  }
  return total;
}

// Sum of x_i^2 (kSquare) or |x_i| over x, in float64; deterministic: fixed blocks,
// lanes and block partials added in a fixed order.
template <bool kSquare>
double SumOf(tensorflow::OpKernelContext* ctx, const float* x, int64_t n) {
  const int64_t blocks = NumBlocks(n, kStreamBlock);
  std::vector<double> partial(blocks, 0.0);
  ParallelBlocks(ctx, blocks, [&](int64_t b) {
    partial[b] = SumRange<kSquare>(x, BlockBegin(b, blocks, n), BlockBegin(b + 1, blocks, n));
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

// max |x_i| over x[begin, end) as float bits without the sign, serially.
// Comparing magnitude bits orders floats by |x|, and NaN sorts above Inf, so a
// NaN propagates.
inline uint32_t MaxAbsBitsRange(const float* x, int64_t begin, int64_t end) {
  const U4 mask = {kAbsMask, kAbsMask, kAbsMask, kAbsMask};
  U4 m = {0, 0, 0, 0};
  int64_t i = begin;
  for (; i + 4 <= end; i += 4) {
    const U4 v = LoadU4(x + i) & mask;
    m = v > m ? v : m;
  }
  uint32_t best = std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
  for (; i < end; ++i) best = std::max(best, FloatBits(x[i]) & kAbsMask);
  return best;
}

// max |x_i| over x, in parallel blocks.
inline float MaxAbs(tensorflow::OpKernelContext* ctx, const float* x, int64_t n) {
  const int64_t blocks = NumBlocks(n, kStreamBlock);
  std::vector<uint32_t> partial(blocks, 0);
  ParallelBlocks(ctx, blocks, [&](int64_t b) {
    partial[b] = MaxAbsBitsRange(x, BlockBegin(b, blocks, n), BlockBegin(b + 1, blocks, n));
  });
  return BitsFloat(*std::max_element(partial.begin(), partial.end()));
}

// Decoding a one-scale payload (scale, packed kBits-bit codes, n) -> float [n]:
// unpack chunk by chunk and let `values(codes, count, scale, out)` map codes.
template <int kBits, typename ValuesFn>
void DecodeScaled(tensorflow::OpKernelContext* ctx, const char* op, ValuesFn values) {
  OP_REQUIRES_OK(ctx, RequireScalar(ctx->input(0), op, "scale"));
  int64_t n;
  OP_REQUIRES_OK(ctx, ReadDecodeArgs(ctx, op, 1, 2, kBits, &n));
  const float scale = ctx->input(0).scalar<float>()();
  const uint8_t* packed = ctx->input(1).flat<uint8_t>().data();
  tensorflow::Tensor* out_t = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({n}), &out_t));
  float* out = out_t->flat<float>().data();
  ForChunks(ctx, n, [&](int64_t begin, int64_t count) {
    uint8_t codes[kChunk];
    UnpackCodes<kBits>(packed + begin / 8 * kBits, count, codes);
    values(codes, count, scale, out + begin);
  });
}

}  // namespace compression
}  // namespace tfdist

#endif  // TFDIST_CUSTOM_OPS_KERNELS_QUANTIZE_COMMON_H_
