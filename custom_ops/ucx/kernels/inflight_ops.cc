// In-flight collectives: TfdistUcxStart submits a schedule and returns a
// ticket at once, TfdistUcxWait (in any later step) returns its result, and
// TfdistUcxFinished asks without waiting; for a reduction started at step t
// and awaited at step t + k.
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "ucx/comm.h"
#include "ucx/kernels/schedule_kernel.h"

namespace tfdist_ucx {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernel;
using tensorflow::TensorShape;

REGISTER_OP("TfdistUcxStart")
    .Input("input: T")
    .Input("token: resource")
    .Output("ticket: int64")
    .Attr(TFDIST_UCX_TYPES)
    .Attr("handle: int")
    .Attr("plan: list(int)")
    .Attr("label: string")
    .Attr("in_process: bool = false")
    .Attr("host_sum: bool = false")
    .Attr("keep_input: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Starts TfdistUcxRun in the background; TfdistUcxWait returns its result.
With `keep_input` the ticket also keeps `input` (the wait can return it).
)doc");

REGISTER_OP("TfdistUcxWait")
    .Input("ticket: int64")
    .Input("token: resource")
    .Output("output: T")
    .Output("input: T")
    .Attr(TFDIST_UCX_TYPES)
    .Attr("num_elements: int")
    .Attr("with_input: bool = false")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int64_t n;
      bool with_input;
      TF_RETURN_IF_ERROR(c->GetAttr("num_elements", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("with_input", &with_input));
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Vector(with_input ? n : 0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Waits for a started collective and returns its result (each ticket once), and
with `with_input` the input it started from (it must have been started with
`keep_input`); otherwise `input` is empty.
)doc");

REGISTER_OP("TfdistUcxFinished")
    .Input("tickets: int64")
    .Output("finished: bool")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc("Whether each ticket's collective has finished (or was already awaited).");

// In-flight collectives started by TfdistUcxStart, by ticket.
struct Ticket {
  std::mutex mu;
  bool finished = false;
  std::string error;
  std::shared_ptr<Held> held;    // this rank's job (its kept input)
  std::shared_ptr<Held> result;  // the job whose output holds the result
  bool kept_input = false;
  std::function<void()> on_finish;  // set by a waiter that came first
};

std::mutex tickets_mu;
auto* tickets = new std::map<int64_t, std::shared_ptr<Ticket>>();
int64_t next_ticket = 1;

class StartOp : public OpKernel, ScheduleKernel {
 public:
  explicit StartOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    Init(ctx);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("keep_input", &keep_input_));
  }

  void Compute(OpKernelContext* ctx) override {
    auto comm = GetComm(ctx, handle_);
    if (comm == nullptr) return;
    auto ticket = std::make_shared<Ticket>();
    Job job;
    OP_REQUIRES_OK(ctx, MakeJob(ctx, *comm, ctx->input(0), keep_input_, &ticket->held, &job));
    ticket->kept_input = keep_input_;
    int64_t id;
    {
      std::lock_guard<std::mutex> lock(tickets_mu);
      id = next_ticket++;
      (*tickets)[id] = ticket;
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = id;
    Comm* raw = comm.get();
    std::string label = label_;
    job.done = [ticket, raw, label](const Status& status,
                                    const std::shared_ptr<void>& result) {
      std::function<void()> waiter;
      {
        std::lock_guard<std::mutex> lock(ticket->mu);
        ticket->finished = true;
        if (!status.ok()) ticket->error = Describe(*raw, label, status);
        ticket->result = std::static_pointer_cast<Held>(result);
        waiter = std::move(ticket->on_finish);
      }
      if (waiter) waiter();
    };
    if (!Runs(job.num_elements)) return job.done(Status::Ok(), job.keep_alive);
    comm->Submit(std::move(job));
  }

 private:
  bool keep_input_ = false;
};

class WaitOp : public AsyncOpKernel {
 public:
  explicit WaitOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_elements", &num_elements_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("with_input", &with_input_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int64_t id = ctx->input(0).scalar<int64_t>()();
    std::shared_ptr<Ticket> ticket;
    {
      std::lock_guard<std::mutex> lock(tickets_mu);
      auto it = tickets->find(id);
      if (it != tickets->end()) {
        ticket = it->second;
        tickets->erase(it);
      }
    }
    OP_REQUIRES_ASYNC(ctx, ticket != nullptr,
                      errors::FailedPrecondition("no collective in flight with ticket ", id,
                                                 " (each ticket can be awaited once)"),
                      done);
    OP_REQUIRES_ASYNC(
        ctx, !with_input_ || ticket->kept_input,
        errors::FailedPrecondition("ticket ", id, " did not keep its input (start it with "
                                   "keep_input=True to wait with with_input=True)"),
        done);
    int64_t n = num_elements_;
    bool with_input = with_input_;
    auto finish = [ctx, done, ticket, n, with_input]() {
      if (!ticket->error.empty()) {
        ctx->SetStatus(errors::Unavailable(ticket->error));
        return done();
      }
      const Tensor& result = *ticket->result->output;
      if (result.NumElements() != n) {
        ctx->SetStatus(errors::InvalidArgument("ticket holds ", result.NumElements(),
                                               " elements, the wait expects ", n));
      } else {
        ctx->set_output(0, result);
        if (with_input) {
          ctx->set_output(1, ticket->held->input);
        } else {
          Tensor* empty;
          OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(1, TensorShape({0}), &empty), done);
        }
      }
      done();
    };
    {
      std::lock_guard<std::mutex> lock(ticket->mu);
      if (!ticket->finished) {
        ticket->on_finish = finish;
        return;
      }
    }
    finish();
  }

 private:
  int64_t num_elements_;
  bool with_input_ = false;
};

class FinishedOp : public OpKernel {
 public:
  explicit FinishedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ids.shape(), &out));
    auto id = ids.flat<int64_t>();
    auto finished = out->flat<bool>();
    for (int64_t i = 0; i < id.size(); ++i) {
      std::shared_ptr<Ticket> ticket;
      {
        std::lock_guard<std::mutex> lock(tickets_mu);
        auto it = tickets->find(id(i));
        if (it != tickets->end()) ticket = it->second;
      }
      if (ticket == nullptr) {
        finished(i) = true;
        continue;
      }
      std::lock_guard<std::mutex> lock(ticket->mu);
      finished(i) = ticket->finished;
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdistUcxStart").Device(tensorflow::DEVICE_CPU), StartOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxWait").Device(tensorflow::DEVICE_CPU), WaitOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxFinished").Device(tensorflow::DEVICE_CPU), FinishedOp);

}  // namespace
}  // namespace tfdist_ucx
