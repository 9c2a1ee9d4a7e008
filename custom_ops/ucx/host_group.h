// The shared-memory transport: the ranks of one machine, for all-reduces
// through shared memory (see transport.h).
//
// When every rank of the world is a process of this machine (same boot, PID
// and network namespace), each communicator owns a shared-memory area (a
// memfd) that every peer maps through /proc/<pid>/fd, and a kHost all-reduce
// job skips UCX. The buffer is cut into chunks of `chunk_bytes`,
// each chunk into one part per rank (sizes within one element), and for each
// chunk:
//   1. every rank copies the parts it does not own into its staging slot;
//   2. every rank sums its own part over its input and the peers' staging
//      slots (in rank order), into its output and its result slot;
//   3. every rank copies the other parts from their owners' result slots.
// Each part is summed by one rank and copied by the others, so every rank ends
// with the same bits. Each rank has two slots, so it stages chunk t + 1 while
// the peers still read chunk t. A rank waits for its peers on counters in
// their areas: it polls for `spin_us`, then sleeps on a futex.
//
// With `output_bytes` > 0, rank 0's area also holds an `OutputArena`: where a
// job's result fits there (and the job can take a shared result, `Job::alias`),
// step 2 writes each part straight into that one block and step 3 is skipped;
// every rank's result is the block, read-only to TF (output_arena.h). This
// halves the bytes written per rank; the staged copies stay.
//
// Tuning: `chunk_bytes` (the communicator's segment size) trades the number of
// hand-offs against how much of a chunk stays in cache between steps 1 and 2.
// A peer that moves no counter for `timeout_seconds`, or whose process has
// exited, fails the job naming it; the group then stays failed.
#ifndef TFDIST_CUSTOM_OPS_UCX_HOST_GROUP_H_
#define TFDIST_CUSTOM_OPS_UCX_HOST_GROUP_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ucx/abort.h"
#include "ucx/output_arena.h"
#include "ucx/status.h"
#include "ucx/transport.h"

namespace tfdist_ucx {

class HostGroup : public Transport {
 public:
  // Creates this rank's shared area; `error` says why when it returns null.
  static std::unique_ptr<HostGroup> Create(int rank, int world_size, int64_t chunk_bytes,
                                           int64_t output_bytes, int spin_us,
                                           double timeout_seconds, std::string* error);
  ~HostGroup() override;
  HostGroup(const HostGroup&) = delete;
  HostGroup& operator=(const HostGroup&) = delete;

  // What a peer needs to map this rank's area: "<machine> <pid> <fd>".
  const std::string& identity() const { return identity_; }

  // Maps every peer's area from the identities (index = rank), or says why
  // this rank cannot join (another machine, namespace or a refused open).
  Status Join(const std::vector<std::string>& identities);

  // This rank's part of the next kHost all-reduce: sums `job`'s input
  // over all ranks into `job.data`, or into a shared block that `*result`
  // then holds (`job.alias`'s). Every rank calls it for the same jobs in the
  // same order.
  Status AllReduce(const Job& job, std::shared_ptr<void>* result) override;

  // Bytes of shared results that some rank holds (0 without an arena).
  int64_t SharedResultBytes() const;

 private:
  struct Control;
  HostGroup(int rank, int world_size, int64_t chunk_bytes, int64_t output_bytes, int spin_us,
            double timeout_seconds);
  Control* control(int rank) const;
  char* slot(int rank, int index) const;  // staging area of slot `index`; results follow
  OutputArena::Counts* counts() const;    // rank 0's block counts
  char* outputs() const;                  // rank 0's output blocks
  // Releases `block` (at `data`, `bytes` long) when destroyed.
  std::shared_ptr<void> Hold(int block, char* data, int64_t bytes) const;
  void Publish(int counter, uint32_t value);
  Status WaitForPeers(int counter, uint32_t value, const char* step);
  Status CheckJob(uint32_t chunk, const Job& job);

  const int rank_, world_size_;
  const int64_t chunk_bytes_, output_bytes_;
  const int spin_us_;
  const double timeout_seconds_;
  const uint64_t born_ = AbortCount();  // aborts made later fail this group
  std::string identity_;
  Status broken_;
  int fd_ = -1;
  size_t area_bytes_ = 0;
  // Index = rank, this rank's own area too; unmapped when nothing holds them
  // (a shared result keeps rank 0's).
  std::vector<std::shared_ptr<char>> areas_;
  std::unique_ptr<OutputArena> arena_;           // rank 0 only
  std::vector<pid_t> pids_;
  uint32_t next_chunk_ = 0;
};

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_HOST_GROUP_H_
