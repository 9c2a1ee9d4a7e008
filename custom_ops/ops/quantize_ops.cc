// Op registrations: quantizers for gradient compression (QSGD, TernGrad, scaled
// sign, 8-bit min-max) and generic bit packing.
// Kernels: custom_ops/kernels/{qsgd,terngrad,sign,int8,pack_bits}_kernels.cc
// (shared helpers in quantize_common.h).
//
// Packed layout (shared by every op here): n codes of b bits form a little-endian
// bit stream, code i in stream bits [i*b, (i+1)*b), least significant bit first;
// stream bit j is bit (j % 8) of byte j / 8; ceil(n*b/8) bytes, unused bits zero.
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfdist {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Bits per QSGD code for s levels: ceil(log2(s + 1)) magnitude bits + 1 sign bit.
int QsgdBits(int levels) {
  int bits = 0;
  while ((1 << bits) < levels + 1) ++bits;
  return bits + 1;
}

// Number of QSGD buckets (norms) for n elements in buckets of `bucket_size`: one
// when bucket_size is 0 or >= n (also for n == 0), else ceil(n / bucket_size).
int64_t QsgdNumBuckets(int64_t n, int64_t bucket_size) {
  if (bucket_size <= 0 || n <= bucket_size) return 1;
  return (n + bucket_size - 1) / bucket_size;
}

// Outputs `num_scalars` scalars then a vector of ceil(n * bits / 8) bytes, for a
// vector input 0 of n elements.
absl::Status EncodeShape(InferenceContext* c, int num_scalars, int bits) {
  ShapeHandle x;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &x));
  for (int i = 1; i < c->num_inputs(); ++i) {
    ShapeHandle scalar;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &scalar));
  }
  for (int i = 0; i < num_scalars; ++i) c->set_output(i, c->Scalar());
  DimensionHandle n = c->Dim(x, 0);
  if (c->ValueKnown(n)) {
    c->set_output(num_scalars, c->Vector((c->Value(n) * bits + 7) / 8));
  } else {
    c->set_output(num_scalars, c->Vector(InferenceContext::kUnknownDim));
  }
  return absl::OkStatus();
}

// Inputs: `num_scalars` scalars, a packed vector, then the scalar n; output [n].
absl::Status DecodeShape(InferenceContext* c, int num_scalars) {
  for (int i = 0; i < num_scalars; ++i) {
    ShapeHandle scalar;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &scalar));
  }
  ShapeHandle packed, n_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(num_scalars), 1, &packed));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(num_scalars + 1), 0, &n_shape));
  DimensionHandle n;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(num_scalars + 1, &n));
  c->set_output(0, c->Vector(n));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("TfdistQsgdEncode")
    .Input("x: float")
    .Input("seed: int64")
    .Attr("levels: int >= 1")
    .Attr("bucket_size: int >= 0 = 0")
    .Attr("norm: {'l2', 'max'} = 'l2'")
    .Output("norms: float")
    .Output("packed: uint8")
    .SetShapeFn([](InferenceContext* c) {
      int levels, bucket_size;
      TF_RETURN_IF_ERROR(c->GetAttr("levels", &levels));
      TF_RETURN_IF_ERROR(c->GetAttr("bucket_size", &bucket_size));
      if (levels > 32767) {
        return absl::InvalidArgumentError(absl::StrCat(
            "TfdistQsgdEncode: attr `levels` must be in [1, 32767]; received ", levels));
      }
      if (bucket_size < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "TfdistQsgdEncode: attr `bucket_size` must be >= 0; received ", bucket_size));
      }
      TF_RETURN_IF_ERROR(EncodeShape(c, 1, QsgdBits(levels)));
      DimensionHandle n = c->Dim(c->input(0), 0);
      c->set_output(0, c->ValueKnown(n)
                           ? c->Vector(QsgdNumBuckets(c->Value(n), bucket_size))
                           : c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
QSGD quantization (Alistarh et al. 2017): unbiased stochastic rounding to s levels,
in buckets of `bucket_size` consecutive elements, each with its own L2 (or max) norm.

With s = levels and bucket k = elements [k*d, (k+1)*d) (d = bucket_size), each
|x_i| / ||x_bucket(i)|| * s is rounded to floor or ceil at random, up with
probability equal to its fractional part, giving an integer level l_i in [0, s].
Code = (l_i << 1) | sign_i (sign 1 for negative), ceil(log2(s + 1)) + 1 bits per
element, bit packed (the layout does not depend on d). Decoding gives
norm_bucket(i) / s * l_i * sign_i, whose expectation is x_i. A bucket holding a
non-finite value gets a non-finite norm, so that bucket decodes non-finite too
(loss-scaling checks still see it).

x: 1-D float32 tensor of n elements.
seed: scalar; the same seed gives the same codes (for any bucket_size, element i
  draws the same uniform number).
levels: number of quantization levels s, in [1, 32767].
bucket_size: elements per bucket d; 0 (or d >= n) means one bucket (one norm for
  the whole vector).
norm: 'l2' (the paper's analysis) or 'max' (max |x_i| of the bucket: every
  level is used, the variance is far lower).
norms: [num_buckets] float32, the norm of each bucket (L2 accumulated in
  float64); num_buckets = 1 if d == 0 or n <= d, else ceil(n / d).
packed: ceil(n * bits / 8) bytes.
)doc");

REGISTER_OP("TfdistQsgdDecode")
    .Input("norms: float")
    .Input("packed: uint8")
    .Input("n: int32")
    .Attr("levels: int >= 1")
    .Attr("bucket_size: int >= 0 = 0")
    .Output("x_hat: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle norms, packed, n_shape;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &norms));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &packed));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &n_shape));
      DimensionHandle n;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &n));
      c->set_output(0, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Decodes TfdistQsgdEncode's payload: x_hat_i = norms[i / bucket_size] / levels *
l_i * sign_i.

norms: [num_buckets] from the encoder.
packed: ceil(n * bits / 8) bytes from the encoder.
n: number of elements encoded.
levels: the encoder's levels.
bucket_size: the encoder's bucket_size.
x_hat: unbiased estimate of x.
)doc");

REGISTER_OP("TfdistTerngradEncode")
    .Input("x: float")
    .Input("seed: int64")
    .Output("scale: float")
    .Output("packed: uint8")
    .SetShapeFn([](InferenceContext* c) { return EncodeShape(c, 1, 2); })
    .Doc(R"doc(
TernGrad quantization (Wen et al. 2017): x_i -> scale * sign_i * b_i with
scale = max |x| and b_i = 1 with probability |x_i| / scale, else 0.

Codes are 2 bits: 0 for 0, 1 for +1, 2 for -1. Unbiased: E[decode] = x.

x: 1-D float32 tensor of n elements.
seed: scalar; the same seed gives the same codes.
scale: max |x|.
packed: ceil(n / 4) bytes.
)doc");

REGISTER_OP("TfdistTerngradDecode")
    .Input("scale: float")
    .Input("packed: uint8")
    .Input("n: int32")
    .Output("x_hat: float")
    .SetShapeFn([](InferenceContext* c) { return DecodeShape(c, 1); })
    .Doc(R"doc(
Decodes TfdistTerngradEncode's payload to scale * {0, +1, -1}.

scale: scalar from the encoder.
packed: ceil(n / 4) bytes.
n: number of elements encoded.
x_hat: unbiased estimate of x.
)doc");

REGISTER_OP("TfdistSignEncode")
    .Input("x: float")
    .Output("scale: float")
    .Output("packed: uint8")
    .SetShapeFn([](InferenceContext* c) { return EncodeShape(c, 1, 1); })
    .Doc(R"doc(
Scaled sign (1 bit per element, as in EF-SignSGD, Karimireddy et al. 2019).

Bit i is 1 when x_i < 0, else 0: zero (also -0.0) and NaN map to +. The scale
is mean |x| (accumulated in float64), so the decoded tensor scale * sign(x) has
the same L1 norm as x.

x: 1-D float32 tensor of n elements.
scale: mean |x|, 0 for n == 0.
packed: ceil(n / 8) bytes.
)doc");

REGISTER_OP("TfdistSignDecode")
    .Input("scale: float")
    .Input("packed: uint8")
    .Input("n: int32")
    .Output("x_hat: float")
    .SetShapeFn([](InferenceContext* c) { return DecodeShape(c, 1); })
    .Doc(R"doc(
Decodes TfdistSignEncode's payload to +scale (bit 0) or -scale (bit 1).

scale: scalar from the encoder.
packed: ceil(n / 8) bytes.
n: number of elements encoded.
x_hat: scale * sign(x).
)doc");

REGISTER_OP("TfdistInt8Encode")
    .Input("x: float")
    .Output("min: float")
    .Output("max: float")
    .Output("codes: uint8")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &x));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      c->set_output(2, x);
      return absl::OkStatus();
    })
    .Doc(R"doc(
8-bit min-max quantization: code_i = round((x_i - min) / (max - min) * 255).

Decoding min + code_i * (max - min) / 255 is within (max - min) / 510 of x_i,
plus float32 rounding (a few ulp of max(|min|, |max|)). A constant x encodes to
all-zero codes and decodes exactly. If x holds NaN or Inf, min and max are NaN
and the decoded tensor is NaN. For n == 0, min = max = 0.

x: 1-D float32 tensor of n elements.
min: min(x).
max: max(x).
codes: one uint8 per element.
)doc");

REGISTER_OP("TfdistInt8Decode")
    .Input("min: float")
    .Input("max: float")
    .Input("codes: uint8")
    .Output("x_hat: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scalar, codes;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &scalar));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &scalar));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &codes));
      c->set_output(0, codes);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Decodes TfdistInt8Encode's codes: x_hat_i = min + code_i * (max - min) / 255.
)doc");

REGISTER_OP("TfdistPackBits")
    .Input("codes: uint8")
    .Attr("bits: int >= 1")
    .Output("packed: uint8")
    .SetShapeFn([](InferenceContext* c) {
      int bits;
      TF_RETURN_IF_ERROR(c->GetAttr("bits", &bits));
      if (bits > 8) {
        return absl::InvalidArgumentError(absl::StrCat(
            "TfdistPackBits: attr `bits` must be in [1, 8]; received ", bits));
      }
      return EncodeShape(c, 0, bits);
    })
    .Doc(R"doc(
Packs n codes of `bits` bits each (every code < 2^bits) into ceil(n * bits / 8)
bytes, code i in stream bits [i*bits, (i+1)*bits), least significant bit first.

codes: 1-D uint8.
bits: bits per code, in [1, 8].
packed: ceil(n * bits / 8) bytes.
)doc");

REGISTER_OP("TfdistUnpackBits")
    .Input("packed: uint8")
    .Input("n: int32")
    .Attr("bits: int >= 1")
    .Output("codes: uint8")
    .SetShapeFn([](InferenceContext* c) {
      int bits;
      TF_RETURN_IF_ERROR(c->GetAttr("bits", &bits));
      if (bits > 8) {
        return absl::InvalidArgumentError(absl::StrCat(
            "TfdistUnpackBits: attr `bits` must be in [1, 8]; received ", bits));
      }
      return DecodeShape(c, 0);
    })
    .Doc(R"doc(
Inverse of TfdistPackBits: n codes of `bits` bits from ceil(n * bits / 8) bytes.

packed: 1-D uint8 of exactly ceil(n * bits / 8) bytes.
n: number of codes, n >= 0.
bits: bits per code, in [1, 8].
codes: 1-D uint8 of n codes.
)doc");

}  // namespace tfdist
