// Process-wide abort of the UCX engine: a liveness watcher that finds a peer
// dead (tfdist_ext/liveness.py) fails every wait of this process's
// communicators at once, now and later, with its reason, instead of letting
// them run into their progress timeouts.
#ifndef TFDIST_CUSTOM_OPS_UCX_ABORT_H_
#define TFDIST_CUSTOM_OPS_UCX_ABORT_H_

#include <string>

namespace tfdist_ucx {

// Records `reason`; the first reason given stays.
void Abort(const std::string& reason);
// Whether `Abort` was called; if so and `reason` is not null, sets it.
bool Aborted(std::string* reason);

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_ABORT_H_
