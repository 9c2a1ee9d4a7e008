#include "ucx/abort.h"

#include <atomic>
#include <mutex>

namespace tfdist_ucx {
namespace {
std::atomic<bool> aborted{false};
std::mutex mu;
std::string* first_reason = new std::string();  // never destroyed: read until exit
}  // namespace

void Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu);
  if (aborted.load(std::memory_order_relaxed)) return;
  *first_reason = reason;
  aborted.store(true, std::memory_order_release);
}

bool Aborted(std::string* reason) {
  if (!aborted.load(std::memory_order_acquire)) return false;
  if (reason != nullptr) {
    std::lock_guard<std::mutex> lock(mu);
    *reason = *first_reason;
  }
  return true;
}

}  // namespace tfdist_ucx
