// The wire transport: schedules over UCX (see ucx_transport.h).
#include "ucx/ucx_transport.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>

#include "ucx/abort.h"
#include "ucx/reduce.h"
#include "ucx/worker.h"
#include "ucx/written.h"

namespace tfdist_ucx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRounds = 1 << 12;  // tag bits for the round (`Tag`)

constexpr uint32_t kMaxMessages = 1 << 16;  // tag bits for a message within (round, pair)

// sender:16 | sequence:20 | round:12 | message:16
uint64_t Tag(int sender, uint32_t seq, int round, uint32_t message) {
  return (static_cast<uint64_t>(sender & 0xFFFF) << 48) |
         (static_cast<uint64_t>(seq & 0xFFFFF) << 28) |
         (static_cast<uint64_t>(round & 0xFFF) << 16) | (message & 0xFFFF);
}

bool Overlap(const Step& a, const Step& b) { return a.start < b.stop && b.start < a.stop; }

}  // namespace

Status ParsePlan(const std::vector<int64_t>& flat, int world_size, Plan* plan) {
  size_t i = 0;
  auto next = [&](int64_t* value) {
    if (i >= flat.size()) return false;
    *value = flat[i++];
    return true;
  };
  int64_t num_rounds;
  if (!next(&num_rounds) || num_rounds < 0 || num_rounds > kMaxRounds)
    return Status::Error("bad round count (at most 4096 rounds)");
  plan->rounds.resize(num_rounds);
  for (auto& round : plan->rounds) {
    int64_t num_steps;
    if (!next(&num_steps) || num_steps < 0) return Status::Error("bad step count");
    for (int64_t s = 0; s < num_steps; ++s) {
      int64_t kind, peer, start, stop;
      if (!next(&kind) || !next(&peer) || !next(&start) || !next(&stop))
        return Status::Error("truncated");
      if (kind < kSend || kind > kRecvCopy)
        return Status::Error("bad step kind " + std::to_string(kind));
      if (peer < 0 || peer >= world_size) return Status::Error("bad peer " + std::to_string(peer));
      if (start < 0 || stop <= start) return Status::Error("bad range");
      round.push_back({static_cast<StepKind>(kind), static_cast<int>(peer), start, stop});
    }
  }
  if (i != flat.size()) return Status::Error("trailing values");
  return Status::Ok();
}

struct UcxTransport::Pending {
  UcxTransport* transport;
  const Step* step;
  bool is_recv, deferred, done;
  char* dst;          // receive: where the bytes land
  char* target;       // receive and add: the output range they are added to
  const char* addend; // receive and add: the range's current value (target or input)
  int64_t elements;
  ucs_status_t status;
  int* outstanding;
  const Job* job;
};

UcxTransport::UcxTransport(int rank, int world_size, double timeout_seconds,
                           int64_t segment_bytes, int spin_us)
    : rank_(rank),
      world_size_(world_size),
      timeout_seconds_(timeout_seconds),
      segment_bytes_(segment_bytes),
      spin_us_(spin_us) {
  init_status_ = CreateWorker(UCS_THREAD_MODE_SERIALIZED, &worker_, &event_fd_);
  if (!init_status_.ok()) return;
  ucp_address_t* address;
  size_t length;
  ucs_status_t status = ucp_worker_get_address(worker_, &address, &length);
  if (status != UCS_OK) {
    init_status_ = Status::Error(std::string("ucp_worker_get_address: ") + ucs_status_string(status));
    return;
  }
  address_.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker_, address);
  endpoints_.assign(world_size_, nullptr);
}

UcxTransport::~UcxTransport() {
  if (worker_ == nullptr || !failed_.ok()) return;
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

Status UcxTransport::Connect(const std::vector<std::string>& addresses) {
  TFDIST_UCX_RETURN_IF_ERROR(init_status_);
  if (static_cast<int>(addresses.size()) != world_size_)
    return Status::Error("expected " + std::to_string(world_size_) + " addresses, got " +
                  std::to_string(addresses.size()));
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
      return Status::Error("ucp_ep_create to rank " + std::to_string(peer) + ": " +
                    ucs_status_string(status));
    }
  }
  return Status::Ok();
}

Status UcxTransport::AllReduce(const Job& job, std::shared_ptr<void>* result) {
  TFDIST_UCX_RETURN_IF_ERROR(failed_);
  *result = job.keep_alive;
  Status status = Run(job, next_seq_++);
  if (!status.ok()) failed_ = status;
  return status;
}

Status UcxTransport::Run(const Job& job, uint32_t seq) {
  Written written(job);
  for (int r = 0; r < static_cast<int>(job.plan->rounds.size()); ++r)
    TFDIST_UCX_RETURN_IF_ERROR(RunRound(job, seq, r, &written));
  written.Fill(0, job.num_elements);
  return Status::Ok();
}

Status UcxTransport::RunRound(const Job& job, uint32_t seq, int round_index,
                              Written* written) {
  const std::vector<Step>& steps = job.plan->rounds[round_index];
  const size_t itemsize = job.itemsize;
  int64_t segment = std::max<int64_t>(1, segment_bytes_ / static_cast<int64_t>(itemsize));
  segment = std::max<int64_t>(segment, job.num_elements / (kMaxMessages - 1024) + 1);

  // A receive goes through scratch when it adds, or when a send or another
  // receive of the round touches its range (applied after the round, in order).
  std::vector<char> deferred(steps.size(), 0);
  std::vector<int64_t> scratch_offset(steps.size(), -1);
  int64_t scratch_bytes = 0;
  size_t num_messages = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    num_messages += (step.stop - step.start + segment - 1) / segment;
    if (step.kind == kSend) continue;
    for (size_t j = 0; j < steps.size(); ++j)
      if (j != i && Overlap(step, steps[j])) deferred[i] = 1;
    if (step.kind == kRecvReduce || deferred[i]) {
      scratch_offset[i] = scratch_bytes;
      scratch_bytes += (step.stop - step.start) * itemsize;
    }
  }
  // Sends and adds then find their range either written or still the input's.
  for (const Step& step : steps)
    if (step.kind != kRecvCopy) written->Settle(step.start, step.stop);
  if (static_cast<int64_t>(scratch_.size()) < scratch_bytes) scratch_.resize(scratch_bytes);

  auto* pending = new std::vector<Pending>();  // leaked on failure: UCX may still write
  pending->reserve(num_messages);
  int outstanding = 0;
  std::vector<uint32_t> sent(world_size_, 0), received(world_size_, 0);
  ucp_tag_recv_info_t recv_info;

  auto post = [&](const Step& step, int64_t start, int64_t stop, bool defer,
                  char* scratch) -> Status {
    pending->push_back({});
    Pending& p = pending->back();
    p.transport = this;
    p.step = &step;
    p.is_recv = step.kind != kSend;
    p.deferred = defer;
    p.elements = stop - start;
    p.outstanding = &outstanding;
    p.job = &job;
    p.target = job.data + start * itemsize;
    p.addend = written->Source(start, stop);
    const size_t bytes = (stop - start) * itemsize;
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_contig(1);
    param.user_data = &p;
    void* request;
    if (p.is_recv) {
      p.dst = scratch != nullptr ? scratch : p.target;
      param.cb.recv = &UcxTransport::OnRecv;
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO;
      param.recv_info.tag_info = &recv_info;
      uint32_t message = received[step.peer]++;
      request = ucp_tag_recv_nbx(worker_, p.dst, bytes,
                                 Tag(step.peer, seq, round_index, message), ~uint64_t{0},
                                 &param);
    } else {
      param.cb.send = &UcxTransport::OnSend;
      uint32_t message = sent[step.peer]++;
      if (endpoints_[step.peer] == nullptr)
        return Status::Error("no endpoint to rank " + std::to_string(step.peer) + " (not connected)");
      request = ucp_tag_send_nbx(endpoints_[step.peer], p.addend, bytes,
                                 Tag(rank_, seq, round_index, message), &param);
    }
    if (UCS_PTR_IS_ERR(request)) {
      return Status::Error(std::string("posting a message to rank ") + std::to_string(step.peer) +
                    ": " + ucs_status_string(UCS_PTR_STATUS(request)));
    }
    if (request == nullptr) {  // completed in place
      p.done = true;
      p.status = UCS_OK;
      if (p.is_recv && !p.deferred && step.kind == kRecvReduce)
        Reduce(job.dtype, p.target, p.addend, p.dst, p.elements);
    } else {
      ++outstanding;
    }
    return Status::Ok();
  };

  // Receives first, so data that arrives early lands in place.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& step = steps[i];
      if ((step.kind == kSend) != (pass == 1)) continue;
      for (int64_t s = step.start; s < step.stop; s += segment) {
        int64_t e = std::min(step.stop, s + segment);
        char* scratch = scratch_offset[i] < 0
                            ? nullptr
                            : scratch_.data() + scratch_offset[i] + (s - step.start) * itemsize;
        TFDIST_UCX_RETURN_IF_ERROR(post(step, s, e, deferred[i], scratch));
      }
    }
  }

  TFDIST_UCX_RETURN_IF_ERROR(Wait(*pending, outstanding, job, round_index));  // `pending` leaks
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    if (step.kind == kSend) continue;
    if (deferred[i]) {
      char* target = job.data + step.start * itemsize;
      const char* source = scratch_.data() + scratch_offset[i];
      if (step.kind == kRecvReduce) {
        written->Settle(step.start, step.stop);
        Reduce(job.dtype, target, written->Source(step.start, step.stop), source,
               step.stop - step.start);
      } else {
        std::memcpy(target, source, (step.stop - step.start) * itemsize);
      }
    }
    written->Add(step.start, step.stop);
  }
  delete pending;
  return Status::Ok();
}

Status UcxTransport::Wait(std::vector<Pending>& pending, const int& outstanding, const Job& job,
                          int round_index) {
  const auto spin = std::chrono::microseconds(spin_us_);
  const auto timeout = std::chrono::duration<double>(timeout_seconds_);
  auto last_event = Clock::now(), last_completion = last_event;
  int last_outstanding = outstanding;
  while (outstanding > 0) {
    unsigned events = ucp_worker_progress(worker_);
    if (bad_ != nullptr) {
      std::ostringstream out;
      out << (bad_->is_recv ? "receiving from" : "sending to") << " rank " << bad_->step->peer
          << " failed: " << ucs_status_string(bad_->status);
      if (bad_->status == UCS_ERR_MESSAGE_TRUNCATED)
        out << " (the ranks disagree on the tensor size)";
      return Status::Error(out.str());
    }
    std::string reason;
    if (Aborted(born_, &reason)) return Status::Error(reason);
    auto now = Clock::now();
    if (outstanding != last_outstanding) {
      last_outstanding = outstanding;
      last_completion = now;
    }
    if (events != 0) {
      last_event = now;
      continue;
    }
    if (now - last_event < spin) continue;
    if (timeout_seconds_ > 0 && now - last_completion > timeout) {
      std::vector<int> waiting;
      for (const Pending& p : pending)
        if (!p.done && std::find(waiting.begin(), waiting.end(), p.step->peer) == waiting.end())
          waiting.push_back(p.step->peer);
      std::ostringstream out;
      out << "no progress for " << timeout_seconds_ << " s in round "
          << round_index + 1 << " of " << job.plan->rounds.size() << ", waiting for rank(s)";
      for (int peer : waiting) out << " " << peer;
      out << " (stopped, crashed or stuck)";
      return Status::Error(out.str());
    }
    WaitForEvent(worker_, event_fd_, 1);
  }
  return Status::Ok();
}

void UcxTransport::OnSend(void* request, ucs_status_t status, void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  p->done = true;
  p->status = status;
  if (status != UCS_OK) p->transport->bad_ = p;
  --*p->outstanding;
  ucp_request_free(request);
}

void UcxTransport::OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                  void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  p->status = status;
  const size_t expected = p->elements * p->job->itemsize;
  if (status == UCS_OK && info != nullptr && info->length != expected)
    p->status = UCS_ERR_MESSAGE_TRUNCATED;
  if (p->status == UCS_OK && !p->deferred && p->step->kind == kRecvReduce)
    Reduce(p->job->dtype, p->target, p->addend, p->dst, p->elements);
  if (p->status != UCS_OK) p->transport->bad_ = p;
  p->done = true;
  --*p->outstanding;
  ucp_request_free(request);
}

}  // namespace tfdist_ucx
