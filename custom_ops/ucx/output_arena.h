// Blocks of shared memory that hold all-reduce results every rank reads.
//
// A `HostGroup` whose ranks all map rank 0's shared area sums each part of an
// all-reduce once, straight into a block of rank 0's area, and every rank's
// result tensor is that block: no rank copies the others' parts into a private
// output. Rank 0 places the blocks (`Allocate`); each rank that holds a result
// drops its reference when TF frees the tensor (`Release`), and a block whose
// count is zero is reused. When nothing fits (results held for long, or more
// results in flight than the arena holds) the all-reduce falls back to private
// outputs, so the arena's size only bounds how many results share memory.
// Once the group fails, its arena is retired: the pages of every block no
// result holds go back to the system, now or when the last holder lets go.
#ifndef TFDIST_CUSTOM_OPS_UCX_OUTPUT_ARENA_H_
#define TFDIST_CUSTOM_OPS_UCX_OUTPUT_ARENA_H_

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

namespace tfdist_ucx {

class OutputArena {
 public:
  static constexpr int kMaxBlocks = 1024;
  // The reference counts, in shared memory where every rank reaches them.
  struct Counts {
    std::atomic<uint32_t> retired;
    std::atomic<uint32_t> holders[kMaxBlocks];
    std::atomic<int64_t> offset[kMaxBlocks];  // of each block placed
    std::atomic<int64_t> bytes[kMaxBlocks];
  };

  // Bytes of the blocks some rank still holds (from any rank's mapping).
  static int64_t Held(const Counts* counts) {
    int64_t total = 0;
    for (int i = 0; i < kMaxBlocks; ++i)
      if (counts->holders[i].load(std::memory_order_acquire) > 0)
        total += counts->bytes[i].load(std::memory_order_relaxed);
    return total;
  }

  // `counts` zeroed; blocks lie in [0, `bytes`) of the data that follows them.
  OutputArena(Counts* counts, int64_t bytes) : counts_(counts), bytes_(bytes) {
    for (int i = kMaxBlocks - 1; i >= 0; --i) free_.push_back(i);
  }

  // Places `bytes` for `holders` ranks: returns the block's index and sets
  // `*offset`, or returns -1 when no gap is large enough.
  int Allocate(int64_t bytes, int holders, int64_t* offset) {
    Reclaim();
    bytes = Rounded(bytes);
    if (free_.empty() || bytes > bytes_ || counts_->retired.load() != 0) return -1;
    int64_t at = 0;
    size_t before = 0;  // live_ stays sorted by offset
    for (; before < live_.size() && live_[before].offset - at < bytes; ++before)
      at = live_[before].offset + live_[before].bytes;
    if (before == live_.size() && bytes_ - at < bytes) return -1;
    const int index = free_.back();
    free_.pop_back();
    counts_->offset[index].store(at, std::memory_order_relaxed);
    counts_->bytes[index].store(bytes, std::memory_order_relaxed);
    counts_->holders[index].store(static_cast<uint32_t>(holders), std::memory_order_release);
    live_.insert(live_.begin() + before, Block{at, bytes, index});
    *offset = at;
    return index;
  }

  // A rank that held block `index` (at `data`, `bytes` long) is done with it
  // (any rank, any thread).
  static void Release(Counts* counts, int index, char* data, int64_t bytes) {
    if (counts->holders[index].fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        counts->retired.load(std::memory_order_seq_cst) != 0)
      Discard(data, bytes);
  }

  // The group failed (any rank may say so): no block is placed any more, the
  // pages no result holds go back to the system (`data`: where the `bytes`
  // of blocks start), and held ones follow in `Release`.
  static void Retire(Counts* counts, char* data, int64_t bytes) {
    counts->retired.store(1, std::memory_order_seq_cst);
    std::vector<std::pair<int64_t, int64_t>> held;  // offset, bytes
    for (int i = 0; i < kMaxBlocks; ++i)
      if (counts->holders[i].load(std::memory_order_seq_cst) > 0)
        held.emplace_back(counts->offset[i].load(std::memory_order_relaxed),
                          counts->bytes[i].load(std::memory_order_relaxed));
    std::sort(held.begin(), held.end());
    int64_t at = 0;
    for (const auto& block : held) {
      Discard(data + at, block.first - at);
      at = std::max(at, block.first + block.second);
    }
    Discard(data + at, bytes - at);
  }

  static int64_t Rounded(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  static constexpr int64_t kAlign = 4096;
  struct Block {
    int64_t offset, bytes;
    int index;
  };

  static void Discard(char* data, int64_t bytes) {
    if (bytes > 0) madvise(data, static_cast<size_t>(Rounded(bytes)), MADV_REMOVE);
  }

  void Reclaim() {
    size_t kept = 0;
    for (const Block& block : live_) {
      if (counts_->holders[block.index].load(std::memory_order_seq_cst) == 0)
        free_.push_back(block.index);
      else
        live_[kept++] = block;
    }
    live_.resize(kept);
  }

  Counts* const counts_;
  const int64_t bytes_;
  std::vector<Block> live_;
  std::vector<int> free_;  // unused block indices
};

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_OUTPUT_ARENA_H_
