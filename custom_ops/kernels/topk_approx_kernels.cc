// Kernels: TfdistTopKApprox.
//
// Approximate top-k: replaces steps 1-3 of the exact top-k (topk_kernels.cc) by a
// threshold from a random sample and a single pass, falling back to the exact
// path when the sample over-estimates. Shared pieces: sparsify_common.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
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

class TopKApproxOp : public OpKernel {
 public:
  explicit TopKApproxOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sample_fraction", &sample_fraction_));
    OP_REQUIRES(ctx, sample_fraction_ > 0.0f && sample_fraction_ <= 1.0f,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistTopKApprox: attr `sample_fraction` must be in (0, 1]; "
                    "received ", sample_fraction_, ".")));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t n, k, seed;
    OP_REQUIRES_OK(ctx, ReadSelectArgs(ctx, "TfdistTopKApprox", &n, &k));
    OP_REQUIRES_OK(ctx, ReadSeed(ctx, 2, "TfdistTopKApprox", &seed));
    const float* x = ctx->input(0).flat<float>().data();
    float* values;
    int32_t* indices;
    bool more;
    OP_REQUIRES_OK(ctx, PrepareSelectOutputs(ctx, x, n, k, &values, &indices, &more));
    if (!more) return;
    if (!SampledTopK(ctx, x, n, k, seed, values, indices)) {
      ExactTopK(ctx, x, n, k, values, indices);
    }
  }

 private:
  // One sampled-threshold pass; false when the threshold admitted fewer than k
  // elements (or sampling cannot help), leaving the outputs to the exact path.
  bool SampledTopK(OpKernelContext* ctx, const float* x, int64_t n, int64_t k, int64_t seed,
                   float* values, int32_t* indices) {
    const uint32_t* xb = reinterpret_cast<const uint32_t*>(x);
    const int64_t m = std::clamp<int64_t>(
        static_cast<int64_t>(std::ceil(static_cast<double>(sample_fraction_) * n)),
        std::min<int64_t>(n, 1024), n);
    if (m >= n) return false;
    // Rank of the threshold in the sample: the expected count above the k-th
    // largest plus three standard deviations, so it admits >= k elements with
    // probability about 99.9%.
    const double p = static_cast<double>(k) / n;
    const int64_t rank = static_cast<int64_t>(std::ceil(m * p + 3.0 * std::sqrt(m * p * (1 - p)))) + 1;
    if (rank > m) return false;
    const CounterRng rng(seed, Stream::kTopKSample);
    std::vector<uint32_t> sample(m);
    const int64_t sample_blocks = NumBlocks(m, 4096);
    ParallelBlocks(ctx, sample_blocks, [&](int64_t b) {
      for (int64_t j = BlockBegin(b, sample_blocks, m); j < BlockBegin(b + 1, sample_blocks, m); ++j) {
        sample[j] = xb[rng.Below(j, n)] & kAbsMask;
      }
    });
    std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                     std::greater<uint32_t>());
    const uint32_t threshold = sample[rank - 1];
    if (threshold == 0) return false;  // admits everything: the exact path is cheaper

    const int64_t blocks = NumBlocks(n, kStreamBlock);
    std::vector<std::vector<Cand>> found(blocks);
    const double expect = static_cast<double>(rank) / m;
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      const int64_t begin = BlockBegin(b, blocks, n), end = BlockBegin(b + 1, blocks, n);
      std::vector<Cand>& out = found[b];
      out.reserve(static_cast<int64_t>(expect * 1.25 * (end - begin)) + 64);
      CollectAtLeast(xb, begin, end, threshold, [&out](const Cand& c) { out.push_back(c); });
    });
    int64_t total = 0;
    std::vector<CandSpan> spans(blocks);
    for (int64_t b = 0; b < blocks; ++b) {
      spans[b] = CandSpan{found[b].data(), static_cast<int64_t>(found[b].size())};
      total += spans[b].size;
    }
    if (total < k) return false;
    SelectFromCandidates(ctx, spans, total, k, uint64_t{1} << 32, 0, values, indices);
    return true;
  }

  float sample_fraction_;
};

REGISTER_KERNEL_BUILDER(Name("TfdistTopKApprox").Device(tensorflow::DEVICE_CPU),
                        TopKApproxOp);

}  // namespace
}  // namespace compression
}  // namespace tfdist
