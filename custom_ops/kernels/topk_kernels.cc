// Kernels: TfdistTopK.
//
// Exact top-k (O(n), two passes over x):
//   1. per block, a histogram of |x|'s high 11 bits (sign cleared: exponent and
//      3 mantissa bits, 2048 buckets of 1/8 octave each);
//   2. from the summed histogram, the bucket b* holding the k-th largest; every
//      element in a bucket above b* is selected (g0 < k of them), the elements
//      of b* are candidates for the remaining r = k - g0 places;
//   3. a second pass copies the candidates (bucket >= b*) in index order;
//   4. nth_element over the boundary candidates finds the k-th largest magnitude
//      a*; all candidates above a* are kept and, of those equal to a*, the ones
//      with the lowest indices, so ties go to the lower index.
// The approximate variant (topk_approx_kernels.cc) reuses the candidate collection
// and selection (sparsify_common.h) and falls back to ExactTopK.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/compression_common.h"
#include "kernels/sparsify_common.h"
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

constexpr int kBucketShift = 20;
constexpr int kBuckets = 1 << (31 - kBucketShift);  // 2048

}  // namespace

// The exact two-pass algorithm described at the top of this file, for 0 < k < n.
void ExactTopK(OpKernelContext* ctx, const float* x, int64_t n, int64_t k, float* values,
               int32_t* indices) {
  const uint32_t* xb = reinterpret_cast<const uint32_t*>(x);
  const int64_t blocks = NumBlocks(n, kStreamBlock);
  std::vector<uint32_t> hist(blocks * kBuckets);
  ParallelBlocks(ctx, blocks, [&](int64_t b) {
    const int64_t begin = BlockBegin(b, blocks, n), end = BlockBegin(b + 1, blocks, n);
    // Four interleaved sub-histograms so that runs of one bucket do not serialize
    // on a single counter.
    std::vector<uint32_t> sub(4 * kBuckets, 0);
    uint32_t* h0 = sub.data();
    uint32_t* h1 = h0 + kBuckets;
    uint32_t* h2 = h1 + kBuckets;
    uint32_t* h3 = h2 + kBuckets;
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) {
      ++h0[(xb[i] & kAbsMask) >> kBucketShift];
      ++h1[(xb[i + 1] & kAbsMask) >> kBucketShift];
      ++h2[(xb[i + 2] & kAbsMask) >> kBucketShift];
      ++h3[(xb[i + 3] & kAbsMask) >> kBucketShift];
    }
    for (; i < end; ++i) ++h0[(xb[i] & kAbsMask) >> kBucketShift];
    uint32_t* h = hist.data() + b * kBuckets;
    for (int j = 0; j < kBuckets; ++j) h[j] = h0[j] + h1[j] + h2[j] + h3[j];
  });
  std::vector<int64_t> total(kBuckets, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint32_t* h = hist.data() + b * kBuckets;
    for (int j = 0; j < kBuckets; ++j) total[j] += h[j];
  }
  int bucket = kBuckets - 1;
  int64_t above = 0;  // elements in buckets above `bucket`
  for (; bucket > 0; --bucket) {
    if (above + total[bucket] >= k) break;
    above += total[bucket];
  }
  const uint32_t lo = static_cast<uint32_t>(bucket) << kBucketShift;
  const uint64_t definite = static_cast<uint64_t>(bucket + 1) << kBucketShift;

  std::vector<int64_t> offset(blocks + 1, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint32_t* h = hist.data() + b * kBuckets;
    int64_t count = 0;
    for (int j = bucket; j < kBuckets; ++j) count += h[j];
    offset[b + 1] = offset[b] + count;
  }
  std::vector<Cand> cands(offset[blocks]);
  ParallelBlocks(ctx, blocks, [&](int64_t b) {
    Cand* w = cands.data() + offset[b];
    CollectAtLeast(xb, BlockBegin(b, blocks, n), BlockBegin(b + 1, blocks, n), lo,
                   [&w](const Cand& c) { *w++ = c; });
  });
  std::vector<CandSpan> spans(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    spans[b] = CandSpan{cands.data() + offset[b], offset[b + 1] - offset[b]};
  }
  SelectFromCandidates(ctx, spans, offset[blocks], k, definite, above, values, indices);
}

namespace {

class TopKOp : public OpKernel {
 public:
  explicit TopKOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t n, k;
    OP_REQUIRES_OK(ctx, ReadSelectArgs(ctx, "TfdistTopK", &n, &k));
    const float* x = ctx->input(0).flat<float>().data();
    float* values;
    int32_t* indices;
    bool more;
    OP_REQUIRES_OK(ctx, PrepareSelectOutputs(ctx, x, n, k, &values, &indices, &more));
    if (!more) return;
    ExactTopK(ctx, x, n, k, values, indices);
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdistTopK").Device(tensorflow::DEVICE_CPU), TopKOp);

}  // namespace
}  // namespace compression
}  // namespace tfdist
