// The in-process transport: the communicators of one process's ranks, for
// all-reduces that skip the wire (see transport.h).
//
// When every rank lives in this process (logical CPU replicas), their
// communicators form a `LocalGroup`, and a kLocal all-reduce job
// skips the wire: each rank's executor thread sums its 1/N-th of the elements
// over all ranks' inputs (in rank order, a cache-sized block at a time) straight
// into local rank 0's output, which then becomes every rank's result (one
// shared buffer, so the result is bit-identical on every rank and there is no
// all-gather). Waiting members sleep on a condition variable.

#ifndef TFDIST_CUSTOM_OPS_UCX_LOCAL_GROUP_H_
#define TFDIST_CUSTOM_OPS_UCX_LOCAL_GROUP_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ucx/status.h"
#include "ucx/transport.h"

namespace tfdist_ucx {

class LocalGroup {
 public:
  LocalGroup(int size, double timeout_seconds);
  // Member `index`'s part of the group's next in-process all-reduce; every
  // member calls it once per such job, in the same order, and `*result` is
  // set to the keep_alive of the job holding the sum.
  // A member missing for the timeout fails the group for good (like a
  // communicator after a failed job): later calls return at once.
  Status AllReduce(int index, const Job& job, std::shared_ptr<void>* result);

 private:
  const int size_;
  const double timeout_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // completed all-reduces
  Status broken_;            // why the group failed; it stays failed
  int arrived_ = 0, finished_ = 0;
  std::vector<const Job*> jobs_;
};

// One rank's view of its `LocalGroup`: the kLocal transport.
class LocalMember : public Transport {
 public:
  LocalMember(std::shared_ptr<LocalGroup> group, int index)
      : group_(std::move(group)), index_(index) {}
  Status AllReduce(const Job& job, std::shared_ptr<void>* result) override {
    return group_->AllReduce(index_, job, result);
  }

 private:
  const std::shared_ptr<LocalGroup> group_;
  const int index_;
};

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_LOCAL_GROUP_H_
