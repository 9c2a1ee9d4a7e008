// The process's UCP context and the worker set-up and wait that the
// communicator (comm.h) and the mailbox (mailbox.h) share.
#ifndef TFDIST_CUSTOM_OPS_UCX_WORKER_H_
#define TFDIST_CUSTOM_OPS_UCX_WORKER_H_

#include <ucp/api/ucp.h>

#include <string>

#include "ucx/status.h"

namespace tfdist_ucx {

// The process's UCP context (tag matching and wake-up), created on first use;
// null with `error` set when UCX cannot start.
ucp_context_h SharedContext(std::string* error);

// Creates a UCP worker on the shared context and fetches its event descriptor
// (-1 where the transports raise no events).
Status CreateWorker(ucs_thread_mode_t thread_mode, ucp_worker_h* worker, int* event_fd);

// Sleeps until `worker` has an event or `timeout_ms` passed; without an event
// descriptor (or when arming answers busy), sleeps 100 us instead.
void WaitForEvent(ucp_worker_h worker, int event_fd, int timeout_ms);

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_WORKER_H_
