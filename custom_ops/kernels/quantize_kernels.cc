// Kernels: TfdistQsgdEncode/Decode (bucketed: one norm per bucket_size elements), TfdistTerngradEncode/Decode,
// TfdistSignEncode/Decode, TfdistInt8Encode/Decode, TfdistPackBits/UnpackBits.
//
// Every encoder is one reduction pass (norm, max, mean or min/max, per block of a
// size fixed by n, combined in block order) and one pass that computes a chunk
// of codes into a small buffer with a vectorizable loop and packs it; every
// decoder unpacks a chunk and expands it. Stochastic rounding draws element i's
// uniform number from (seed, i) alone, so the codes do not depend on the
// thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
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

constexpr int kMaxQsgdLevels = 32767;

int QsgdBits(int levels) {
  int bits = 0;
  while ((1 << bits) < levels + 1) ++bits;
  return bits + 1;
}

absl::Status RequireVector(const Tensor& t, const char* op, const char* arg) {
  if (t.dims() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `", arg, "` must be a vector (the Python wrapper flattens tensors); "
        "received shape ", t.shape().DebugString(), "."));
  }
  return absl::OkStatus();
}

absl::Status RequireScalar(const Tensor& t, const char* op, const char* arg) {
  if (t.dims() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `", arg, "` must be a scalar; received shape ", t.shape().DebugString(),
        "."));
  }
  return absl::OkStatus();
}

// Reads the element count n (scalar input `n_input`) of a decoder and checks that
// `packed` holds exactly ceil(n * bits / 8) bytes.
absl::Status ReadDecodeArgs(OpKernelContext* ctx, const char* op, int packed_input,
                            int n_input, int bits, int64_t* n) {
  const Tensor& packed = ctx->input(packed_input);
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
void ForChunks(OpKernelContext* ctx, int64_t n, const Fn& fn) {
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
double SumOf(OpKernelContext* ctx, const float* x, int64_t n) {
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
uint32_t MaxAbsBitsRange(const float* x, int64_t begin, int64_t end) {
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
float MaxAbs(OpKernelContext* ctx, const float* x, int64_t n) {
  const int64_t blocks = NumBlocks(n, kStreamBlock);
  std::vector<uint32_t> partial(blocks, 0);
  ParallelBlocks(ctx, blocks, [&](int64_t b) {
    partial[b] = MaxAbsBitsRange(x, BlockBegin(b, blocks, n), BlockBegin(b + 1, blocks, n));
  });
  return BitsFloat(*std::max_element(partial.begin(), partial.end()));
}

// ---------------------------------------------------------------------------
// QSGD

// Codes of x[0, count) (element indices base + j): (level << 1) | sign, with
// v = |x| / norm * levels and level = floor(v) + (u < frac(v) * 2^24), at most
// `levels`. Written as a plain loop of 32-bit operations so the compiler
// vectorizes it. kDivide divides by the norm instead of multiplying by
// levels / norm, for norms so small that levels / norm overflows float32.
template <bool kDivide>
void QsgdCodes(const float* __restrict x, int64_t base, int64_t count, float norm,
               float scale, int32_t levels, const Uniform24Stream uniform,
               uint16_t* __restrict codes) {
  const float flevels = static_cast<float>(levels);
  for (int64_t j = 0; j < count; ++j) {
    const float v = kDivide ? std::fabs(x[j]) / norm * flevels : std::fabs(x[j]) * scale;
    const int32_t floor_level = static_cast<int32_t>(v);
    const float frac = v - static_cast<float>(floor_level);
    const int32_t u = uniform.At(static_cast<uint32_t>(base + j));
    int32_t level = floor_level + (static_cast<float>(u) < frac * kTwo24 ? 1 : 0);
    level = level < levels ? level : levels;
    const int32_t negative = (x[j] < 0.0f && level != 0) ? 1 : 0;
    codes[j] = static_cast<uint16_t>((level << 1) | negative);
  }
}

void QsgdValues(const uint16_t* __restrict codes, int64_t count, float unit,
                float* __restrict out) {
  for (int64_t j = 0; j < count; ++j) {
    const float magnitude = static_cast<float>(codes[j] >> 1) * unit;
    out[j] = (codes[j] & 1) ? -magnitude : magnitude;
  }
}

// Number of buckets (norms) for n elements: one when bucket_size is 0 or >= n
// (also for n == 0), else ceil(n / bucket_size). Must match quantize_ops.cc.
int64_t QsgdNumBuckets(int64_t n, int64_t bucket_size) {
  if (bucket_size <= 0 || n <= bucket_size) return 1;
  return (n + bucket_size - 1) / bucket_size;
}

// Calls fn(bucket, sub_begin, sub_count) for the maximal runs of [begin, begin +
// count) that lie in one bucket of `bucket` elements (0: one bucket).
template <typename Fn>
inline void ForBucketRuns(int64_t begin, int64_t count, int64_t bucket, const Fn& fn) {
  const int64_t end = begin + count;
  if (bucket <= 0) {
    fn(int64_t{0}, begin, count);
    return;
  }
  for (int64_t s = begin; s < end;) {
    const int64_t k = s / bucket;
    const int64_t e = std::min(end, (k + 1) * bucket);
    fn(k, s, e - s);
    s = e;
  }
}

absl::Status CheckLevels(const char* op, int levels) {
  if (levels >= 1 && levels <= kMaxQsgdLevels) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": attr `levels` must be in [1, ",
                                                 kMaxQsgdLevels, "]; received levels=",
                                                 levels, "."));
}

absl::Status CheckBucketSize(const char* op, int bucket_size) {
  if (bucket_size >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": attr `bucket_size` must be >= 0 (0 means one bucket); received bucket_size=",
      bucket_size, "."));
}

class QsgdEncodeOp : public OpKernel {
 public:
  explicit QsgdEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("levels", &levels_));
    OP_REQUIRES_OK(ctx, CheckLevels("TfdistQsgdEncode", levels_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bucket_size", &bucket_size_));
    OP_REQUIRES_OK(ctx, CheckBucketSize("TfdistQsgdEncode", bucket_size_));
    std::string norm;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("norm", &norm));
    max_norm_ = norm == "max";
    bits_ = QsgdBits(levels_);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, RequireVector(x_t, "TfdistQsgdEncode", "x"));
    OP_REQUIRES_OK(ctx, RequireScalar(ctx->input(1), "TfdistQsgdEncode", "seed"));
    const int64_t n = x_t.NumElements();
    const float* x = x_t.flat<float>().data();
    const Uniform24Stream uniform(ctx->input(1).scalar<int64_t>()(), Stream::kQsgd);
    const int64_t num_buckets = QsgdNumBuckets(n, bucket_size_);
    // 0 when there is one bucket: then every element uses norms[0].
    const int64_t bucket = num_buckets == 1 ? 0 : bucket_size_;

    Tensor* norms_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_buckets}), &norms_t));
    float* norms = norms_t->flat<float>().data();
    Tensor* packed_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({PackedBytes(n, bits_)}),
                                             &packed_t));
    uint8_t* packed = packed_t->flat<uint8_t>().data();

    // Pass 1: the norm of each bucket (one bucket: blocked over the whole vector;
    // several: blocks of whole buckets, each bucket summed serially).
    if (bucket == 0) {
      norms[0] = max_norm_ ? MaxAbs(ctx, x, n)
                           : static_cast<float>(std::sqrt(SumOf<true>(ctx, x, n)));
    } else {
      const int64_t blocks =
          NumBlocks(num_buckets, std::max<int64_t>(1, kStreamBlock / bucket));
      ParallelBlocks(ctx, blocks, [&](int64_t b) {
        const int64_t last = BlockBegin(b + 1, blocks, num_buckets);
        for (int64_t k = BlockBegin(b, blocks, num_buckets); k < last; ++k) {
          const int64_t begin = k * bucket, end = std::min(n, (k + 1) * bucket);
          norms[k] = max_norm_ ? BitsFloat(MaxAbsBitsRange(x, begin, end))
                               : static_cast<float>(std::sqrt(SumRange<true>(x, begin, end)));
        }
      });
    }
    if (bucket == 0 && (!(norms[0] > 0.0f) || !std::isfinite(norms[0]))) {
      // Zero vector: every level is 0. Non-finite: the norm carries it to decode.
      std::memset(packed, 0, packed_t->NumElements());
      return;
    }

    // Pass 2: codes, chunk by chunk (chunks start at multiples of 8 codes and are
    // split where a bucket ends; each run uses its bucket's levels / norm).
    const int32_t levels = levels_;
    DispatchBits(bits_, [&](auto bits_tag) {
      constexpr int kBits = decltype(bits_tag)::value;
      ForChunks(ctx, n, [&](int64_t begin, int64_t count) {
        uint16_t codes[kChunk];
        ForBucketRuns(begin, count, bucket, [&](int64_t k, int64_t s, int64_t m) {
          const float norm = norms[k];
          uint16_t* out = codes + (s - begin);
          if (!(norm > 0.0f) || !std::isfinite(norm)) {
            std::memset(out, 0, m * sizeof(uint16_t));  // zero or non-finite bucket
            return;
          }
          const float scale = static_cast<float>(levels / static_cast<double>(norm));
          if (std::isfinite(scale)) {
            QsgdCodes<false>(x + s, s, m, norm, scale, levels, uniform, out);
          } else {
            QsgdCodes<true>(x + s, s, m, norm, scale, levels, uniform, out);
          }
        });
        PackCodes<kBits>(codes, count, packed + begin / 8 * kBits);
      });
    });
  }

 private:
  int levels_;
  int bucket_size_;
  bool max_norm_;
  int bits_;
};

class QsgdDecodeOp : public OpKernel {
 public:
  explicit QsgdDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("levels", &levels_));
    OP_REQUIRES_OK(ctx, CheckLevels("TfdistQsgdDecode", levels_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bucket_size", &bucket_size_));
    OP_REQUIRES_OK(ctx, CheckBucketSize("TfdistQsgdDecode", bucket_size_));
    bits_ = QsgdBits(levels_);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& norms_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, RequireVector(norms_t, "TfdistQsgdDecode", "norms"));
    int64_t n;
    OP_REQUIRES_OK(ctx, ReadDecodeArgs(ctx, "TfdistQsgdDecode", 1, 2, bits_, &n));
    const int64_t num_buckets = QsgdNumBuckets(n, bucket_size_);
    OP_REQUIRES(ctx, norms_t.NumElements() == num_buckets,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistQsgdDecode: `norms` has ", norms_t.NumElements(),
                    " elements but n=", n, " with bucket_size=", bucket_size_, " needs ",
                    num_buckets, " (one norm per bucket). Pass the n and bucket_size "
                    "used to encode.")));
    const int64_t bucket = num_buckets == 1 ? 0 : bucket_size_;
    const float* norms = norms_t.flat<float>().data();
    const float flevels = static_cast<float>(levels_);
    const uint8_t* packed = ctx->input(1).flat<uint8_t>().data();
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out_t));
    float* out = out_t->flat<float>().data();
    DispatchBits(bits_, [&](auto bits_tag) {
      constexpr int kBits = decltype(bits_tag)::value;
      ForChunks(ctx, n, [&](int64_t begin, int64_t count) {
        uint16_t codes[kChunk];
        UnpackCodes<kBits>(packed + begin / 8 * kBits, count, codes);
        ForBucketRuns(begin, count, bucket, [&](int64_t k, int64_t s, int64_t m) {
          QsgdValues(codes + (s - begin), m, norms[k] / flevels, out + s);
        });
      });
    });
  }

 private:
  int levels_;
  int bucket_size_;
  int bits_;
};

// ---------------------------------------------------------------------------
// TernGrad


// Codes of x[0, count) (element indices base + j): 0, 1 (+1) or 2 (-1), kept with
// probability |x| / scale, i.e. when u < |x| * (2^24 / scale). kDivide computes
// |x| / scale * 2^24 instead, for scales so small that 2^24 / scale overflows.
template <bool kDivide>
void TerngradCodes(const float* __restrict x, int64_t base, int64_t count, float scale,
                   float to_threshold, const Uniform24Stream uniform,
                   uint8_t* __restrict codes) {
  for (int64_t j = 0; j < count; ++j) {
    const int32_t u = uniform.At(static_cast<uint32_t>(base + j));
    const float threshold =
        kDivide ? std::fabs(x[j]) / scale * kTwo24 : std::fabs(x[j]) * to_threshold;
    const int32_t keep = static_cast<float>(u) < threshold ? 1 : 0;
    const int32_t negative = x[j] < 0.0f ? 1 : 0;
    codes[j] = static_cast<uint8_t>(keep + (keep & negative));
  }
}

void TerngradValues(const uint8_t* __restrict codes, int64_t count, float scale,
                    float* __restrict out) {
  for (int64_t j = 0; j < count; ++j) {
    out[j] = static_cast<float>(codes[j] & 1) * scale - static_cast<float>(codes[j] >> 1) * scale;
  }
}

class TerngradEncodeOp : public OpKernel {
 public:
  explicit TerngradEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, RequireVector(x_t, "TfdistTerngradEncode", "x"));
    OP_REQUIRES_OK(ctx, RequireScalar(ctx->input(1), "TfdistTerngradEncode", "seed"));
    const int64_t n = x_t.NumElements();
    const float* x = x_t.flat<float>().data();
    const Uniform24Stream uniform(ctx->input(1).scalar<int64_t>()(), Stream::kTernGrad);
    const float scale = MaxAbs(ctx, x, n);
    Tensor* scale_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &scale_t));
    scale_t->scalar<float>()() = scale;
    Tensor* packed_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({PackedBytes(n, 2)}), &packed_t));
    uint8_t* packed = packed_t->flat<uint8_t>().data();
    if (!(scale > 0.0f) || !std::isfinite(scale)) {
      std::memset(packed, 0, packed_t->NumElements());
      return;
    }
    // Keep element i with probability |x_i| / scale: compare against 24-bit u.
    const float to_threshold = kTwo24 / scale;
    ForChunks(ctx, n, [&](int64_t begin, int64_t count) {
      uint8_t codes[kChunk];
      if (std::isfinite(to_threshold)) {
        TerngradCodes<false>(x + begin, begin, count, scale, to_threshold, uniform, codes);
      } else {
        TerngradCodes<true>(x + begin, begin, count, scale, to_threshold, uniform, codes);
      }
      PackCodes<2>(codes, count, packed + begin / 8 * 2);
    });
  }
};

// Decoding a one-scale payload (scale, packed kBits-bit codes, n) -> float [n]:
// unpack chunk by chunk and let `values(codes, count, scale, out)` map codes.
template <int kBits, typename ValuesFn>
void DecodeScaled(OpKernelContext* ctx, const char* op, ValuesFn values) {
  OP_REQUIRES_OK(ctx, RequireScalar(ctx->input(0), op, "scale"));
  int64_t n;
  OP_REQUIRES_OK(ctx, ReadDecodeArgs(ctx, op, 1, 2, kBits, &n));
  const float scale = ctx->input(0).scalar<float>()();
  const uint8_t* packed = ctx->input(1).flat<uint8_t>().data();
  Tensor* out_t = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out_t));
  float* out = out_t->flat<float>().data();
  ForChunks(ctx, n, [&](int64_t begin, int64_t count) {
    uint8_t codes[kChunk];
    UnpackCodes<kBits>(packed + begin / 8 * kBits, count, codes);
    values(codes, count, scale, out + begin);
  });
}

class TerngradDecodeOp : public OpKernel {
 public:
  explicit TerngradDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    DecodeScaled<2>(ctx, "TfdistTerngradDecode", TerngradValues);
  }
};

// ---------------------------------------------------------------------------
// Scaled sign

void SignCodes(const float* __restrict x, int64_t count, uint8_t* __restrict codes) {
  for (int64_t j = 0; j < count; ++j) codes[j] = x[j] < 0.0f ? 1 : 0;
}

void SignValues(const uint8_t* __restrict codes, int64_t count, float scale,
                float* __restrict out) {
  for (int64_t j = 0; j < count; ++j) out[j] = codes[j] ? -scale : scale;
}

class SignEncodeOp : public OpKernel {
 public:
  explicit SignEncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, RequireVector(x_t, "TfdistSignEncode", "x"));
    const int64_t n = x_t.NumElements();
    const float* x = x_t.flat<float>().data();
    const double sum_abs = SumOf<false>(ctx, x, n);
    Tensor* scale_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &scale_t));
    scale_t->scalar<float>()() = n > 0 ? static_cast<float>(sum_abs / n) : 0.0f;
    Tensor* packed_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({PackedBytes(n, 1)}), &packed_t));
    uint8_t* packed = packed_t->flat<uint8_t>().data();
    ForChunks(ctx, n, [&](int64_t begin, int64_t count) {
      uint8_t codes[kChunk];
      SignCodes(x + begin, count, codes);
      PackCodes<1>(codes, count, packed + begin / 8);
    });
  }
};

class SignDecodeOp : public OpKernel {
 public:
  explicit SignDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    DecodeScaled<1>(ctx, "TfdistSignDecode", SignValues);
  }
};

// ---------------------------------------------------------------------------
// 8-bit min-max

// Round half up: (x - min) >= 0, so truncating v + 0.5 rounds. kDivide divides by
// the range instead of multiplying by 255 / range, for ranges so small that
// 255 / range overflows float32.
template <bool kDivide>
void Int8Codes(const float* __restrict x, int64_t count, float mn, float range, float inv,
               uint8_t* __restrict codes) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = (kDivide ? (x[i] - mn) / range * 255.0f : (x[i] - mn) * inv) + 0.5f;
    codes[i] = static_cast<uint8_t>(static_cast<int32_t>(v < 255.0f ? v : 255.0f));
  }
}

void Int8Values(const uint8_t* __restrict codes, int64_t count, float mn, float step,
                float* __restrict out) {
  for (int64_t i = 0; i < count; ++i) out[i] = mn + static_cast<float>(codes[i]) * step;
}

class Int8EncodeOp : public OpKernel {
 public:
  explicit Int8EncodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, RequireVector(x_t, "TfdistInt8Encode", "x"));
    const int64_t n = x_t.NumElements();
    const float* x = x_t.flat<float>().data();
    const int64_t blocks = NumBlocks(n, kStreamBlock);
    constexpr float kInf = std::numeric_limits<float>::infinity();
    std::vector<float> lo(blocks, kInf), hi(blocks, -kInf);
    std::vector<uint32_t> non_finite(blocks, 0);
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      const int64_t begin = BlockBegin(b, blocks, n), end = BlockBegin(b + 1, blocks, n);
      constexpr uint32_t kExp = 0x7f800000u;
      const U4 exp = {kExp, kExp, kExp, kExp};
      F4 mn = {kInf, kInf, kInf, kInf}, mx = -mn;
      U4 bad = {0, 0, 0, 0};
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        const F4 v = LoadF4(x + i);
        mn = v < mn ? v : mn;  // a NaN never replaces the running value...
        mx = v > mx ? v : mx;
        bad |= (LoadU4(x + i) & exp) == exp;  // ...but is flagged here, with Inf
      }
      float bmn = std::min(std::min(mn[0], mn[1]), std::min(mn[2], mn[3]));
      float bmx = std::max(std::max(mx[0], mx[1]), std::max(mx[2], mx[3]));
      uint32_t bbad = bad[0] | bad[1] | bad[2] | bad[3];
      for (; i < end; ++i) {
        bmn = std::min(bmn, x[i]);
        bmx = std::max(bmx, x[i]);
        bbad |= (FloatBits(x[i]) & kExp) == kExp;
      }
      lo[b] = bmn;
      hi[b] = bmx;
      non_finite[b] = bbad;
    });
    float mn = 0.0f, mx = 0.0f;
    if (n > 0) {
      mn = *std::min_element(lo.begin(), lo.end());
      mx = *std::max_element(hi.begin(), hi.end());
      for (uint32_t bad : non_finite) {
        if (bad != 0) mn = mx = std::numeric_limits<float>::quiet_NaN();
      }
    }
    Tensor* t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &t));
    t->scalar<float>()() = mn;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &t));
    t->scalar<float>()() = mx;
    Tensor* codes_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &codes_t));
    uint8_t* codes = codes_t->flat<uint8_t>().data();
    if (!(mx > mn)) {  // constant, empty or non-finite: all codes 0
      std::memset(codes, 0, n);
      return;
    }
    const float inv = static_cast<float>(255.0 / (static_cast<double>(mx) - mn));
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      const int64_t begin = BlockBegin(b, blocks, n);
      const int64_t count = BlockBegin(b + 1, blocks, n) - begin;
      if (std::isfinite(inv)) {
        Int8Codes<false>(x + begin, count, mn, mx - mn, inv, codes + begin);
      } else {
        Int8Codes<true>(x + begin, count, mn, mx - mn, inv, codes + begin);
      }
    });
  }
};

class Int8DecodeOp : public OpKernel {
 public:
  explicit Int8DecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, RequireScalar(ctx->input(0), "TfdistInt8Decode", "min"));
    OP_REQUIRES_OK(ctx, RequireScalar(ctx->input(1), "TfdistInt8Decode", "max"));
    const Tensor& codes_t = ctx->input(2);
    OP_REQUIRES_OK(ctx, RequireVector(codes_t, "TfdistInt8Decode", "codes"));
    const float mn = ctx->input(0).scalar<float>()();
    const float mx = ctx->input(1).scalar<float>()();
    const float step = static_cast<float>((static_cast<double>(mx) - mn) / 255.0);
    const int64_t n = codes_t.NumElements();
    const uint8_t* codes = codes_t.flat<uint8_t>().data();
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out_t));
    float* out = out_t->flat<float>().data();
    const int64_t blocks = NumBlocks(n, kStreamBlock);
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      const int64_t begin = BlockBegin(b, blocks, n);
      Int8Values(codes + begin, BlockBegin(b + 1, blocks, n) - begin, mn, step, out + begin);
    });
  }
};

// ---------------------------------------------------------------------------
// Generic bit packing

class PackBitsOp : public OpKernel {
 public:
  explicit PackBitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES(ctx, bits_ >= 1 && bits_ <= 8,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistPackBits: attr `bits` must be in [1, 8]; received bits=", bits_,
                    ".")));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& codes_t = ctx->input(0);
    OP_REQUIRES_OK(ctx, RequireVector(codes_t, "TfdistPackBits", "codes"));
    const int64_t n = codes_t.NumElements();
    const uint8_t* codes = codes_t.flat<uint8_t>().data();
    // Codes must fit: OR of the bits above `bits_`, per block, vectorizable.
    const int64_t blocks = NumBlocks(n, kStreamBlock);
    std::vector<uint32_t> high(blocks, 0);
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      uint8_t h = 0;
      const int64_t end = BlockBegin(b + 1, blocks, n);
      for (int64_t i = BlockBegin(b, blocks, n); i < end; ++i) h |= codes[i] >> bits_;
      high[b] = h;
    });
    for (uint32_t h : high) {
      if (h == 0) continue;
      int64_t bad = 0;
      while ((codes[bad] >> bits_) == 0) ++bad;
      ctx->CtxFailure(__FILE__, __LINE__, absl::InvalidArgumentError(absl::StrCat(
          "TfdistPackBits: codes[", bad, "] = ", codes[bad], " does not fit in bits=",
          bits_, " (codes must be < ", 1 << bits_, "); use a larger `bits`.")));
      return;
    }
    Tensor* packed_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({PackedBytes(n, bits_)}),
                                             &packed_t));
    uint8_t* packed = packed_t->flat<uint8_t>().data();
    DispatchBits(bits_, [&](auto bits_tag) {
      constexpr int kBits = decltype(bits_tag)::value;
      ForChunks(ctx, n, [&](int64_t begin, int64_t count) {
        PackCodes<kBits>(codes + begin, count, packed + begin / 8 * kBits);
      });
    });
  }

 private:
  int bits_;
};

class UnpackBitsOp : public OpKernel {
 public:
  explicit UnpackBitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bits", &bits_));
    OP_REQUIRES(ctx, bits_ >= 1 && bits_ <= 8,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistUnpackBits: attr `bits` must be in [1, 8]; received bits=", bits_,
                    ".")));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t n;
    OP_REQUIRES_OK(ctx, ReadDecodeArgs(ctx, "TfdistUnpackBits", 0, 1, bits_, &n));
    const uint8_t* packed = ctx->input(0).flat<uint8_t>().data();
    Tensor* codes_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &codes_t));
    uint8_t* codes = codes_t->flat<uint8_t>().data();
    DispatchBits(bits_, [&](auto bits_tag) {
      constexpr int kBits = decltype(bits_tag)::value;
      ForChunks(ctx, n, [&](int64_t begin, int64_t count) {
        UnpackCodes<kBits>(packed + begin / 8 * kBits, count, codes + begin);
      });
    });
  }

 private:
  int bits_;
};

#define TFDIST_REGISTER_CPU(NAME, KERNEL) \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(tensorflow::DEVICE_CPU), KERNEL)
TFDIST_REGISTER_CPU("TfdistQsgdEncode", QsgdEncodeOp);
TFDIST_REGISTER_CPU("TfdistQsgdDecode", QsgdDecodeOp);
TFDIST_REGISTER_CPU("TfdistTerngradEncode", TerngradEncodeOp);
TFDIST_REGISTER_CPU("TfdistTerngradDecode", TerngradDecodeOp);
TFDIST_REGISTER_CPU("TfdistSignEncode", SignEncodeOp);
TFDIST_REGISTER_CPU("TfdistSignDecode", SignDecodeOp);
TFDIST_REGISTER_CPU("TfdistInt8Encode", Int8EncodeOp);
TFDIST_REGISTER_CPU("TfdistInt8Decode", Int8DecodeOp);
TFDIST_REGISTER_CPU("TfdistPackBits", PackBitsOp);
TFDIST_REGISTER_CPU("TfdistUnpackBits", UnpackBitsOp);
#undef TFDIST_REGISTER_CPU

}  // namespace
}  // namespace compression
}  // namespace tfdist
