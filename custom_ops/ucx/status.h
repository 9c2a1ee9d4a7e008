// The outcome of a call into the transports: success, or what went wrong, in
// words the TF kernels put into their errors. Nothing here throws.
#ifndef TFDIST_CUSTOM_OPS_UCX_STATUS_H_
#define TFDIST_CUSTOM_OPS_UCX_STATUS_H_

#include <string>
#include <utility>

namespace tfdist_ucx {

class [[nodiscard]] Status {
 public:
  Status() = default;  // success
  static Status Ok() { return Status(); }
  // A failure; an empty `message` becomes "unknown error", so it is never success.
  static Status Error(std::string message) {
    Status status;
    status.message_ = message.empty() ? "unknown error" : std::move(message);
    return status;
  }
  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

}  // namespace tfdist_ucx

#define TFDIST_UCX_RETURN_IF_ERROR(expr)          \
  do {                                            \
    ::tfdist_ucx::Status tfdist_ucx_status = (expr); \
    if (!tfdist_ucx_status.ok()) return tfdist_ucx_status; \
  } while (0)

#endif  // TFDIST_CUSTOM_OPS_UCX_STATUS_H_
