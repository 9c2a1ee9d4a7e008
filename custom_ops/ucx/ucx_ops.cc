// TF ops over the UCX communicator (comm.h): create / connect / destroy a
// communicator, run one encoded schedule on a tensor, or start it and wait for
// it later (an in-flight ticket), for a reduction started at step t and
// awaited at step t + k.
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "ucx/comm.h"
#include "ucx/local_group.h"

namespace tfdist_ucx {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

#define TFDIST_UCX_TYPES "T: {half, bfloat16, float, double, int32, int64}"

REGISTER_OP("TfdistUcxCreate")
    .Attr("rank: int")
    .Attr("world_size: int")
    .Attr("timeout_seconds: float")
    .Attr("segment_bytes: int")
    .Attr("spin_us: int")
    .Output("handle: int64")
    .Output("address: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Creates a UCX communicator for `rank`; returns its handle and worker address.");

REGISTER_OP("TfdistUcxConnect")
    .Input("handle: int64")
    .Input("addresses: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Creates endpoints to every rank's address (index = rank).");

REGISTER_OP("TfdistUcxJoinLocal")
    .Input("handles: int64")
    .Attr("timeout_seconds: float")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Forms a local group of the communicators `handles` (all of this process's
ranks, in rank order), for all-reduces started with `in_process`.
)doc");

REGISTER_OP("TfdistUcxDestroy")
    .Input("handle: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Stops and frees a communicator.");

REGISTER_OP("TfdistUcxRun")
    .Input("input: T")
    .Input("token: resource")
    .Output("output: T")
    .Attr(TFDIST_UCX_TYPES)
    .Attr("handle: int")
    .Attr("plan: list(int)")
    .Attr("label: string")
    .Attr("in_process: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Runs an encoded schedule on the 1-D `input` over the communicator `handle`
(in place when TF can forward `input`'s buffer, else out of place). `token` is a per-communicator resource that orders this rank's
collectives (and only them) by automatic control dependencies.
)doc");

REGISTER_OP("TfdistUcxStart")
    .Input("input: T")
    .Input("token: resource")
    .Output("ticket: int64")
    .Attr(TFDIST_UCX_TYPES)
    .Attr("handle: int")
    .Attr("plan: list(int)")
    .Attr("label: string")
    .Attr("in_process: bool = false")
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

absl::Status ToDType(DataType dtype, DType* out) {
  switch (dtype) {
    case tensorflow::DT_HALF: *out = DType::kF16; break;
    case tensorflow::DT_BFLOAT16: *out = DType::kBF16; break;
    case tensorflow::DT_FLOAT: *out = DType::kF32; break;
    case tensorflow::DT_DOUBLE: *out = DType::kF64; break;
    case tensorflow::DT_INT32: *out = DType::kI32; break;
    case tensorflow::DT_INT64: *out = DType::kI64; break;
    default: return errors::InvalidArgument("unsupported dtype");
  }
  return absl::OkStatus();
}

std::shared_ptr<Comm> GetComm(OpKernelContext* ctx, int64_t handle) {
  std::shared_ptr<Comm> comm = Lookup(handle);
  if (comm == nullptr)
    ctx->SetStatus(errors::FailedPrecondition(
        "tfdist_ext UCX communicator ", handle,
        " does not exist (destroyed, or created in another process)."));
  return comm;
}

class CreateOp : public OpKernel {
 public:
  explicit CreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t segment_bytes, spin_us;
    float timeout_seconds;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_seconds));
    options_.timeout_seconds = timeout_seconds;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("segment_bytes", &segment_bytes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("spin_us", &spin_us));
    options_.segment_bytes = segment_bytes;
    options_.spin_us = static_cast<int>(spin_us);
  }

  void Compute(OpKernelContext* ctx) override {
    auto comm = std::make_shared<Comm>(rank_, world_size_, options_);
    OP_REQUIRES(ctx, comm->init_error().empty(),
                errors::Unavailable("UCX initialisation failed: ", comm->init_error()));
    Tensor* handle;
    Tensor* address;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &address));
    address->scalar<tensorflow::tstring>()() = comm->address();
    handle->scalar<int64_t>()() = Register(std::move(comm));
  }

 private:
  int rank_, world_size_;
  CommOptions options_;
};

class ConnectOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    auto comm = GetComm(ctx, ctx->input(0).scalar<int64_t>()());
    if (comm == nullptr) return;
    auto flat = ctx->input(1).flat<tensorflow::tstring>();
    std::vector<std::string> addresses;
    for (int64_t i = 0; i < flat.size(); ++i) addresses.emplace_back(flat(i));
    std::string error = comm->Connect(addresses);
    OP_REQUIRES(ctx, error.empty(), errors::Unavailable("UCX wire-up failed: ", error));
  }
};

class JoinLocalOp : public OpKernel {
 public:
  explicit JoinLocalOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_seconds_));
  }
  void Compute(OpKernelContext* ctx) override {
    auto handles = ctx->input(0).flat<int64_t>();
    auto group = std::make_shared<LocalGroup>(static_cast<int>(handles.size()),
                                              timeout_seconds_);
    for (int64_t i = 0; i < handles.size(); ++i) {
      auto comm = GetComm(ctx, handles(i));
      if (comm == nullptr) return;
      comm->JoinLocal(group, static_cast<int>(i));
    }
  }

 private:
  float timeout_seconds_;
};

class DestroyOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Unregister(ctx->input(0).scalar<int64_t>()());
  }
};

// What a job reads and writes, kept alive until it is retired (and, for a
// started job, until it is awaited).
struct Held {
  Tensor input;  // unset when the job ran in place
  std::shared_ptr<Tensor> output;  // unset for an in-process member other than rank 0
};

// Shared by Run and Start: validated attributes and job creation.
class ScheduleKernel {
 protected:
  void Init(OpKernelConstruction* ctx) {
    std::vector<int64_t> flat;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("handle", &handle_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("plan", &flat));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("in_process", &in_process_));
    DataType dtype;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype));
    OP_REQUIRES_OK(ctx, ToDType(dtype, &dtype_));
    itemsize_ = tensorflow::DataTypeSize(dtype);
    auto comm = Lookup(handle_);
    OP_REQUIRES(ctx, comm != nullptr,
                errors::FailedPrecondition("tfdist_ext UCX communicator ", handle_,
                                           " does not exist."));
    OP_REQUIRES(ctx, !in_process_ || comm->local_index() >= 0,
                errors::FailedPrecondition("an in-process collective on communicator ",
                                           handle_, ", which is in no local group"));
    auto plan = std::make_shared<Plan>();
    std::string problem = ParsePlan(flat, comm->world_size(), plan.get());
    OP_REQUIRES(ctx, problem.empty(), errors::InvalidArgument("bad UCX plan: ", problem));
    for (const auto& round : plan->rounds)
      for (const Step& step : round) max_index_ = std::max(max_index_, step.stop);
    plan_ = std::move(plan);
  }

  // The job's output: `input` itself when no one else holds it (TF's buffer
  // forwarding; a fused gradient buffer or a chained result), otherwise a new
  // tensor that the job fills out of place, reading `input` where needed.
  absl::Status MakeJob(OpKernelContext* ctx, const Comm& comm, const Tensor& input,
                       bool keep_input, std::shared_ptr<Held>* kept, Job* job) {
    if (input.dims() != 1)
      return errors::InvalidArgument("UCX collectives take 1-D tensors; got shape ",
                                     input.shape().DebugString());
    if (!in_process_ && max_index_ > input.NumElements())
      return errors::InvalidArgument("the plan addresses ", max_index_,
                                     " elements but the tensor has ", input.NumElements());
    std::unique_ptr<Tensor> forwarded;
    if (!keep_input)
      forwarded = ctx->forward_input(
          0, OpKernelContext::Params::kNoReservation, input.dtype(), input.shape(),
          tensorflow::DEVICE_MEMORY, tensorflow::AllocatorAttributes());
    auto held = std::make_shared<Held>();
    if (forwarded != nullptr) {
      held->output = std::shared_ptr<Tensor>(std::move(forwarded));
    } else {
      held->input = input;
      // In process, only local rank 0's output is written (and shared).
      if (!in_process_ || comm.local_index() == 0 || !Runs(input.NumElements())) {
        held->output = std::make_shared<Tensor>();
        TF_RETURN_IF_ERROR(
            ctx->allocate_temp(input.dtype(), input.shape(), held->output.get()));
      }
      if (Runs(input.NumElements()))
        job->input = static_cast<const char*>(input.data());
      else if (input.NumElements() > 0)
        std::memcpy(held->output->data(), input.data(), input.TotalBytes());
    }
    *kept = held;
    job->plan = plan_;
    job->in_process = in_process_;
    job->dtype = dtype_;
    job->itemsize = itemsize_;
    job->data = held->output ? static_cast<char*>(held->output->data()) : nullptr;
    job->num_elements = input.NumElements();
    job->name = label_;
    job->keep_alive = held;
    return absl::OkStatus();
  }

  // Whether a job over `n` elements communicates (else the input is the result).
  bool Runs(int64_t n) const { return n > 0 && (in_process_ || !plan_->rounds.empty()); }

  int64_t handle_ = 0;
  bool in_process_ = false;
  std::string label_;
  DType dtype_;
  size_t itemsize_ = 0;
  int64_t max_index_ = 0;
  std::shared_ptr<const Plan> plan_;
};

std::string Describe(const Comm& comm, const std::string& label, const std::string& error) {
  return "tfdist_ext UCX collective '" + label + "' on rank " + std::to_string(comm.rank()) +
         " of " + std::to_string(comm.world_size()) + ": " + error;
}

class RunOp : public AsyncOpKernel, ScheduleKernel {
 public:
  explicit RunOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) { Init(ctx); }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto comm = GetComm(ctx, handle_);
    if (comm == nullptr) return done();
    std::shared_ptr<Held> held;
    Job job;
    OP_REQUIRES_OK_ASYNC(ctx, MakeJob(ctx, *comm, ctx->input(0), false, &held, &job), done);
    if (!Runs(job.num_elements)) {
      ctx->set_output(0, *held->output);
      return done();
    }
    Comm* raw = comm.get();
    std::string label = label_;
    job.done = [ctx, done, raw, label](const std::string& error,
                                       const std::shared_ptr<void>& result) {
      if (!error.empty())
        ctx->SetStatus(errors::Unavailable(Describe(*raw, label, error)));
      else
        ctx->set_output(0, *static_cast<Held*>(result.get())->output);
      done();
    };
    comm->Submit(std::move(job));
  }
};

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
    job.done = [ticket, raw, label](const std::string& error,
                                    const std::shared_ptr<void>& result) {
      std::function<void()> waiter;
      {
        std::lock_guard<std::mutex> lock(ticket->mu);
        ticket->finished = true;
        if (!error.empty()) ticket->error = Describe(*raw, label, error);
        ticket->result = std::static_pointer_cast<Held>(result);
        waiter = std::move(ticket->on_finish);
      }
      if (waiter) waiter();
    };
    if (!Runs(job.num_elements)) return job.done("", job.keep_alive);
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

REGISTER_KERNEL_BUILDER(Name("TfdistUcxCreate").Device(tensorflow::DEVICE_CPU), CreateOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxConnect").Device(tensorflow::DEVICE_CPU), ConnectOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxJoinLocal").Device(tensorflow::DEVICE_CPU), JoinLocalOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxDestroy").Device(tensorflow::DEVICE_CPU), DestroyOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxRun").Device(tensorflow::DEVICE_CPU), RunOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxStart").Device(tensorflow::DEVICE_CPU), StartOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxWait").Device(tensorflow::DEVICE_CPU), WaitOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxFinished").Device(tensorflow::DEVICE_CPU), FinishedOp);

}  // namespace
}  // namespace tfdist_ucx

namespace tfdist_ucx {
namespace {

REGISTER_OP("TfdistUcxBuildInfo")
    .Output("tf_version: string")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("The TensorFlow version this UCX op library was built for.");

class BuildInfoOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = TFDIST_TF_VERSION;
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdistUcxBuildInfo").Device(tensorflow::DEVICE_CPU), BuildInfoOp);

}  // namespace
}  // namespace tfdist_ucx
