// Bookkeeping for running a job out of place (see ucx_transport.h).
#ifndef TFDIST_CUSTOM_OPS_UCX_WRITTEN_H_
#define TFDIST_CUSTOM_OPS_UCX_WRITTEN_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "ucx/transport.h"

namespace tfdist_ucx {

// The element ranges of an out-of-place job's output that hold their current
// value; everywhere else the current value is still the input's.
class Written {
 public:
  explicit Written(const Job& job) : job_(job) {
    if (job.input == nullptr) Add(0, job.num_elements);
  }
  bool All(int64_t start, int64_t stop) const {
    for (const auto& r : ranges_)
      if (r.first <= start && stop <= r.second) return true;
    return false;
  }
  bool None(int64_t start, int64_t stop) const {
    for (const auto& r : ranges_)
      if (r.first < stop && start < r.second) return false;
    return true;
  }
  void Add(int64_t start, int64_t stop) {
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& r : ranges_) {
      if (r.second < start || stop < r.first) {
        merged.push_back(r);
      } else {
        start = std::min(start, r.first);
        stop = std::max(stop, r.second);
      }
    }
    merged.emplace_back(start, stop);
    std::sort(merged.begin(), merged.end());
    ranges_ = std::move(merged);
  }
  // Copies the input into the unwritten parts of [start, stop).
  void Fill(int64_t start, int64_t stop) {
    int64_t cursor = start;
    for (const auto& r : ranges_) {
      if (r.second <= cursor || r.first >= stop) continue;
      if (r.first > cursor) Copy(cursor, r.first);
      cursor = r.second;
    }
    if (cursor < stop) Copy(cursor, stop);
    Add(start, stop);
  }
  // Makes [start, stop) all written or all unwritten (copying the input
  // into its unwritten parts when it is partly written).
  void Settle(int64_t start, int64_t stop) {
    if (!All(start, stop) && !None(start, stop)) Fill(start, stop);
  }
  // The current value of [start, stop), which is either all written or none.
  const char* Source(int64_t start, int64_t stop) const {
    const char* base = All(start, stop) ? job_.data : job_.input;
    return base + start * job_.itemsize;
  }

 private:
  void Copy(int64_t start, int64_t stop) {
    std::memcpy(job_.data + start * job_.itemsize, job_.input + start * job_.itemsize,
                (stop - start) * job_.itemsize);
  }
  const Job& job_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // sorted, disjoint, not touching
};

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_WRITTEN_H_
