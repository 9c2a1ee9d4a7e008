// TF ops over the UCX communicator (comm.h): create / connect / destroy a
// communicator and run one encoded schedule on a tensor. Starting one and
// awaiting it in a later step: inflight_ops.cc.
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "ucx/abort.h"
#include "ucx/comm.h"
#include "ucx/local_group.h"
#include "ucx/kernels/schedule_kernel.h"

namespace tfdist_ucx {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernel;
using tensorflow::TensorShape;

REGISTER_OP("TfdistUcxCreate")
    .Attr("rank: int")
    .Attr("world_size: int")
    .Attr("timeout_seconds: float")
    .Attr("segment_bytes: int")
    .Attr("spin_us: int")
    .Attr("shared_output_bytes: int = 268435456")
    .Attr("rehearsal: bool = false")
    .Output("handle: int64")
    .Output("address: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates a UCX communicator for `rank`; returns its handle and worker address.
With `rehearsal`, it is never connected and every collective on it completes
at once with its input as the result: a function traced on it can run once, so
that TF instantiates it, before the peers are met.
)doc");

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

REGISTER_OP("TfdistUcxAlias")
    .Input("slot: int64")
    .Input("handle: int64")
    .Output("alias: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Makes the handle `slot` (0: a new one, returned) address the communicator
`handle` too. Ops built with the slot as their `handle` attribute run on the
communicator the slot was last given: functions traced for one membership of
an elastic job run again, without tracing, on a later membership's
communicators of the same size and rank.
)doc");

REGISTER_OP("TfdistUcxRun")
    .Input("input: T")
    .Input("token: resource")
    .Output("output: T")
    .Attr(TFDIST_UCX_TYPES)
    .Attr("handle: int")
    .Attr("plan: list(int)")
    .Attr("label: string")
    .Attr("in_process: bool = false")
    .Attr("host_sum: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Runs an encoded schedule on the 1-D `input` over the communicator `handle`
(in place when TF can forward `input`'s buffer, else out of place). `token` is
a per-communicator resource that orders this rank's collectives (and only
them) by automatic control dependencies. With `in_process` the job is a sum
over the local group, with `host_sum` over the host group (`plan` unused).
)doc");

REGISTER_OP("TfdistUcxHostIdentity")
    .Input("handle: int64")
    .Output("identity: string")
    .Output("problem: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates the communicator's shared-memory area for all-reduces among the
processes of one machine; `identity` is what the peers need to map it ("" with
`problem` set when the area cannot be made).
)doc");

REGISTER_OP("TfdistUcxJoinHost")
    .Input("handle: int64")
    .Input("identities: string")
    .Output("problem: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Maps every rank's shared-memory area (`identities`, index = rank); `problem`
is "" when this rank can take part in `host_sum` all-reduces.
)doc");

REGISTER_OP("TfdistUcxUseHost")
    .Input("handle: int64")
    .Input("enable: bool")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Allows (or refuses) `host_sum` all-reduces once every rank joined.");

REGISTER_OP("TfdistUcxSharedResultBytes")
    .Input("handle: int64")
    .Output("bytes: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Bytes of shared-memory sums' results that some rank of the host group holds.");

REGISTER_OP("TfdistUcxAbort")
    .Input("reason: string")
    .Attr("later: bool = true")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Fails every wait of this process's UCX communicators with `reason`: a peer was
found dead. With `later` (the process will stop) also every communicator made
afterwards, and the first such reason stays; without it only the communicators
that exist now (an elastic job goes on with new ones).
)doc");

class CreateOp : public OpKernel {
 public:
  explicit CreateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t segment_bytes, spin_us, shared_output_bytes;
    float timeout_seconds;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world_size", &world_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_seconds));
    options_.timeout_seconds = timeout_seconds;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("segment_bytes", &segment_bytes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("spin_us", &spin_us));
    options_.segment_bytes = segment_bytes;
    options_.spin_us = static_cast<int>(spin_us);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_output_bytes", &shared_output_bytes));
    options_.shared_output_bytes = shared_output_bytes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rehearsal", &options_.rehearsal));
  }

  void Compute(OpKernelContext* ctx) override {
    auto comm = std::make_shared<Comm>(rank_, world_size_, options_);
    OP_REQUIRES(ctx, comm->init_status().ok(),
                errors::Unavailable("UCX initialisation failed: ",
                                    comm->init_status().message()));
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
    Status connected = comm->Connect(addresses);
    OP_REQUIRES(ctx, connected.ok(),
                errors::Unavailable("UCX wire-up failed: ", connected.message()));
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

class HostIdentityOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    auto comm = GetComm(ctx, ctx->input(0).scalar<int64_t>()());
    if (comm == nullptr) return;
    std::string identity;
    Status created = comm->CreateHostGroup(&identity);
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = identity;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = created.message();
  }
};

class JoinHostOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    auto comm = GetComm(ctx, ctx->input(0).scalar<int64_t>()());
    if (comm == nullptr) return;
    auto flat = ctx->input(1).flat<tensorflow::tstring>();
    std::vector<std::string> identities;
    for (int64_t i = 0; i < flat.size(); ++i) identities.emplace_back(flat(i));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = comm->JoinHost(identities).message();
  }
};

class UseHostOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    auto comm = GetComm(ctx, ctx->input(0).scalar<int64_t>()());
    if (comm == nullptr) return;
    comm->UseHost(ctx->input(1).scalar<bool>()());
  }
};

class SharedResultBytesOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    auto comm = GetComm(ctx, ctx->input(0).scalar<int64_t>()());
    if (comm == nullptr) return;
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = comm->SharedResultBytes();
  }
};

class AbortOp : public OpKernel {
 public:
  explicit AbortOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("later", &later_));
  }
  void Compute(OpKernelContext* ctx) override {
    Abort(std::string(ctx->input(0).scalar<tensorflow::tstring>()()), later_);
  }

 private:
  bool later_;
};

class DestroyOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Unregister(ctx->input(0).scalar<int64_t>()());
  }
};

class AliasOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const int64_t handle = ctx->input(1).scalar<int64_t>()();
    const int64_t slot = Alias(ctx->input(0).scalar<int64_t>()(), handle);
    OP_REQUIRES(ctx, slot != 0,
                errors::InvalidArgument("tfdist_ext UCX communicator ", handle,
                                        " does not exist (destroyed, or never created)"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = slot;
  }
};

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
    job.done = [ctx, done, raw, label](const Status& status,
                                       const std::shared_ptr<void>& result) {
      if (!status.ok())
        ctx->SetStatus(errors::Unavailable(Describe(*raw, label, status)));
      else
        ctx->set_output(0, *static_cast<Held*>(result.get())->output);
      done();
    };
    comm->Submit(std::move(job));
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdistUcxCreate").Device(tensorflow::DEVICE_CPU), CreateOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxConnect").Device(tensorflow::DEVICE_CPU), ConnectOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxJoinLocal").Device(tensorflow::DEVICE_CPU), JoinLocalOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxHostIdentity").Device(tensorflow::DEVICE_CPU),
                        HostIdentityOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxJoinHost").Device(tensorflow::DEVICE_CPU), JoinHostOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxUseHost").Device(tensorflow::DEVICE_CPU), UseHostOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxAbort").Device(tensorflow::DEVICE_CPU), AbortOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxSharedResultBytes").Device(tensorflow::DEVICE_CPU),
                        SharedResultBytesOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxDestroy").Device(tensorflow::DEVICE_CPU), DestroyOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxRun").Device(tensorflow::DEVICE_CPU), RunOp);
REGISTER_KERNEL_BUILDER(Name("TfdistUcxAlias").Device(tensorflow::DEVICE_CPU), AliasOp);

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
