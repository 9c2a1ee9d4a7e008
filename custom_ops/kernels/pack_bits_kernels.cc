// Kernels: TfdistPackBits/UnpackBits.
//
// Generic bit packing of uint8 codes of 1-8 bits, in the layout every packed
// payload uses (compression_common.h). Shared helpers (chunking, checks):
// quantize_common.h.
#include <cstdint>
#include <vector>

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

REGISTER_KERNEL_BUILDER(Name("TfdistPackBits").Device(tensorflow::DEVICE_CPU), PackBitsOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUnpackBits").Device(tensorflow::DEVICE_CPU), UnpackBitsOp);

}  // namespace
}  // namespace compression
}  // namespace tfdist
