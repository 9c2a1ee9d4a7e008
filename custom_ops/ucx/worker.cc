// UCP context, worker creation and event waits (see worker.h).
#include "ucx/worker.h"

#include <poll.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace tfdist_ucx {

// The process's UCP context, created once with TCP segments sized for
// bandwidth (UCX's 8k/64k defaults are ~4x slower on loopback) unless the
// user set them in the environment.
ucp_context_h SharedContext(std::string* error) {
  static std::once_flag once;
  static ucp_context_h context = nullptr;
  static std::string context_error;
  std::call_once(once, [] {
    ucp_config_t* config = nullptr;
    ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
    if (status != UCS_OK) {
      context_error = std::string("ucp_config_read: ") + ucs_status_string(status);
      return;
    }
    if (std::getenv("UCX_TCP_TX_SEG_SIZE") == nullptr)
      ucp_config_modify(config, "TCP_TX_SEG_SIZE", "128k");
    if (std::getenv("UCX_TCP_RX_SEG_SIZE") == nullptr)
      ucp_config_modify(config, "TCP_RX_SEG_SIZE", "512k");
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    status = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (status != UCS_OK) {
      context = nullptr;
      context_error = std::string("ucp_init: ") + ucs_status_string(status);
    }
  });
  if (context == nullptr) *error = context_error;
  return context;
}

Status CreateWorker(ucs_thread_mode_t thread_mode, ucp_worker_h* worker, int* event_fd) {
  *worker = nullptr;
  *event_fd = -1;
  std::string error;
  ucp_context_h context = SharedContext(&error);
  if (context == nullptr) return Status::Error(error);
  ucp_worker_params_t params = {};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = thread_mode;
  ucs_status_t status = ucp_worker_create(context, &params, worker);
  if (status != UCS_OK) {
    *worker = nullptr;
    return Status::Error(std::string("ucp_worker_create: ") + ucs_status_string(status));
  }
  if (ucp_worker_get_efd(*worker, event_fd) != UCS_OK) *event_fd = -1;
  return Status::Ok();
}

void WaitForEvent(ucp_worker_h worker, int event_fd, int timeout_ms) {
  if (event_fd >= 0 && ucp_worker_arm(worker) == UCS_OK) {
    struct pollfd fd = {event_fd, POLLIN, 0};
    poll(&fd, 1, timeout_ms);
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace tfdist_ucx
