// Kernels: TfdistSignEncode/Decode.
//
// Scaled sign: one bit per element (1 for negative), decoded as +-mean|x|.
// Shared helpers (SumOf, chunking, DecodeScaled): quantize_common.h.
#include <cstdint>

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

REGISTER_KERNEL_BUILDER(Name("TfdistSignEncode").Device(tensorflow::DEVICE_CPU), SignEncodeOp);
REGISTER_KERNEL_BUILDER(Name("TfdistSignDecode").Device(tensorflow::DEVICE_CPU), SignDecodeOp);

}  // namespace
}  // namespace compression
}  // namespace tfdist
