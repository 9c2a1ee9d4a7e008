// What travels (a `Job`) and the interface of the paths it travels by.
//
// A job is an all-reduce of `num_elements` elements at `data`. Three
// `Transport`s carry it, chosen per job by its `path`:
//   kWire  - `UcxTransport` (ucx_transport.h): the rank's `Schedule`
//            (tfdist_ext/collectives/schedule.py) run over UCX, between
//            processes and hosts;
//   kLocal - `LocalMember` (local_group.h): the ranks are threads of this
//            process (logical replicas); sums straight from their buffers;
//   kHost  - `HostGroup` (host_group.h): the ranks are processes of one
//            machine; sums through shared memory.
// A `Comm` (comm.h) owns one of each it can use and runs its jobs in order.
//
// The plan of a wire job is the rank's schedule encoded by
// `tfdist_ext.transport.plan.encode`:
//
//   [num_rounds, {num_steps, {kind, peer, start, stop} * num_steps} * num_rounds]
//   kind: 0 = send, 1 = receive and add, 2 = receive and overwrite.
//
// Semantics are the schedule contract: sends read the buffer as it was at the
// start of the round, receives are applied in the order listed.
#ifndef TFDIST_CUSTOM_OPS_UCX_TRANSPORT_H_
#define TFDIST_CUSTOM_OPS_UCX_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ucx/status.h"

namespace tfdist_ucx {

enum StepKind : int64_t { kSend = 0, kRecvReduce = 1, kRecvCopy = 2 };

struct Step {
  StepKind kind;
  int peer;
  int64_t start, stop;  // element range, never empty
};

struct Plan {
  std::vector<std::vector<Step>> rounds;
};

// Parses an encoded plan for a rank of `world_size` ranks.
Status ParsePlan(const std::vector<int64_t>& flat, int world_size, Plan* plan);

enum class DType { kF16, kBF16, kF32, kF64, kI32, kI64 };

// Which transport carries a job.
enum class Path { kWire, kLocal, kHost };

// One collective to run.
struct Job {
  std::shared_ptr<const Plan> plan;  // kWire (kHost where the ranks share no memory)
  Path path = Path::kWire;
  DType dtype = DType::kF32;
  size_t itemsize = 0;
  char* data = nullptr;         // the output (and the input when `input` is null)
  const char* input = nullptr;  // out of place: the input, left unchanged
  int64_t num_elements = 0;
  std::string name;  // profiler label, e.g. "tfdist/ring/b0"
  std::shared_ptr<void> keep_alive;  // owns `data` until the job is retired
  // Makes a result (a keep_alive-like object) that reads `data` elsewhere: a
  // shared-memory sum's block, which `owner` keeps until the result is freed.
  // Unset: the job must write `data`.
  std::function<std::shared_ptr<void>(char* data, std::shared_ptr<void> owner)> alias;
  // Called when the job is retired, with its status and `result`, the
  // `keep_alive` of the job whose `data` holds the result (this job's own, or
  // local rank 0's for an in-process all-reduce).
  std::function<void(const Status& status, const std::shared_ptr<void>& result)> done;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // This rank's part of `job`; every rank of the transport runs the same jobs in
  // the same order. Sets `*result` to the `keep_alive` that holds the sum when it
  // is not the job's own. A failure leaves the transport failed for good.
  virtual Status AllReduce(const Job& job, std::shared_ptr<void>* result) = 0;
};

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_TRANSPORT_H_
