// Helpers shared by the gradient-compression kernels: deterministic blocking over
// the CPU worker pool, a counter-based random number generator, float magnitude
// bits, and the bit-packing layout every packed payload uses.
//
// Determinism: every kernel splits its input into blocks whose boundaries depend
// only on the input size (never on the thread count), and random numbers depend
// only on (seed, element index). So an op gives bit-identical output for the same
// inputs and seed on any machine and with any intra-op thread setting.
#ifndef TFDIST_CUSTOM_OPS_KERNELS_COMPRESSION_COMMON_H_
#define TFDIST_CUSTOM_OPS_KERNELS_COMPRESSION_COMMON_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tfdist {
namespace compression {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the packed payload layout assumes a little-endian host");

// ---------------------------------------------------------------------------
// Blocking and parallel-for.

// Number of blocks for `units` units of work: about `min_block` units per block,
// at most kMaxBlocks blocks. Depends only on `units`, so results that reduce per
// block (sums, maxima) are identical for every thread count.
constexpr int64_t kMaxBlocks = 64;

inline int64_t NumBlocks(int64_t units, int64_t min_block) {
  if (units <= 0) return 1;
  return std::clamp<int64_t>((units + min_block - 1) / min_block, 1, kMaxBlocks);
}

// [begin, end) of block `b` out of `blocks` over `units` units.
inline int64_t BlockBegin(int64_t b, int64_t blocks, int64_t units) {
  return static_cast<int64_t>((static_cast<__int128>(units) * b) / blocks);
}

// Runs fn(b) for b in [0, blocks) on the device's intra-op worker threads (inline
// when there is one block or one thread).
template <typename Fn>
void ParallelBlocks(tensorflow::OpKernelContext* ctx, int64_t blocks, const Fn& fn) {
  const auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
  if (blocks <= 1 || threads == nullptr || threads->num_threads <= 1) {
    for (int64_t b = 0; b < blocks; ++b) fn(b);
    return;
  }
  using Pool = tsl::thread::ThreadPool;
  // One block per shard; the constructor (not TF 2.21's SchedulingParams::Fixed) builds on
  // TF 2.19 too.
  threads->workers->ParallelFor(
      blocks, Pool::SchedulingParams(Pool::SchedulingStrategy::kFixedBlockSize, std::nullopt, 1),
      [&fn](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) fn(b);
      });
}

// ---------------------------------------------------------------------------
// Counter-based random numbers (SplitMix64, Steele et al. 2014): the value for
// counter c is Mix(key + c * golden), a pure function of (key, c), so any element
// can draw its number independently of the others and of the blocking.

inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Per-op salts so that the same user seed gives unrelated streams in different ops.
enum class Stream : uint64_t {
  kRandomK = 0x72616e646f6d6b31ULL,
  kTopKSample = 0x746f706b73616d70ULL,
  kQsgd = 0x7173676471736764ULL,
  kTernGrad = 0x7465726e67726164ULL,
};

class CounterRng {
 public:
  CounterRng(int64_t seed, Stream stream)
      : key_(Mix64(static_cast<uint64_t>(seed) ^ static_cast<uint64_t>(stream)) ^
             Mix64(static_cast<uint64_t>(stream) + 0x9e3779b97f4a7c15ULL)) {}

  // 64 random bits for counter `c`.
  uint64_t Bits(uint64_t c) const { return Mix64(key_ + c * 0x9e3779b97f4a7c15ULL); }

  // Uniform integer in [0, bound) by multiply-shift (bias below bound / 2^64).
  uint64_t Below(uint64_t c, uint64_t bound) const {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Bits(c)) * bound) >> 64);
  }

 private:
  uint64_t key_;
};

// Per-element uniform numbers for stochastic rounding, written so that loops over
// elements auto-vectorize (32-bit multiplies only): element i gets
// Fmix32(Fmix32(i * golden ^ k0) ^ k1) >> 8, a keyed bijection of the counter
// (Fmix32 is MurmurHash3's finalizer), so it depends only on (seed, i).
inline uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

class Uniform24Stream {
 public:
  Uniform24Stream(int64_t seed, Stream stream) {
    const uint64_t key = Mix64(Mix64(static_cast<uint64_t>(seed) ^ static_cast<uint64_t>(stream)));
    k0_ = static_cast<uint32_t>(key);
    k1_ = static_cast<uint32_t>(key >> 32);
  }

  // Uniform integer in [0, 2^24) for element i (< 2^32).
  int32_t At(uint32_t i) const {
    return static_cast<int32_t>(Fmix32(Fmix32((i * 0x9e3779b9u) ^ k0_) ^ k1_) >> 8);
  }

 private:
  uint32_t k0_, k1_;
};

// Stochastic rounding: an element rounds up iff At(i) < p * 2^24, which happens
// with probability ceil(p * 2^24) / 2^24 (bias below 6e-8).
constexpr float kTwo24 = 16777216.0f;

// ---------------------------------------------------------------------------
// Float magnitudes as integers: for IEEE floats, |x| orders like its bit pattern
// with the sign cleared (NaN patterns sort above infinity).

inline uint32_t FloatBits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

constexpr uint32_t kAbsMask = 0x7fffffffu;

// ---------------------------------------------------------------------------
// Bit packing. A payload of n codes of `bits` bits is a little-endian bit stream:
// code i occupies stream bits [i*bits, (i+1)*bits), least significant bit first,
// and stream bit j is bit (j % 8) of byte j / 8. It takes ceil(n*bits/8) bytes;
// unused high bits of the last byte are zero. Eight codes fill exactly `bits`
// bytes, so group g of 8 codes owns bytes [g*bits, (g+1)*bits) and groups can be
// packed and unpacked independently in parallel.

inline int64_t PackedBytes(int64_t n, int bits) { return (n * bits + 7) / 8; }

inline int64_t NumGroups(int64_t n) { return (n + 7) / 8; }

// Accumulator wide enough for 8 codes of `Bits` bits.
template <int Bits>
using GroupWord = typename std::conditional<(Bits <= 8), uint64_t, unsigned __int128>::type;

// Packs `count` codes (each below 2^Bits) into ceil(count * Bits / 8) bytes at
// `out`. Used on chunks that start at a multiple of 8 codes, so a chunk starting
// at code c writes from byte c / 8 * Bits.
template <int Bits, typename Code>
inline void PackCodes(const Code* codes, int64_t count, uint8_t* out) {
  using Word = GroupWord<Bits>;
  const int64_t full = count / 8;
  for (int64_t g = 0; g < full; ++g) {
    const Code* c = codes + g * 8;
    Word word = 0;
    for (int j = 0; j < 8; ++j) word |= static_cast<Word>(c[j]) << (j * Bits);
    std::memcpy(out + g * Bits, &word, Bits);
  }
  const int rest = static_cast<int>(count - full * 8);
  if (rest > 0) {
    const Code* c = codes + full * 8;
    Word word = 0;
    for (int j = 0; j < rest; ++j) word |= static_cast<Word>(c[j]) << (j * Bits);
    std::memcpy(out + full * Bits, &word, (rest * Bits + 7) / 8);
  }
}

// Inverse of PackCodes: `count` codes from ceil(count * Bits / 8) bytes at `in`.
// Groups whose full-width word load stays inside those bytes load it at once;
// the last few assemble it byte by byte (a partial memcpy into the word would
// stall store forwarding).
template <int Bits, typename Code>
inline void UnpackCodes(const uint8_t* in, int64_t count, Code* codes) {
  using Word = GroupWord<Bits>;
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  const int64_t bytes = (count * Bits + 7) / 8;
  const int64_t groups = (count + 7) / 8;
  const int64_t fast = std::min<int64_t>(
      count / 8, bytes >= static_cast<int64_t>(sizeof(Word))
                     ? (bytes - static_cast<int64_t>(sizeof(Word))) / Bits + 1
                     : 0);
  for (int64_t g = 0; g < fast; ++g) {
    Word word;
    std::memcpy(&word, in + g * Bits, sizeof(Word));
    Code* c = codes + g * 8;
    for (int j = 0; j < 8; ++j) {
      c[j] = static_cast<Code>(static_cast<uint32_t>(word >> (j * Bits)) & kMask);
    }
  }
  for (int64_t g = fast; g < groups; ++g) {
    const int in_group = static_cast<int>(std::min<int64_t>(8, count - g * 8));
    const int nbytes = (in_group * Bits + 7) / 8;
    Word word = 0;
    for (int q = 0; q < nbytes; ++q) word |= static_cast<Word>(in[g * Bits + q]) << (8 * q);
    Code* c = codes + g * 8;
    for (int j = 0; j < in_group; ++j) {
      c[j] = static_cast<Code>(static_cast<uint32_t>(word >> (j * Bits)) & kMask);
    }
  }
}

// Elements per chunk when a kernel computes codes into a local buffer and then
// packs them (a multiple of 8, small enough for L1).
constexpr int64_t kChunk = 1024;

// Calls f(std::integral_constant<int, B>{}) for the runtime bit width 1 <= bits <= 16.
template <typename F>
inline void DispatchBits(int bits, const F& f) {
  switch (bits) {
#define TFDIST_BITS_CASE(B) \
  case B:                   \
    f(std::integral_constant<int, B>{}); \
    break;
    TFDIST_BITS_CASE(1) TFDIST_BITS_CASE(2) TFDIST_BITS_CASE(3) TFDIST_BITS_CASE(4)
    TFDIST_BITS_CASE(5) TFDIST_BITS_CASE(6) TFDIST_BITS_CASE(7) TFDIST_BITS_CASE(8)
    TFDIST_BITS_CASE(9) TFDIST_BITS_CASE(10) TFDIST_BITS_CASE(11) TFDIST_BITS_CASE(12)
    TFDIST_BITS_CASE(13) TFDIST_BITS_CASE(14) TFDIST_BITS_CASE(15) TFDIST_BITS_CASE(16)
#undef TFDIST_BITS_CASE
    default:
      break;
  }
}

// Elements per block for streaming kernels (about 128 KiB of float32 input).
constexpr int64_t kStreamBlock = 1 << 15;

}  // namespace compression
}  // namespace tfdist

#endif  // TFDIST_CUSTOM_OPS_KERNELS_COMPRESSION_COMMON_H_
