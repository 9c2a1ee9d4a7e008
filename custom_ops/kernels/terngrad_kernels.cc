// Kernels: TfdistTerngradEncode/Decode.
//
// TernGrad (Wen et al. 2017): each element becomes 0 or +-max|x|, kept with
// probability |x| / max|x|; 2-bit codes, bit packed. Shared helpers (MaxAbs,
// chunking, DecodeScaled): quantize_common.h.
#include <cmath>
#include <cstdint>
#include <cstring>

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

class TerngradDecodeOp : public OpKernel {
 public:
  explicit TerngradDecodeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    DecodeScaled<2>(ctx, "TfdistTerngradDecode", TerngradValues);
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdistTerngradEncode").Device(tensorflow::DEVICE_CPU),
                        TerngradEncodeOp);
REGISTER_KERNEL_BUILDER(Name("TfdistTerngradDecode").Device(tensorflow::DEVICE_CPU),
                        TerngradDecodeOp);

}  // namespace
}  // namespace compression
}  // namespace tfdist
