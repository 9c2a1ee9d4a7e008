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
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Runs an encoded schedule on a copy of the 1-D `input` over the communicator
`handle`. `token` is a per-communicator resource that orders this rank's
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
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Starts TfdistUcxRun in the background; TfdistUcxWait returns its result.");

REGISTER_OP("TfdistUcxWait")
    .Input("ticket: int64")
    .Input("token: resource")
    .Output("output: T")
    .Attr(TFDIST_UCX_TYPES)
    .Attr("num_elements: int")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("num_elements", &n));
      c->set_output(0, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc("Waits for a started collective and returns its result (each ticket once).");

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

class DestroyOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Unregister(ctx->input(0).scalar<int64_t>()());
  }
};

// Shared by Run and Start: validated attributes and job creation.
class ScheduleKernel {
 protected:
  void Init(OpKernelConstruction* ctx) {
    std::vector<int64_t> flat;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("handle", &handle_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("plan", &flat));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    DataType dtype;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype));
    OP_REQUIRES_OK(ctx, ToDType(dtype, &dtype_));
    itemsize_ = tensorflow::DataTypeSize(dtype);
    auto comm = Lookup(handle_);
    OP_REQUIRES(ctx, comm != nullptr,
                errors::FailedPrecondition("tfdist_ext UCX communicator ", handle_,
                                           " does not exist."));
    auto plan = std::make_shared<Plan>();
    std::string problem = ParsePlan(flat, comm->world_size(), plan.get());
    OP_REQUIRES(ctx, problem.empty(), errors::InvalidArgument("bad UCX plan: ", problem));
    for (const auto& round : plan->rounds)
      for (const Step& step : round) max_index_ = std::max(max_index_, step.stop);
    plan_ = std::move(plan);
  }

  // The buffer the job works in: `input` itself when no one else holds it
  // (TF's buffer forwarding; a fused gradient buffer or a chained result),
  // otherwise a copy.
  absl::Status MakeJob(OpKernelContext* ctx, const Tensor& input,
                       std::shared_ptr<Tensor>* buffer, Job* job) {
    if (input.dims() != 1)
      return errors::InvalidArgument("UCX collectives take 1-D tensors; got shape ",
                                     input.shape().DebugString());
    if (max_index_ > input.NumElements())
      return errors::InvalidArgument("the plan addresses ", max_index_,
                                     " elements but the tensor has ", input.NumElements());
    std::unique_ptr<Tensor> forwarded = ctx->forward_input(
        0, OpKernelContext::Params::kNoReservation, input.dtype(), input.shape(),
        tensorflow::DEVICE_MEMORY, tensorflow::AllocatorAttributes());
    if (forwarded != nullptr) {
      *buffer = std::shared_ptr<Tensor>(std::move(forwarded));
    } else {
      *buffer = std::make_shared<Tensor>();
      TF_RETURN_IF_ERROR(ctx->allocate_temp(input.dtype(), input.shape(), buffer->get()));
      if (input.NumElements() > 0)
        std::memcpy((*buffer)->data(), input.data(), input.TotalBytes());
    }
    job->plan = plan_;
    job->dtype = dtype_;
    job->itemsize = itemsize_;
    job->data = static_cast<char*>((*buffer)->data());
    job->num_elements = input.NumElements();
    job->name = label_;
    job->keep_alive = *buffer;
    return absl::OkStatus();
  }

  int64_t handle_ = 0;
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
    std::shared_ptr<Tensor> buffer;
    Job job;
    OP_REQUIRES_OK_ASYNC(ctx, MakeJob(ctx, ctx->input(0), &buffer, &job), done);
    ctx->set_output(0, *buffer);
    if (plan_->rounds.empty() || job.num_elements == 0) return done();
    Comm* raw = comm.get();
    std::string label = label_;
    job.done = [ctx, done, raw, label](const std::string& error) {
      if (!error.empty()) ctx->SetStatus(errors::Unavailable(Describe(*raw, label, error)));
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
  std::shared_ptr<Tensor> result;
  std::function<void()> on_finish;  // set by a waiter that came first
};

std::mutex tickets_mu;
auto* tickets = new std::map<int64_t, std::shared_ptr<Ticket>>();
int64_t next_ticket = 1;

class StartOp : public OpKernel, ScheduleKernel {
 public:
  explicit StartOp(OpKernelConstruction* ctx) : OpKernel(ctx) { Init(ctx); }

  void Compute(OpKernelContext* ctx) override {
    auto comm = GetComm(ctx, handle_);
    if (comm == nullptr) return;
    auto ticket = std::make_shared<Ticket>();
    Job job;
    OP_REQUIRES_OK(ctx, MakeJob(ctx, ctx->input(0), &ticket->result, &job));
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
    job.done = [ticket, raw, label](const std::string& error) {
      std::function<void()> waiter;
      {
        std::lock_guard<std::mutex> lock(ticket->mu);
        ticket->finished = true;
        if (!error.empty()) ticket->error = Describe(*raw, label, error);
        waiter = std::move(ticket->on_finish);
      }
      if (waiter) waiter();
    };
    if (plan_->rounds.empty() || job.num_elements == 0) return job.done("");
    comm->Submit(std::move(job));
  }
};

class WaitOp : public AsyncOpKernel {
 public:
  explicit WaitOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_elements", &num_elements_));
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
    int64_t n = num_elements_;
    auto finish = [ctx, done, ticket, n]() {
      if (!ticket->error.empty()) {
        ctx->SetStatus(errors::Unavailable(ticket->error));
      } else if (ticket->result->NumElements() != n) {
        ctx->SetStatus(errors::InvalidArgument("ticket holds ", ticket->result->NumElements(),
                                               " elements, the wait expects ", n));
      } else {
        ctx->set_output(0, *ticket->result);
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
};

REGISTER_KERNEL_BUILDER(Name("TfdistUcxCreate").Device(tensorflow::DEVICE_CPU), CreateOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxConnect").Device(tensorflow::DEVICE_CPU), ConnectOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxDestroy").Device(tensorflow::DEVICE_CPU), DestroyOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxRun").Device(tensorflow::DEVICE_CPU), RunOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxStart").Device(tensorflow::DEVICE_CPU), StartOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxWait").Device(tensorflow::DEVICE_CPU), WaitOp);

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
