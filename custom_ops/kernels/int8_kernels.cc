// Kernels: TfdistInt8Encode/Decode.
//
// 8-bit min-max: code_i = round((x_i - min) / (max - min) * 255), one byte per
// element (not bit packed). Shared helpers (vector loads, checks): quantize_common.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

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

REGISTER_KERNEL_BUILDER(Name("TfdistInt8Encode").Device(tensorflow::DEVICE_CPU), Int8EncodeOp);
REGISTER_KERNEL_BUILDER(Name("TfdistInt8Decode").Device(tensorflow::DEVICE_CPU), Int8DecodeOp);

}  // namespace
}  // namespace compression
}  // namespace tfdist
