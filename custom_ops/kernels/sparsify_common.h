// Helpers shared by the sparsification kernels: argument checks for the
// selection ops (top-k, approximate top-k, random-k), and the candidate
// selection that both top-k kernels end with (ties to the lower index).
#ifndef TFDIST_CUSTOM_OPS_KERNELS_SPARSIFY_COMMON_H_
#define TFDIST_CUSTOM_OPS_KERNELS_SPARSIFY_COMMON_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/compression_common.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfdist {
namespace compression {

// A candidate: the element's original float bits and its position.
struct Cand {
  uint32_t bits;
  int32_t index;
};

// Candidates of one block of x, in index order.
struct CandSpan {
  const Cand* data;
  int64_t size;
};

// Validates x (input 0, a vector of n < 2^31 elements) and k (input 1, a scalar
// in [0, n]).
inline absl::Status ReadSelectArgs(tensorflow::OpKernelContext* ctx, const char* op, int64_t* n,
                                   int64_t* k) {
  const tensorflow::Tensor& x = ctx->input(0);
  const tensorflow::Tensor& k_t = ctx->input(1);
  if (x.dims() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `x` must be a vector (the Python wrapper flattens tensors); received "
        "shape ", x.shape().DebugString(), "."));
  }
  if (x.NumElements() > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `x` has ", x.NumElements(), " elements; int32 indices allow at most "
        "2^31 - 1. Split the tensor into chunks."));
  }
  if (k_t.dims() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `k` must be a scalar; received shape ", k_t.shape().DebugString(), "."));
  }
  *n = x.NumElements();
  *k = k_t.scalar<int32_t>()();
  if (*k < 0 || *k > *n) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `k` must be in [0, n]; received k=", *k, " for a tensor of ", *n,
        " elements."));
  }
  return absl::OkStatus();
}

inline absl::Status ReadSeed(tensorflow::OpKernelContext* ctx, int input, const char* op,
                             int64_t* seed) {
  const tensorflow::Tensor& seed_t = ctx->input(input);
  if (seed_t.dims() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": `seed` must be a scalar; received shape ", seed_t.shape().DebugString(),
        "."));
  }
  *seed = seed_t.scalar<int64_t>()();
  return absl::OkStatus();
}

// Chooses k of the candidates, given in index order as spans. The `num_definite`
// candidates with magnitude >= `definite` are known to be among the k largest;
// the rest compete for the remaining places (ties to the lower index).
inline void SelectFromCandidates(tensorflow::OpKernelContext* ctx,
                                 const std::vector<CandSpan>& spans, int64_t total, int64_t k,
                                 uint64_t definite, int64_t num_definite, float* values,
                                 int32_t* indices) {
  const int64_t r = k - num_definite;  // places left for the boundary candidates
  const int64_t boundary = total - num_definite;
  uint32_t a_star = 0;                   // k-th largest magnitude
  int64_t need_eq = total;               // how many with magnitude == a_star to keep
  if (r < boundary) {
    std::vector<uint32_t> mags;
    mags.reserve(boundary);
    for (const CandSpan& span : spans) {
      for (int64_t i = 0; i < span.size; ++i) {
        const uint32_t a = span.data[i].bits & kAbsMask;
        if (a < definite) mags.push_back(a);
      }
    }
    std::nth_element(mags.begin(), mags.begin() + (r - 1), mags.end(),
                     std::greater<uint32_t>());
    a_star = mags[r - 1];
    int64_t above = 0;
    for (int64_t i = 0; i < r - 1; ++i) above += mags[i] > a_star;
    need_eq = r - above;
  }
  // Per span: how many are above a*, and how many equal it; then each span's
  // output offset and quota of ties, in index order.
  const int64_t num_spans = static_cast<int64_t>(spans.size());
  std::vector<int64_t> gt(num_spans), eq(num_spans);
  ParallelBlocks(ctx, num_spans, [&](int64_t s) {
    int64_t g = 0, e = 0;
    for (int64_t i = 0; i < spans[s].size; ++i) {
      const uint32_t a = spans[s].data[i].bits & kAbsMask;
      g += a > a_star;
      e += a == a_star;
    }
    gt[s] = g;
    eq[s] = e;
  });
  std::vector<int64_t> offset(num_spans), quota(num_spans);
  int64_t out = 0, eq_left = need_eq;
  for (int64_t s = 0; s < num_spans; ++s) {
    offset[s] = out;
    quota[s] = std::min(eq[s], eq_left);
    eq_left -= quota[s];
    out += gt[s] + quota[s];
  }
  ParallelBlocks(ctx, num_spans, [&](int64_t s) {
    int64_t w = offset[s], ties = quota[s];
    for (int64_t i = 0; i < spans[s].size; ++i) {
      const Cand& c = spans[s].data[i];
      const uint32_t a = c.bits & kAbsMask;
      if (a > a_star || (a == a_star && ties-- > 0)) {
        values[w] = BitsFloat(c.bits);
        indices[w] = c.index;
        ++w;
      }
    }
  });
}

// Appends the elements of x[begin, end) with magnitude >= lo to out (positions
// ascending). Groups of 16 whose largest magnitude is below lo are skipped
// without a branch per element.
template <typename Out>
inline void CollectAtLeast(const uint32_t* xb, int64_t begin, int64_t end, uint32_t lo,
                           const Out& out) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    uint32_t m = 0;
    for (int j = 0; j < 16; ++j) m = std::max(m, xb[i + j] & kAbsMask);
    if (m < lo) continue;
    for (int j = 0; j < 16; ++j) {
      if ((xb[i + j] & kAbsMask) >= lo) out(Cand{xb[i + j], static_cast<int32_t>(i + j)});
    }
  }
  for (; i < end; ++i) {
    if ((xb[i] & kAbsMask) >= lo) out(Cand{xb[i], static_cast<int32_t>(i)});
  }
}

// Allocates (values[k], indices[k]) and fills them when k == 0 or k == n; sets
// *more when the caller still has to fill them.
inline absl::Status PrepareSelectOutputs(tensorflow::OpKernelContext* ctx, const float* x,
                                         int64_t n, int64_t k, float** values, int32_t** indices,
                                         bool* more) {
  tensorflow::Tensor* values_t = nullptr;
  tensorflow::Tensor* indices_t = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, tensorflow::TensorShape({k}), &values_t));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, tensorflow::TensorShape({k}), &indices_t));
  *values = values_t->flat<float>().data();
  *indices = indices_t->flat<int32_t>().data();
  *more = k > 0 && k < n;
  if (k > 0 && k == n) {
    float* v = *values;
    int32_t* idx = *indices;
    const int64_t blocks = NumBlocks(n, kStreamBlock);
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      for (int64_t i = BlockBegin(b, blocks, n); i < BlockBegin(b + 1, blocks, n); ++i) {
        v[i] = x[i];
        idx[i] = static_cast<int32_t>(i);
      }
    });
  }
  return absl::OkStatus();
}

// The exact two-pass top-k described at the top of topk_kernels.cc, for
// 0 < k < n; the approximate kernel falls back to it.
void ExactTopK(tensorflow::OpKernelContext* ctx, const float* x, int64_t n, int64_t k,
               float* values, int32_t* indices);

}  // namespace compression
}  // namespace tfdist

#endif  // TFDIST_CUSTOM_OPS_KERNELS_SPARSIFY_COMMON_H_
