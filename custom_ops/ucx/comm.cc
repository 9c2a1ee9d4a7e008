// The communicator: its executor thread and its transports (see comm.h).
#include "ucx/comm.h"

#include <cstring>
#include <utility>

#include "tsl/profiler/lib/traceme.h"
#include "ucx/handles.h"
#include "ucx/host_group.h"
#include "ucx/local_group.h"
#include "ucx/ucx_transport.h"

namespace tfdist_ucx {
namespace {

auto* communicators = new HandleTable<Comm>();  // never destroyed (handles.h)

// A rehearsal communicator's transport: the result is the input.
class Rehearsal : public Transport {
 public:
  Status AllReduce(const Job& job, std::shared_ptr<void>*) override {
    if (job.input != nullptr && job.data != nullptr && job.num_elements > 0)
      std::memcpy(job.data, job.input, job.num_elements * job.itemsize);
    return Status::Ok();
  }
};

}  // namespace

Comm::Comm(int rank, int world_size, CommOptions options)
    : rank_(rank),
      world_size_(world_size),
      options_(options),
      wire_(std::make_unique<UcxTransport>(rank, world_size, options.timeout_seconds,
                                           options.segment_bytes, options.spin_us)),
      rehearsal_(options.rehearsal ? std::make_unique<Rehearsal>() : nullptr) {
  if (wire_->init_status().ok()) thread_ = std::thread([this] { Loop(); });
}

Comm::~Comm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // After a failure UCX may still reference retired buffers: leak the transport.
  if (!failed_.ok()) (void)wire_.release();
}

const Status& Comm::init_status() const { return wire_->init_status(); }

const std::string& Comm::address() const { return wire_->address(); }

Status Comm::Connect(const std::vector<std::string>& addresses) {
  std::lock_guard<std::mutex> lock(mu_);
  return wire_->Connect(addresses);
}

void Comm::Submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

Transport* Comm::TransportFor(Path path) {
  if (rehearsal_ != nullptr) return rehearsal_.get();
  switch (path) {
    case Path::kLocal:
      return local_.get();
    case Path::kHost:
      // A host sum runs its plan where this generation's ranks share no memory
      // (every rank of a generation decides alike): functions traced for
      // another one still run.
      if (host_enabled_) return host_group_.get();
      return wire_.get();
    case Path::kWire:
      break;
  }
  return wire_.get();
}

void Comm::Loop() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Status status = failed_;
    std::shared_ptr<void> result = job.keep_alive;
    std::string reason;
    // A job not started yet: nothing to retain.
    if (status.ok() && Aborted(born_, &reason)) status = Status::Error(reason);
    if (status.ok()) {
      tsl::profiler::TraceMe trace([&] { return job.name; });
      Transport* transport = TransportFor(job.path);
      status = transport != nullptr
                   ? transport->AllReduce(job, &result)
                   : Status::Error("an in-process all-reduce on a communicator outside a "
                                   "local group");
      if (!status.ok()) {
        failed_ = status;
        retired_on_error_.push_back(job);
      }
    }
    job.done(status, result);
  }
}

Status Comm::CreateHostGroup(std::string* identity) {
  std::lock_guard<std::mutex> lock(mu_);
  if (host_group_ == nullptr) {
    std::string problem;
    host_group_ = HostGroup::Create(rank_, world_size_, options_.segment_bytes,
                                    options_.shared_output_bytes, options_.spin_us,
                                    options_.timeout_seconds, &problem);
    if (host_group_ == nullptr) return Status::Error(problem);
  }
  *identity = host_group_->identity();
  return Status::Ok();
}

Status Comm::JoinHost(const std::vector<std::string>& identities) {
  std::lock_guard<std::mutex> lock(mu_);
  if (host_group_ == nullptr) return Status::Error("this rank has no shared-memory area");
  return host_group_->Join(identities);
}

void Comm::UseHost(bool enable) {
  std::lock_guard<std::mutex> lock(mu_);
  host_enabled_ = enable && host_group_ != nullptr;
}

int64_t Comm::SharedResultBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return host_enabled_ ? host_group_->SharedResultBytes() : 0;
}

void Comm::JoinLocal(std::shared_ptr<LocalGroup> group, int index) {
  std::lock_guard<std::mutex> lock(mu_);
  local_ = std::make_unique<LocalMember>(std::move(group), index);
  local_index_ = index;
}

int64_t Register(std::shared_ptr<Comm> comm) { return communicators->Add(std::move(comm)); }
std::shared_ptr<Comm> Lookup(int64_t handle) { return communicators->Find(handle); }
void Unregister(int64_t handle) { communicators->Remove(handle); }

int64_t Alias(int64_t slot, int64_t handle) {
  std::shared_ptr<Comm> comm = Lookup(handle);
  if (comm == nullptr) return 0;
  if (slot == 0) return communicators->Add(std::move(comm));
  communicators->Put(slot, std::move(comm));
  return slot;
}

}  // namespace tfdist_ucx
