#include "ucx/abort.h"

#include <atomic>
#include <mutex>

namespace tfdist_ucx {
namespace {
std::atomic<uint64_t> count{0};
std::atomic<bool> for_later{false};
std::mutex mu;
std::string* last_reason = new std::string();  // never destroyed: read until exit
}  // namespace

void Abort(const std::string& reason, bool later) {
  std::lock_guard<std::mutex> lock(mu);
  if (for_later.load(std::memory_order_relaxed)) return;  // the first final reason stays
  *last_reason = reason;
  if (later) for_later.store(true, std::memory_order_release);
  count.fetch_add(1, std::memory_order_acq_rel);
}

uint64_t AbortCount() { return count.load(std::memory_order_acquire); }

bool Aborted(uint64_t born, std::string* reason) {
  if (!for_later.load(std::memory_order_acquire) &&
      count.load(std::memory_order_acquire) <= born)
    return false;
  if (reason != nullptr) {
    std::lock_guard<std::mutex> lock(mu);
    *reason = *last_reason;
  }
  return true;
}

}  // namespace tfdist_ucx
