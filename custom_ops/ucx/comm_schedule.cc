// UCX communicator: executes encoded schedules over UCX (see comm.h).
#include "ucx/comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "ucx/abort.h"
#include "ucx/reduce.h"
#include "ucx/worker.h"
#include "ucx/written.h"

namespace tfdist_ucx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMaxMessages = 1 << 16;  // tag bits for a message within (round, pair)

// sender:16 | sequence:20 | round:12 | message:16
uint64_t Tag(int sender, uint32_t seq, int round, uint32_t message) {
  return (static_cast<uint64_t>(sender & 0xFFFF) << 48) |
         (static_cast<uint64_t>(seq & 0xFFFFF) << 28) |
         (static_cast<uint64_t>(round & 0xFFF) << 16) | (message & 0xFFFF);
}

bool Overlap(const Step& a, const Step& b) { return a.start < b.stop && b.start < a.stop; }

}  // namespace

struct Comm::Pending {
  Comm* comm;
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

std::string Comm::Run(const Job& job, uint32_t seq) {
  Written written(job);
  for (int r = 0; r < static_cast<int>(job.plan->rounds.size()); ++r) {
    std::string error = RunRound(job, seq, r, &written);
    if (!error.empty()) return error;
  }
  written.Fill(0, job.num_elements);
  return "";
}

std::string Comm::RunRound(const Job& job, uint32_t seq, int round_index, Written* written) {
  const std::vector<Step>& steps = job.plan->rounds[round_index];
  const size_t itemsize = job.itemsize;
  int64_t segment = std::max<int64_t>(1, options_.segment_bytes / static_cast<int64_t>(itemsize));
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
                  char* scratch) -> std::string {
    pending->push_back({});
    Pending& p = pending->back();
    p.comm = this;
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
      param.cb.recv = &Comm::OnRecv;
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO;
      param.recv_info.tag_info = &recv_info;
      uint32_t message = received[step.peer]++;
      request = ucp_tag_recv_nbx(worker_, p.dst, bytes,
                                 Tag(step.peer, seq, round_index, message), ~uint64_t{0},
                                 &param);
    } else {
      param.cb.send = &Comm::OnSend;
      uint32_t message = sent[step.peer]++;
      if (endpoints_[step.peer] == nullptr)
        return "no endpoint to rank " + std::to_string(step.peer) + " (not connected)";
      request = ucp_tag_send_nbx(endpoints_[step.peer], p.addend, bytes,
                                 Tag(rank_, seq, round_index, message), &param);
    }
    if (UCS_PTR_IS_ERR(request)) {
      return std::string("posting a message to rank ") + std::to_string(step.peer) + ": " +
             ucs_status_string(UCS_PTR_STATUS(request));
    }
    if (request == nullptr) {  // completed in place
      p.done = true;
      p.status = UCS_OK;
      if (p.is_recv && !p.deferred && step.kind == kRecvReduce)
        Reduce(job.dtype, p.target, p.addend, p.dst, p.elements);
    } else {
      ++outstanding;
    }
    return "";
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
        std::string error = post(step, s, e, deferred[i], scratch);
        if (!error.empty()) return error;
      }
    }
  }

  std::string error = Wait(*pending, outstanding, job, round_index);
  if (!error.empty()) return error;  // `pending` stays allocated
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
  return "";
}

std::string Comm::Wait(std::vector<Pending>& pending, const int& outstanding, const Job& job,
                       int round_index) {
  const auto spin = std::chrono::microseconds(options_.spin_us);
  const auto timeout = std::chrono::duration<double>(options_.timeout_seconds);
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
      return out.str();
    }
    std::string reason;
    if (Aborted(born_, &reason)) return reason;
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
    if (options_.timeout_seconds > 0 && now - last_completion > timeout) {
      std::vector<int> waiting;
      for (const Pending& p : pending)
        if (!p.done && std::find(waiting.begin(), waiting.end(), p.step->peer) == waiting.end())
          waiting.push_back(p.step->peer);
      std::ostringstream out;
      out << "no progress for " << options_.timeout_seconds << " s in round "
          << round_index + 1 << " of " << job.plan->rounds.size() << ", waiting for rank(s)";
      for (int peer : waiting) out << " " << peer;
      out << " (stopped, crashed or stuck)";
      return out.str();
    }
    WaitForEvent(worker_, event_fd_, 1);
  }
  return "";
}

void Comm::OnSend(void* request, ucs_status_t status, void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  p->done = true;
  p->status = status;
  if (status != UCS_OK) p->comm->bad_ = p;
  --*p->outstanding;
  ucp_request_free(request);
}

void Comm::OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                  void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  p->status = status;
  const size_t expected = p->elements * p->job->itemsize;
  if (status == UCS_OK && info != nullptr && info->length != expected)
    p->status = UCS_ERR_MESSAGE_TRUNCATED;
  if (p->status == UCS_OK && !p->deferred && p->step->kind == kRecvReduce)
    Reduce(p->job->dtype, p->target, p->addend, p->dst, p->elements);
  if (p->status != UCS_OK) p->comm->bad_ = p;
  p->done = true;
  --*p->outstanding;
  ucp_request_free(request);
}

}  // namespace tfdist_ucx
