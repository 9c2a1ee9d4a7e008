// A UCX communicator that runs tfdist_ext collective schedules.
//
// One `Comm` per rank (a worker process's replica). It owns a UCP worker and an
// endpoint to every peer, and one executor thread that runs submitted jobs in
// submission order. Every rank must submit the same jobs in the same order; a
// job's plan is the rank's `Schedule` (tfdist_ext/collectives/schedule.py)
// encoded by `tfdist_ext.transport.plan.encode`:
//
//   [num_rounds, {num_steps, {kind, peer, start, stop} * num_steps} * num_rounds]
//   kind: 0 = send, 1 = receive and add, 2 = receive and overwrite.
//
// Semantics are the schedule contract: sends read the buffer as it was at the
// start of the round, receives are applied in the order listed. A job may run
// out of place: it then reads `input` wherever the plan has not yet written the
// output (a first receive-and-add writes input + received), so the input is
// never copied as a whole. Each step is
// cut into segments of at most `segment_bytes`, all posted at once, and a
// received segment is reduced as soon as it arrives when nothing else in the
// round touches its range (transfer and reduction overlap).
//
// In-process all-reduce: see local_group.h. Through shared memory among the
// processes of one machine: see host_group.h.
//
// Progress: the executor thread sleeps on a condition variable while it has no
// job. Inside a job it polls the UCP worker for up to `spin_us` microseconds
// without an event, then arms the worker and sleeps on its event descriptor, so
// a late peer never costs a core. A peer that sends nothing for
// `timeout_seconds` fails the job, naming it; the communicator then stays failed.
#ifndef TFDIST_CUSTOM_OPS_UCX_COMM_H_
#define TFDIST_CUSTOM_OPS_UCX_COMM_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ucx/abort.h"

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

// Parses an encoded plan; returns an empty string on success, else the problem.
std::string ParsePlan(const std::vector<int64_t>& flat, int world_size, Plan* plan);

enum class DType { kF16, kBF16, kF32, kF64, kI32, kI64 };

// One collective to run: the plan over `num_elements` elements at `data`.
struct Job {
  std::shared_ptr<const Plan> plan;
  DType dtype = DType::kF32;
  size_t itemsize = 0;
  char* data = nullptr;         // the output (and the input when `input` is null)
  const char* input = nullptr;  // out of place: the input, left unchanged
  int64_t num_elements = 0;
  std::string name;  // profiler label, e.g. "tfdist/ring/b0"
  bool in_process = false;  // an all-reduce over the `LocalGroup`; `plan` unused
  bool host_sum = false;    // an all-reduce over the `HostGroup`; `plan` unused
  std::shared_ptr<void> keep_alive;  // owns `data` until the job is retired
  // Makes a result (a keep_alive-like object) that reads `data` elsewhere: a
  // shared-memory sum's block, which `owner` keeps until the result is freed.
  // Unset: the job must write `data`.
  std::function<std::shared_ptr<void>(char* data, std::shared_ptr<void> owner)> alias;
  // Called when the job is retired: `error` is empty on success, and
  // `result` is the `keep_alive` of the job whose `data` holds the result
  // (this job's own, or local rank 0's for an in-process all-reduce).
  std::function<void(const std::string& error, const std::shared_ptr<void>& result)> done;
};

class HostGroup;   // host_group.h
class LocalGroup;  // local_group.h
class Written;     // written.h

struct CommOptions {
  double timeout_seconds = 30.0;  // <= 0: wait forever
  int64_t segment_bytes = 1 << 20;
  int64_t shared_output_bytes = 256 << 20;  // the host group's output arena; 0: none
  int spin_us = 200;
};

class Comm {
 public:
  // Creates the UCP worker; `Connect` must follow before `Submit`.
  Comm(int rank, int world_size, CommOptions options);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Non-empty when construction failed.
  const std::string& init_error() const { return init_error_; }
  // This worker's UCP address, to publish to the peers.
  const std::string& address() const { return address_; }
  // Creates an endpoint to every peer from their addresses (index = rank).
  std::string Connect(const std::vector<std::string>& addresses);
  // Queues a job; `job.done` is called from the executor thread.
  void Submit(Job job);
  // Makes this rank member `index` of `group` (before any in-process job).
  void JoinLocal(std::shared_ptr<LocalGroup> group, int index);
  // Creates this rank's shared-memory area; returns what peers need to map it
  // (its identity), or "" with `problem` set.
  std::string CreateHostGroup(std::string* problem);
  // Maps the peers' areas from their identities; returns "" or the problem.
  std::string JoinHost(const std::vector<std::string>& identities);
  // Whether `host_sum` jobs may run (every rank joined; before any such job).
  void UseHost(bool enable);
  // Bytes of shared-memory sums' results some rank of the host group holds.
  int64_t SharedResultBytes();
  // Member index in the local group, or -1 when not in one.
  int local_index() const { return local_index_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  struct Pending;
  void Loop();
  std::string Run(const Job& job, uint32_t seq);
  std::string RunRound(const Job& job, uint32_t seq, int round_index, Written* written);
  std::string Wait(std::vector<Pending>& pending, const int& outstanding, const Job& job,
                   int round_index);

  static void OnSend(void* request, ucs_status_t status, void* user_data);
  static void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                     void* user_data);

  const int rank_, world_size_;
  const CommOptions options_;
  const uint64_t born_ = AbortCount();  // aborts made later fail this communicator
  std::string init_error_, address_;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::vector<ucp_ep_h> endpoints_;
  Pending* bad_ = nullptr;  // a message of the current round that failed
  std::string error_;  // once set, the communicator is unusable (executor thread only)
  std::vector<char> scratch_;
  std::vector<Job> retired_on_error_;  // buffers UCX may still touch after a failure
  std::shared_ptr<LocalGroup> local_group_;
  std::unique_ptr<HostGroup> host_group_;
  bool host_enabled_ = false;
  int local_index_ = -1;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  uint32_t next_seq_ = 0;
  std::thread thread_;
};

// Process-wide table of communicators, addressed by the int64 handle the ops take.
int64_t Register(std::shared_ptr<Comm> comm);
std::shared_ptr<Comm> Lookup(int64_t handle);
void Unregister(int64_t handle);
// Makes `slot` (0: a new one) address the communicator `handle` too, so that ops
// built with `slot` run on whichever communicator it was last given; returns the
// slot, or 0 when `handle` is unknown.
int64_t Alias(int64_t slot, int64_t handle);

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_COMM_H_
