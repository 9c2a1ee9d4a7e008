// In-process all-reduce over a local group (see local_group.h).
#include "ucx/local_group.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "ucx/reduce.h"

namespace tfdist_ucx {

LocalGroup::LocalGroup(int size, double timeout_seconds)
    : size_(size), timeout_seconds_(timeout_seconds), jobs_(size, nullptr) {}

Status LocalGroup::AllReduce(int index, const Job& job, std::shared_ptr<void>* result) {
  const auto timeout = timeout_seconds_ > 0
                           ? std::chrono::duration<double>(timeout_seconds_)
                           : std::chrono::duration<double>(365.0 * 86400);
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  const uint64_t generation = generation_;
  jobs_[index] = &job;
  if (++arrived_ == size_) {
    cv_.notify_all();
  } else if (!cv_.wait_for(lock, timeout,
                           [&] { return arrived_ == size_ || !broken_.ok(); }) ||
             !broken_.ok()) {
    if (broken_.ok()) {
      std::ostringstream out;
      out << "in-process all-reduce: no progress for " << timeout_seconds_
          << " s, waiting for local replica(s)";
      for (int i = 0; i < size_; ++i)
        if (jobs_[i] == nullptr) out << " " << i;
      broken_ = Status::Error(out.str());
      cv_.notify_all();
    }
    jobs_[index] = nullptr;
    --arrived_;
    return broken_;
  }
  const Job& leader = *jobs_[0];
  Status error;
  for (const Job* other : jobs_)
    if (other->num_elements != leader.num_elements || other->dtype != leader.dtype)
      error = Status::Error("in-process all-reduce: the local replicas disagree on the tensor (" +
                            std::to_string(other->num_elements) + " vs " +
                            std::to_string(leader.num_elements) + " elements, or the dtype)");
  *result = leader.keep_alive;
  lock.unlock();

  if (error.ok()) {
    const int64_t n = leader.num_elements, size = job.itemsize;
    const int64_t lo = n * index / size_, hi = n * (index + 1) / size_;
    constexpr int64_t kBlock = 1 << 14;  // elements per pass, kept in cache across inputs
    auto source = [&](const Job* j) { return j->input != nullptr ? j->input : j->data; };
    for (int64_t start = lo; start < hi; start += kBlock) {
      const int64_t count = std::min(kBlock, hi - start);
      char* dst = leader.data + start * size;
      if (size_ == 1) {
        if (dst != source(jobs_[0]) + start * size)
          std::memcpy(dst, source(jobs_[0]) + start * size, count * size);
        continue;
      }
      Reduce(leader.dtype, dst, source(jobs_[0]) + start * size,
             source(jobs_[1]) + start * size, count);
      for (int j = 2; j < size_; ++j)
        Reduce(leader.dtype, dst, dst, source(jobs_[j]) + start * size, count);
    }
  }

  lock.lock();
  if (++finished_ == size_) {
    arrived_ = finished_ = 0;
    std::fill(jobs_.begin(), jobs_.end(), nullptr);
    ++generation_;
    cv_.notify_all();
  } else {
    cv_.wait(lock, [&] { return generation_ != generation; });
  }
  return error;
}

}  // namespace tfdist_ucx
