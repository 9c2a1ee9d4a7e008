// UCX communicator: its thread, wire-up, and the in-process and shared-memory
// groups it hands all-reduces to (see comm.h); schedules run in comm_schedule.cc.
#include "ucx/comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "tsl/profiler/lib/traceme.h"
#include "ucx/abort.h"
#include "ucx/handles.h"
#include "ucx/host_group.h"
#include "ucx/local_group.h"
#include "ucx/worker.h"

namespace tfdist_ucx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRounds = 1 << 12;  // tag bits for the round (comm_schedule.cc)

auto* communicators = new HandleTable<Comm>();  // never destroyed (handles.h)

}  // namespace

std::string ParsePlan(const std::vector<int64_t>& flat, int world_size, Plan* plan) {
  size_t i = 0;
  auto next = [&](int64_t* value) {
    if (i >= flat.size()) return false;
    *value = flat[i++];
    return true;
  };
  int64_t num_rounds;
  if (!next(&num_rounds) || num_rounds < 0 || num_rounds > kMaxRounds)
    return "bad round count (at most 4096 rounds)";
  plan->rounds.resize(num_rounds);
  for (auto& round : plan->rounds) {
    int64_t num_steps;
    if (!next(&num_steps) || num_steps < 0) return "bad step count";
    for (int64_t s = 0; s < num_steps; ++s) {
      int64_t kind, peer, start, stop;
      if (!next(&kind) || !next(&peer) || !next(&start) || !next(&stop)) return "truncated";
      if (kind < kSend || kind > kRecvCopy) return "bad step kind " + std::to_string(kind);
      if (peer < 0 || peer >= world_size) return "bad peer " + std::to_string(peer);
      if (start < 0 || stop <= start) return "bad range";
      round.push_back({static_cast<StepKind>(kind), static_cast<int>(peer), start, stop});
    }
  }
  if (i != flat.size()) return "trailing values";
  return "";
}


Comm::Comm(int rank, int world_size, CommOptions options)
    : rank_(rank), world_size_(world_size), options_(options) {
  init_error_ = CreateWorker(UCS_THREAD_MODE_SERIALIZED, &worker_, &event_fd_);
  if (!init_error_.empty()) return;
  ucp_address_t* address;
  size_t length;
  ucs_status_t status = ucp_worker_get_address(worker_, &address, &length);
  if (status != UCS_OK) {
    init_error_ = std::string("ucp_worker_get_address: ") + ucs_status_string(status);
    return;
  }
  address_.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker_, address);
  endpoints_.assign(world_size_, nullptr);
  thread_ = std::thread([this] { Loop(); });
}

Comm::~Comm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (worker_ == nullptr) return;
  if (error_.empty()) {
    std::vector<void*> closing;
    for (ucp_ep_h ep : endpoints_) {
      if (ep == nullptr) continue;
      ucp_request_param_t param = {};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* request = ucp_ep_close_nbx(ep, &param);
      if (UCS_PTR_IS_PTR(request)) closing.push_back(request);
    }
    auto deadline = Clock::now() + std::chrono::seconds(2);
    for (void* request : closing) {
      while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(worker_);
      ucp_request_free(request);
    }
    ucp_worker_destroy(worker_);
  }
  // After a failure UCX may still reference retired buffers: leak the worker.
}

std::string Comm::Connect(const std::vector<std::string>& addresses) {
  if (!init_error_.empty()) return init_error_;
  if (static_cast<int>(addresses.size()) != world_size_)
    return "expected " + std::to_string(world_size_) + " addresses, got " +
           std::to_string(addresses.size());
  std::lock_guard<std::mutex> lock(mu_);
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_ || endpoints_[peer] != nullptr) continue;
    // Peer error handling (UCP_ERR_HANDLING_MODE_PEER) would rule out the
    // shared-memory transports; a dead peer is caught by the progress timeout.
    ucp_ep_params_t params = {};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(addresses[peer].data());
    ucs_status_t status = ucp_ep_create(worker_, &params, &endpoints_[peer]);
    if (status != UCS_OK) {
      endpoints_[peer] = nullptr;
      return "ucp_ep_create to rank " + std::to_string(peer) + ": " + ucs_status_string(status);
    }
  }
  return "";
}

void Comm::Submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
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
    std::string error = error_;
    std::shared_ptr<void> result = job.keep_alive;
    if (error.empty()) Aborted(born_, &error);  // a job not started yet: nothing to retain
    if (error.empty()) {
      tsl::profiler::TraceMe trace([&] { return job.name; });
      // A host sum runs its plan where this generation's ranks share no memory (every
      // rank of a generation decides alike): functions traced for another one still run.
      if (job.host_sum && host_enabled_)
        error = host_group_->AllReduce(job, &result);
      else if (!job.in_process)
        error = Run(job, next_seq_++);
      else if (local_group_ == nullptr)
        error = "an in-process all-reduce on a communicator outside a local group";
      else
        error = local_group_->AllReduce(local_index_, job, &result);
      if (!error.empty()) {
        error_ = error;
        retired_on_error_.push_back(job);
      }
    }
    job.done(error, result);
  }
}

std::string Comm::CreateHostGroup(std::string* problem) {
  std::lock_guard<std::mutex> lock(mu_);
  if (host_group_ == nullptr)
    host_group_ = HostGroup::Create(rank_, world_size_, options_.segment_bytes,
                                    options_.shared_output_bytes, options_.spin_us,
                                    options_.timeout_seconds, problem);
  return host_group_ == nullptr ? "" : host_group_->identity();
}

std::string Comm::JoinHost(const std::vector<std::string>& identities) {
  std::lock_guard<std::mutex> lock(mu_);
  if (host_group_ == nullptr) return "this rank has no shared-memory area";
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
  local_group_ = std::move(group);
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
