// Shared-memory all-reduce among the ranks of one machine (see host_group.h).
#include "ucx/host_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ucx/abort.h"
#include "ucx/reduce.h"

namespace tfdist_ucx {
namespace {

using Clock = std::chrono::steady_clock;

enum Counter { kStaged = 0, kSummed = 1, kDone = 2, kNumCounters = 3 };
const char* const kStepNames[] = {"staging", "summing", "copying results"};
constexpr size_t kControlBytes = 4096;
constexpr size_t kCountsBytes = (sizeof(OutputArena::Counts) + 4095) / 4096 * 4096;
constexpr int64_t kBlockBytes = 64 << 10;  // summed, then copied to the result slot, in cache

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string Namespace(const char* name) {
  char target[128] = {};
  ssize_t n = readlink((std::string("/proc/self/ns/") + name).c_str(), target, sizeof(target) - 1);
  return n > 0 ? std::string(target, n) : std::string("?");
}

// Boot, PID and network namespace: ranks that share all three can map each
// other's memfd by pid, and (for the network) are not emulated hosts.
std::string MachineIdentity() {
  return ReadFirstLine("/proc/sys/kernel/random/boot_id") + "/" + Namespace("pid") + "/" +
         Namespace("net");
}

// A shared mapping of `bytes`, unmapped when the last holder lets go.
std::shared_ptr<char> Mapped(void* area, size_t bytes) {
  return std::shared_ptr<char>(static_cast<char*>(area),
                               [bytes](char* at) { munmap(at, bytes); });
}

bool Exited(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::string stat = ReadFirstLine("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() &&
         (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X');
}

const char* DTypeName(int32_t dtype) {
  static const char* const kNames[] = {"float16", "bfloat16", "float32", "float64", "int32",
                                       "int64"};
  return dtype >= 0 && dtype < 6 ? kNames[dtype] : "unknown";
}

// Sums with a negative difference: counters wrap after 2^32 chunks.
bool Before(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) < 0;
}

}  // namespace

struct HostGroup::Control {
  struct alignas(64) Word {
    std::atomic<uint32_t> value;     // chunks through this step, all jobs together
    std::atomic<uint32_t> sleepers;  // peers in a futex wait on `value`
  };
  struct Meta {  // the job whose chunk a staging slot holds
    int64_t elements;
    int32_t dtype;
    uint32_t chunk;
    int64_t output;  // rank 0: the job's shared block's offset, or -1
    int32_t block;   // rank 0: its index in the arena
  };
  Word counters[kNumCounters];
  Meta slots[2];
};

HostGroup::HostGroup(int rank, int world_size, int64_t chunk_bytes, int64_t output_bytes,
                     int spin_us, double timeout_seconds)
    : rank_(rank),
      world_size_(world_size),
      chunk_bytes_((std::max<int64_t>(chunk_bytes, 4096) + 4095) / 4096 * 4096),
      output_bytes_(std::max<int64_t>(output_bytes, 0) / 4096 * 4096),
      spin_us_(spin_us),
      timeout_seconds_(timeout_seconds),
      areas_(world_size, nullptr),
      pids_(world_size, 0) {}

std::unique_ptr<HostGroup> HostGroup::Create(int rank, int world_size, int64_t chunk_bytes,
                                             int64_t output_bytes, int spin_us,
                                             double timeout_seconds, std::string* error) {
  static_assert(sizeof(Control) <= kControlBytes, "control block too large");
  static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");
  std::unique_ptr<HostGroup> group(
      new HostGroup(rank, world_size, chunk_bytes, output_bytes, spin_us, timeout_seconds));
  // Two slots, each a staging and a result area of one chunk; then the output
  // arena (untouched pages of a memfd cost no memory).
  group->area_bytes_ = kControlBytes + 4 * static_cast<size_t>(group->chunk_bytes_);
  if (group->output_bytes_ > 0)
    group->area_bytes_ += kCountsBytes + static_cast<size_t>(group->output_bytes_);
  group->fd_ = static_cast<int>(syscall(SYS_memfd_create, "tfdist-ucx-host", MFD_CLOEXEC));
  if (group->fd_ < 0) {
    *error = std::string("memfd_create: ") + std::strerror(errno);
    return nullptr;
  }
  if (ftruncate(group->fd_, static_cast<off_t>(group->area_bytes_)) != 0) {
    *error = std::string("ftruncate of the shared area: ") + std::strerror(errno);
    return nullptr;
  }
  void* area = mmap(nullptr, group->area_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED,
                    group->fd_, 0);
  if (area == MAP_FAILED) {
    *error = std::string("mmap of the shared area: ") + std::strerror(errno);
    return nullptr;
  }
  group->areas_[rank] = Mapped(area, group->area_bytes_);
  new (area) Control();  // zero counters
  if (rank == 0 && group->output_bytes_ > 0)
    group->arena_.reset(new OutputArena(group->counts(), group->output_bytes_));
  group->pids_[rank] = getpid();
  std::ostringstream out;
  out << MachineIdentity() << " " << getpid() << " " << group->fd_ << " " << group->area_bytes_;
  group->identity_ = out.str();
  return group;
}

HostGroup::~HostGroup() {
  if (fd_ >= 0) close(fd_);
}

Status HostGroup::Join(const std::vector<std::string>& identities) {
  if (static_cast<int>(identities.size()) != world_size_)
    return Status::Error("expected " + std::to_string(world_size_) + " identities, got " +
                         std::to_string(identities.size()));
  const std::string machine = MachineIdentity();
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    std::istringstream in(identities[peer]);
    std::string peer_machine;
    long pid = 0, fd = -1;
    size_t bytes = 0;
    if (!(in >> peer_machine >> pid >> fd >> bytes))
      return Status::Error("rank " + std::to_string(peer) + " sent no shared-memory identity");
    if (peer_machine != machine)
      return Status::Error("rank " + std::to_string(peer) +
                           " is on another machine or network namespace");
    if (bytes != area_bytes_)
      return Status::Error("rank " + std::to_string(peer) + " has a " + std::to_string(bytes) +
                           "-byte shared area, this rank " + std::to_string(area_bytes_) +
                           " (the ranks disagree on segment_bytes or shared_output_bytes)");
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    int peer_fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (peer_fd < 0)
      return Status::Error("opening rank " + std::to_string(peer) + "'s shared memory (" +
                           path + "): " + std::strerror(errno));
    void* area = mmap(nullptr, area_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, peer_fd, 0);
    close(peer_fd);
    if (area == MAP_FAILED)
      return Status::Error("mapping rank " + std::to_string(peer) + "'s shared memory: " +
                           std::strerror(errno));
    areas_[peer] = Mapped(area, area_bytes_);
    pids_[peer] = static_cast<pid_t>(pid);
  }
  return Status::Ok();
}

HostGroup::Control* HostGroup::control(int rank) const {
  return reinterpret_cast<Control*>(areas_[rank].get());
}

char* HostGroup::slot(int rank, int index) const {
  return areas_[rank].get() + kControlBytes + static_cast<size_t>(index) * 2 * chunk_bytes_;
}

OutputArena::Counts* HostGroup::counts() const {
  return reinterpret_cast<OutputArena::Counts*>(slot(0, 2));
}

char* HostGroup::outputs() const { return slot(0, 2) + kCountsBytes; }

int64_t HostGroup::SharedResultBytes() const {
  return output_bytes_ > 0 && areas_[0] != nullptr ? OutputArena::Held(counts()) : 0;
}

std::shared_ptr<void> HostGroup::Hold(int block, char* data, int64_t bytes) const {
  struct Held {
    Held(std::shared_ptr<char> mapping, OutputArena::Counts* counts, int block, char* data,
         int64_t bytes)
        : mapping(std::move(mapping)), counts(counts), block(block), data(data), bytes(bytes) {}
    ~Held() { OutputArena::Release(counts, block, data, bytes); }
    std::shared_ptr<char> mapping;  // rank 0's area stays mapped while a result lives
    OutputArena::Counts* counts;
    int block;
    char* data;
    int64_t bytes;
  };
  return std::make_shared<Held>(areas_[0], counts(), block, data, bytes);
}

void HostGroup::Publish(int counter, uint32_t value) {
  Control::Word& word = control(rank_)->counters[counter];
  word.value.store(value, std::memory_order_seq_cst);
  if (word.sleepers.load(std::memory_order_seq_cst) > 0)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word.value), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

Status HostGroup::WaitForPeers(int counter, uint32_t value, const char* step) {
  const auto timeout = std::chrono::duration<double>(timeout_seconds_);
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    Control::Word& word = control(peer)->counters[counter];
    uint32_t seen = word.value.load(std::memory_order_acquire);
    if (!Before(seen, value)) continue;
    const auto start = Clock::now();
    auto last_change = start;
    while (Before(seen, value)) {
      auto now = Clock::now();
      if (now - start < std::chrono::microseconds(spin_us_)) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      } else {
        word.sleepers.fetch_add(1, std::memory_order_seq_cst);
        if (Before(word.value.load(std::memory_order_seq_cst), value)) {
          timespec slice = {0, 20 * 1000 * 1000};
          syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word.value), FUTEX_WAIT, seen, &slice,
                  nullptr, 0);
        }
        word.sleepers.fetch_sub(1, std::memory_order_seq_cst);
        now = Clock::now();
        std::string reason;
        if (Aborted(born_, &reason)) return Status::Error(reason);
        if (Exited(pids_[peer])) {
          std::ostringstream out;
          out << "in a shared-memory all-reduce (" << step << "), waiting for rank(s) " << peer
              << ": its process (pid " << pids_[peer] << ") exited";
          return Status::Error(out.str());
        }
        if (timeout_seconds_ > 0 && now - last_change > timeout) {
          std::ostringstream out;
          out << "no progress for " << timeout_seconds_ << " s in a shared-memory all-reduce ("
              << step << "), waiting for rank(s) " << peer << " (stopped, crashed or stuck)";
          return Status::Error(out.str());
        }
      }
      uint32_t current = word.value.load(std::memory_order_acquire);
      if (current != seen) {
        seen = current;
        last_change = now;
      }
    }
  }
  return Status::Ok();
}

Status HostGroup::CheckJob(uint32_t chunk, const Job& job) {
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    const Control::Meta& meta = control(peer)->slots[chunk & 1];
    if (meta.chunk != chunk || meta.elements != job.num_elements ||
        meta.dtype != static_cast<int32_t>(job.dtype)) {
      std::ostringstream out;
      out << "the ranks disagree on the all-reduce: rank " << peer << " sums "
          << meta.elements << " " << DTypeName(meta.dtype) << " elements, this rank "
          << job.num_elements << " " << DTypeName(static_cast<int32_t>(job.dtype))
          << ": a different tensor, or collectives in a different order";
      return Status::Error(out.str());
    }
  }
  return Status::Ok();
}

Status HostGroup::AllReduce(const Job& job, std::shared_ptr<void>* result) {
  if (!broken_.ok()) return broken_;
  const int64_t size = static_cast<int64_t>(job.itemsize);
  const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes_ / size);
  const int64_t block = std::max<int64_t>(1, kBlockBytes / size);
  const char* input = job.input != nullptr ? job.input : job.data;
  char* output = job.data;  // or, once rank 0 has placed one, the shared block
  auto fail = [&](Status error) {
    broken_ = std::move(error);
    if (output_bytes_ > 0 && areas_[0] != nullptr)
      OutputArena::Retire(counts(), outputs(), output_bytes_);
    return broken_;
  };
  int64_t offset = -1;
  int shared = -1;  // the shared block's index
  if (arena_ != nullptr && job.alias && job.num_elements > 0)
    shared = arena_->Allocate(job.num_elements * size, world_size_, &offset);
  for (int64_t first = 0; first < job.num_elements; first += per_chunk) {
    const int64_t count = std::min(per_chunk, job.num_elements - first);
    auto part = [&](int rank) { return first + count * rank / world_size_; };
    const uint32_t chunk = next_chunk_;
    const int index = chunk & 1;
    const int64_t lo = part(rank_), hi = part(rank_ + 1);
    Status error;
    if (chunk >= 2 && !(error = WaitForPeers(kDone, chunk - 1, kStepNames[kDone])).ok())
      return fail(error);

    Control::Meta& meta = control(rank_)->slots[index];
    meta.elements = job.num_elements;
    meta.dtype = static_cast<int32_t>(job.dtype);
    meta.chunk = chunk;
    meta.output = offset;
    meta.block = shared;
    char* staging = slot(rank_, index);
    std::memcpy(staging, input + first * size, (lo - first) * size);
    std::memcpy(staging + (hi - first) * size, input + hi * size, (first + count - hi) * size);
    Publish(kStaged, chunk + 1);
    if (!(error = WaitForPeers(kStaged, chunk + 1, kStepNames[kStaged])).ok() ||
        !(error = CheckJob(chunk, job)).ok())
      return fail(error);
    if (first == 0 && rank_ != 0 && control(0)->slots[index].output >= 0) {
      if (!job.alias)
        return fail(Status::Error("a shared-memory all-reduce without a shared result"));
      shared = control(0)->slots[index].block;
      offset = control(0)->slots[index].output;
    }
    if (shared >= 0) output = outputs() + offset;

    char* summed = slot(rank_, index) + chunk_bytes_;
    for (int64_t start = lo; start < hi; start += block) {
      const int64_t n = std::min(block, hi - start);
      const int64_t at = (start - first) * size;
      const char* addend = input + start * size;
      for (int peer = 0; peer < world_size_; ++peer) {
        if (peer == rank_) continue;
        Reduce(job.dtype, output + start * size, addend, slot(peer, index) + at, n);
        addend = output + start * size;
      }
      if (shared < 0) std::memcpy(summed + at, output + start * size, n * size);
    }
    Publish(kSummed, chunk + 1);
    if (shared < 0) {
      if (!(error = WaitForPeers(kSummed, chunk + 1, kStepNames[kSummed])).ok())
        return fail(error);
      for (int peer = 0; peer < world_size_; ++peer) {
        if (peer == rank_) continue;
        const int64_t from = part(peer), to = part(peer + 1);
        std::memcpy(output + from * size,
                    slot(peer, index) + chunk_bytes_ + (from - first) * size,
                    (to - from) * size);
      }
    }
    Publish(kDone, chunk + 1);
    next_chunk_ = chunk + 1;
  }
  if (shared >= 0) {  // every part is in the block once every rank has summed its own
    Status error = WaitForPeers(kSummed, next_chunk_, kStepNames[kSummed]);
    if (!error.ok()) return fail(error);
    *result = job.alias(output, Hold(shared, output, job.num_elements * size));
  }
  return Status::Ok();
}

}  // namespace tfdist_ucx
