// Kernels: TfdistQsgdEncode/Decode (bucketed: one norm per bucket_size elements).
//
// QSGD (Alistarh et al. 2017): |x_i| / norm * levels is rounded up or down at
// random to an integer level, per bucket; codes (level << 1) | sign are bit
// packed. Shared helpers (reductions, chunking, checks): quantize_common.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/compression_common.h"
#include "kernels/quantize_common.h"
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

REGISTER_KERNEL_BUILDER(Name("TfdistQsgdEncode").Device(tensorflow::DEVICE_CPU), QsgdEncodeOp);
REGISTER_KERNEL_BUILDER(Name("TfdistQsgdDecode").Device(tensorflow::DEVICE_CPU), QsgdDecodeOp);

}  // namespace
}  // namespace compression
}  // namespace tfdist
