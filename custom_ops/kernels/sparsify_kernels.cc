// Kernels: TfdistTopK, TfdistTopKApprox, TfdistRandomK, TfdistSparseToDense.
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
// Approximate top-k replaces steps 1-3 by a threshold from a random sample and a
// single pass, falling back to the exact path when the sample over-estimates.
#include <algorithm>
#include <cmath>
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
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

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

constexpr int kBucketShift = 20;
constexpr int kBuckets = 1 << (31 - kBucketShift);  // 2048

// Validates x (input 0, a vector of n < 2^31 elements) and k (input 1, a scalar
// in [0, n]).
absl::Status ReadSelectArgs(OpKernelContext* ctx, const char* op, int64_t* n, int64_t* k) {
  const Tensor& x = ctx->input(0);
  const Tensor& k_t = ctx->input(1);
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

absl::Status ReadSeed(OpKernelContext* ctx, int input, const char* op, int64_t* seed) {
  const Tensor& seed_t = ctx->input(input);
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
void SelectFromCandidates(OpKernelContext* ctx, const std::vector<CandSpan>& spans,
                          int64_t total, int64_t k, uint64_t definite,
                          int64_t num_definite, float* values, int32_t* indices) {
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

// Allocates (values[k], indices[k]) and fills them when k == 0 or k == n; sets
// *more when the caller still has to fill them.
absl::Status PrepareSelectOutputs(OpKernelContext* ctx, const float* x, int64_t n, int64_t k,
                                  float** values, int32_t** indices, bool* more) {
  Tensor* values_t = nullptr;
  Tensor* indices_t = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({k}), &values_t));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({k}), &indices_t));
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

template <typename T>
class RandomKOp : public OpKernel {
 public:
  explicit RandomKOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t n, k, seed;
    OP_REQUIRES_OK(ctx, ReadSelectArgs(ctx, "TfdistRandomK", &n, &k));
    OP_REQUIRES_OK(ctx, ReadSeed(ctx, 2, "TfdistRandomK", &seed));
    const T* x = ctx->input(0).flat<T>().data();
    Tensor* values_t = nullptr;
    Tensor* indices_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &values_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({k}), &indices_t));
    if (k == 0) return;
    T* values = values_t->flat<T>().data();
    int32_t* indices = indices_t->flat<int32_t>().data();

    // Floyd's algorithm marks a uniformly random m-subset in a bitmap: for j in
    // [n - m, n) draw t in [0, j]; mark t, or j if t is already marked. With
    // k > n / 2 it draws the n - k positions left out instead.
    const bool complement = k > n / 2;
    const int64_t m = complement ? n - k : k;
    const int64_t words = (n + 63) / 64;
    std::vector<uint64_t> bitmap(words, 0);
    const CounterRng rng(seed, Stream::kRandomK);
    for (int64_t j = n - m; j < n; ++j) {
      const uint64_t t = rng.Below(static_cast<uint64_t>(j), static_cast<uint64_t>(j) + 1);
      const uint64_t pick = ((bitmap[t >> 6] >> (t & 63)) & 1) ? static_cast<uint64_t>(j) : t;
      bitmap[pick >> 6] |= uint64_t{1} << (pick & 63);
    }
    if (complement) {
      for (uint64_t& word : bitmap) word = ~word;
      if (n % 64 != 0) bitmap[words - 1] &= (uint64_t{1} << (n % 64)) - 1;
    }
    // Emit marked positions in order: per block of words, count, then write.
    const int64_t blocks = NumBlocks(words, 2048);
    std::vector<int64_t> offset(blocks + 1, 0);
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      int64_t count = 0;
      for (int64_t w = BlockBegin(b, blocks, words); w < BlockBegin(b + 1, blocks, words); ++w) {
        count += __builtin_popcountll(bitmap[w]);
      }
      offset[b + 1] = count;
    });
    for (int64_t b = 0; b < blocks; ++b) offset[b + 1] += offset[b];
    ParallelBlocks(ctx, blocks, [&](int64_t b) {
      int64_t out = offset[b];
      for (int64_t w = BlockBegin(b, blocks, words); w < BlockBegin(b + 1, blocks, words); ++w) {
        for (uint64_t word = bitmap[w]; word != 0; word &= word - 1) {
          const int64_t i = w * 64 + __builtin_ctzll(word);
          indices[out] = static_cast<int32_t>(i);
          values[out] = x[i];
          ++out;
        }
      }
    });
  }
};

template <typename T>
class SparseToDenseOp : public OpKernel {
 public:
  explicit SparseToDenseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values_t = ctx->input(0);
    const Tensor& indices_t = ctx->input(1);
    const Tensor& n_t = ctx->input(2);
    OP_REQUIRES(ctx, values_t.dims() == 1 && indices_t.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistSparseToDense: `values` and `indices` must be vectors; "
                    "received shapes ", values_t.shape().DebugString(), " and ",
                    indices_t.shape().DebugString(), ".")));
    OP_REQUIRES(ctx, values_t.NumElements() == indices_t.NumElements(),
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistSparseToDense: `values` and `indices` must have the same "
                    "length; received ", values_t.NumElements(), " values and ",
                    indices_t.NumElements(), " indices.")));
    OP_REQUIRES(ctx, n_t.dims() == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistSparseToDense: `n` must be a scalar; received shape ",
                    n_t.shape().DebugString(), ".")));
    const int64_t n = n_t.scalar<int32_t>()();
    OP_REQUIRES(ctx, n >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "TfdistSparseToDense: `n` must be >= 0; received n=", n, ".")));
    const int64_t count = indices_t.NumElements();
    const int32_t* indices = indices_t.flat<int32_t>().data();
    const T* values = values_t.flat<T>().data();

    // Find the first out-of-range index, if any (blocks in parallel).
    const int64_t check_blocks = NumBlocks(count, kStreamBlock);
    std::vector<int64_t> first_bad(check_blocks, -1);
    ParallelBlocks(ctx, check_blocks, [&](int64_t b) {
      const int64_t end = BlockBegin(b + 1, check_blocks, count);
      for (int64_t j = BlockBegin(b, check_blocks, count); j < end; ++j) {
        if (indices[j] < 0 || indices[j] >= n) {
          first_bad[b] = j;
          return;
        }
      }
    });
    for (int64_t bad : first_bad) {
      OP_REQUIRES(ctx, bad < 0,
                  absl::InvalidArgumentError(absl::StrCat(
                      "TfdistSparseToDense: indices[", bad, "] = ", indices[bad],
                      " is out of range [0, n) for n=", n, ".")));
    }

    Tensor* dense_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &dense_t));
    T* dense = dense_t->flat<T>().data();
    const int64_t fill_blocks = NumBlocks(n, kStreamBlock);
    ParallelBlocks(ctx, fill_blocks, [&](int64_t b) {
      const int64_t begin = BlockBegin(b, fill_blocks, n);
      std::fill(dense + begin, dense + BlockBegin(b + 1, fill_blocks, n), T(0));
    });
    for (int64_t j = 0; j < count; ++j) dense[indices[j]] += values[j];
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdistTopK").Device(tensorflow::DEVICE_CPU), TopKOp);
REGISTER_KERNEL_BUILDER(Name("TfdistTopKApprox").Device(tensorflow::DEVICE_CPU),
                        TopKApproxOp);

#define TFDIST_REGISTER_RANDOM_K(T)                                                 \
  REGISTER_KERNEL_BUILDER(                                                          \
      Name("TfdistRandomK").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      RandomKOp<T>);
TFDIST_REGISTER_RANDOM_K(float)
TFDIST_REGISTER_RANDOM_K(double)
TFDIST_REGISTER_RANDOM_K(Eigen::half)
TFDIST_REGISTER_RANDOM_K(Eigen::bfloat16)
#undef TFDIST_REGISTER_RANDOM_K

#define TFDIST_REGISTER_SPARSE_TO_DENSE(T)                                                \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("TfdistSparseToDense").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      SparseToDenseOp<T>);
TFDIST_REGISTER_SPARSE_TO_DENSE(float)
TFDIST_REGISTER_SPARSE_TO_DENSE(double)
#undef TFDIST_REGISTER_SPARSE_TO_DENSE

}  // namespace
}  // namespace compression
}  // namespace tfdist
