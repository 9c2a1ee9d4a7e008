// A tfdist_ext communicator: one rank's transports and the thread that runs
// its jobs (see transport.h for what a job is and how it travels).
//
// One `Comm` per rank (a worker process's replica). It owns a `UcxTransport`
// (always), joins a `LocalGroup` when every rank lives in this process and a
// `HostGroup` when they are processes of one machine, and runs the submitted
// jobs in submission order on one executor thread, each on the transport its
// `path` names. Every rank must submit the same jobs in the same order. The
// executor sleeps on a condition variable while it has no job. A failed job
// leaves the communicator failed: later jobs fail at once with the same status.
// A rehearsal communicator (`CommOptions::rehearsal`) moves no bytes: each job
// completes with its input as its result, so that a function traced on it runs.
#ifndef TFDIST_CUSTOM_OPS_UCX_COMM_H_
#define TFDIST_CUSTOM_OPS_UCX_COMM_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ucx/abort.h"
#include "ucx/status.h"
#include "ucx/transport.h"

namespace tfdist_ucx {

class HostGroup;     // host_group.h
class LocalGroup;    // local_group.h
class LocalMember;   // local_group.h
class UcxTransport;  // ucx_transport.h

struct CommOptions {
  double timeout_seconds = 30.0;  // <= 0: wait forever
  int64_t segment_bytes = 1 << 20;
  int64_t shared_output_bytes = 256 << 20;  // the host group's output arena; 0: none
  int spin_us = 200;
  // Never connected: every job completes at once, its input as its result.
  bool rehearsal = false;
};

class Comm {
 public:
  // Creates the UCX transport; `Connect` must follow before `Submit`.
  Comm(int rank, int world_size, CommOptions options);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Not ok when construction failed.
  const Status& init_status() const;
  // This rank's UCP address, to publish to the peers.
  const std::string& address() const;
  // Creates an endpoint to every peer from their addresses (index = rank).
  Status Connect(const std::vector<std::string>& addresses);
  // Queues a job; `job.done` is called from the executor thread.
  void Submit(Job job);
  // Makes this rank member `index` of `group` (before any kLocal job).
  void JoinLocal(std::shared_ptr<LocalGroup> group, int index);
  // Creates this rank's shared-memory area and sets `*identity` to what peers
  // need to map it.
  Status CreateHostGroup(std::string* identity);
  // Maps the peers' areas from their identities.
  Status JoinHost(const std::vector<std::string>& identities);
  // Whether kHost jobs use the host group (every rank joined; before any such
  // job); otherwise they run their plan on the wire.
  void UseHost(bool enable);
  // Bytes of shared-memory sums' results some rank of the host group holds.
  int64_t SharedResultBytes();
  // Member index in the local group, or -1 when not in one.
  int local_index() const { return local_index_; }
  int rank() const { return rank_; }
  bool rehearsal() const { return options_.rehearsal; }
  int world_size() const { return world_size_; }

 private:
  void Loop();
  // The transport that carries `path` now, or null (kLocal outside a local group).
  Transport* TransportFor(Path path);

  const int rank_, world_size_;
  const CommOptions options_;
  const uint64_t born_ = AbortCount();  // aborts made later fail this communicator
  std::unique_ptr<UcxTransport> wire_;
  std::unique_ptr<Transport> rehearsal_;  // set for a rehearsal communicator
  std::unique_ptr<LocalMember> local_;
  std::unique_ptr<HostGroup> host_group_;
  bool host_enabled_ = false;
  int local_index_ = -1;
  Status failed_;  // once set, the communicator is unusable (executor thread only)
  std::vector<Job> retired_on_error_;  // buffers UCX may still touch after a failure

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
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
