// A process-wide table of objects addressed by the int64 handles TF ops take
// (communicators, mailboxes). Never destroyed: objects may outlive static
// destruction at exit.
#ifndef TFDIST_CUSTOM_OPS_UCX_HANDLES_H_
#define TFDIST_CUSTOM_OPS_UCX_HANDLES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace tfdist_ucx {

template <typename T>
class HandleTable {
 public:
  int64_t Add(std::shared_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t handle = next_++;
    objects_[handle] = std::move(object);
    return handle;
  }

  // Makes `handle` (one `Add` returned) address `object` instead; the object it
  // addressed is released outside the lock (its destructor may wait).
  void Put(int64_t handle, std::shared_ptr<T> object) {
    std::shared_ptr<T> previous;
    {
      std::lock_guard<std::mutex> lock(mu_);
      previous = std::exchange(objects_[handle], std::move(object));
    }
  }

  // Null when there is no such handle.
  std::shared_ptr<T> Find(int64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(handle);
    return it == objects_.end() ? nullptr : it->second;
  }

  // The object is released outside the lock (its destructor may wait).
  void Remove(int64_t handle) {
    std::shared_ptr<T> object;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = objects_.find(handle);
      if (it == objects_.end()) return;
      object = std::move(it->second);
      objects_.erase(it);
    }
  }

 private:
  std::mutex mu_;
  std::map<int64_t, std::shared_ptr<T>> objects_;
  int64_t next_ = 1;
};

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_HANDLES_H_
