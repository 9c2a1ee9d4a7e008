// Abort of the UCX engine's waits: a liveness watcher that finds a peer dead
// (tfdist_ext/liveness.py) fails every wait of this process's communicators
// at once, with its reason, instead of letting them run into their progress
// timeouts. A process that stops after the failure aborts everything, now and
// later; an elastic job (tfdist_ext/elastic) aborts only the communicators of
// the broken membership and goes on with new ones.
#ifndef TFDIST_CUSTOM_OPS_UCX_ABORT_H_
#define TFDIST_CUSTOM_OPS_UCX_ABORT_H_

#include <cstdint>
#include <string>

namespace tfdist_ucx {

// Records `reason` and fails the waits of every communicator created before
// this call; with `later`, also of every communicator created after it.
void Abort(const std::string& reason, bool later = true);
// Aborts so far; a communicator keeps the count it was created at.
uint64_t AbortCount();
// Whether an abort applies to a communicator created at AbortCount() `born`;
// if so and `reason` is not null, sets it.
bool Aborted(uint64_t born, std::string* reason);
// Whether any abort was made.
inline bool Aborted(std::string* reason) { return Aborted(0, reason); }

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_ABORT_H_
