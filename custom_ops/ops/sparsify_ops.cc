// Op registrations: sparsification for gradient compression (top-k, approximate
// top-k, random-k) and the dense reconstruction of gathered sparse payloads.
// Kernels: custom_ops/kernels/{topk,topk_approx,randomk,sparse_to_dense}_kernels.cc
// (shared helpers in sparsify_common.h).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfdist {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// (values[k], indices[k]) from a vector x (input 0) and a scalar k (input 1).
absl::Status SelectShape(InferenceContext* c) {
  ShapeHandle x;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &x));
  ShapeHandle k_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &k_shape));
  for (int i = 2; i < c->num_inputs(); ++i) {
    ShapeHandle scalar;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &scalar));
  }
  DimensionHandle k;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(1, &k));
  c->set_output(0, c->Vector(k));
  c->set_output(1, c->Vector(k));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("TfdistTopK")
    .Input("x: float")
    .Input("k: int32")
    .Output("values: float")
    .Output("indices: int32")
    .SetShapeFn(SelectShape)
    .Doc(R"doc(
Exact top-k of a vector by magnitude.

Returns exactly the k entries of x with the largest |x|, as their signed values
and their positions, sorted by position ascending. Ties in |x| go to the lower
index. NaN ranks above every number (by its bit pattern). Runs in O(n) time: a histogram of the magnitudes' high bits finds the
bucket holding the k-th largest, one more pass collects the candidates, and a
selection among the boundary bucket finishes exactly.

x: 1-D float32 tensor of n elements (n < 2^31).
k: scalar, 0 <= k <= n.
values: x[indices].
indices: ascending positions of the k largest magnitudes.
)doc");

REGISTER_OP("TfdistTopKApprox")
    .Input("x: float")
    .Input("k: int32")
    .Input("seed: int64")
    .Attr("sample_fraction: float = 0.01")
    .Output("values: float")
    .Output("indices: int32")
    .SetShapeFn(SelectShape)
    .Doc(R"doc(
Top-k by magnitude with a sampled threshold (Lin et al. 2018, Deep Gradient
Compression).

Estimates the magnitude threshold of the k-th largest element from a random
sample of ceil(sample_fraction * n) positions (at least 1024), lowered by three
standard errors so that it admits at least k elements with high probability,
then makes one pass collecting |x| >= threshold and selects the k largest
candidates. When the sample over-estimated the threshold (fewer than k
candidates) it falls back to the exact two-pass algorithm of TfdistTopK. Always
returns exactly k elements, sorted by position, ties to the lower index; the
result is the same set TfdistTopK returns, only the time varies with the seed.

x: 1-D float32 tensor of n elements (n < 2^31).
k: scalar, 0 <= k <= n.
seed: scalar; selects the sample positions.
sample_fraction: fraction of x sampled to estimate the threshold, in (0, 1].
values: x[indices].
indices: ascending positions of the k largest magnitudes.
)doc");

REGISTER_OP("TfdistRandomK")
    .Input("x: T")
    .Input("k: int32")
    .Input("seed: int64")
    .Attr("T: {float, double, half, bfloat16}")
    .Output("values: T")
    .Output("indices: int32")
    .SetShapeFn(SelectShape)
    .Doc(R"doc(
k distinct positions drawn uniformly at random, and the values there.

The positions depend only on (seed, n, k), never on x or on the machine, so
workers that share a seed select the same positions and their payloads can be
summed. Drawn with Floyd's algorithm from a counter-based generator
(SplitMix64); sorted ascending.

x: 1-D tensor of n elements (n < 2^31).
k: scalar, 0 <= k <= n.
seed: scalar.
values: x[indices].
indices: k distinct ascending positions.
)doc");

REGISTER_OP("TfdistSparseToDense")
    .Input("values: T")
    .Input("indices: int32")
    .Input("n: int32")
    .Attr("T: {float, double}")
    .Output("dense: T")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values, indices, n_shape;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &indices));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &n_shape));
      ShapeHandle merged;
      TF_RETURN_IF_ERROR(c->Merge(values, indices, &merged));
      DimensionHandle n;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &n));
      c->set_output(0, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Scatter-adds sparse (values, indices) into a dense zero vector of n elements.

Duplicate indices are summed, in input order (so the result is deterministic).
Meant for the concatenated payloads of several workers after an all-gather.

values: 1-D, same length as indices.
indices: 1-D int32, each in [0, n).
n: scalar, n >= 0.
dense: dense[i] = sum of values[j] over j with indices[j] == i.
)doc");

}  // namespace tfdist
