// TF ops over the UCX mailbox (mailbox.h): what parameter servers and their
// workers use to talk. Every call runs on the mailbox's thread, in the order
// the ops were issued; the kernels are asynchronous, so a waiting call holds
// no TF thread.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "ucx/mailbox.h"

#define TFDIST_PS_TYPES "T: {half, bfloat16, float, double, int32, int64, uint8}"

namespace tfdist_ucx {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;
namespace shape_inference = tensorflow::shape_inference;

constexpr uint64_t kKindMask = uint64_t{0xFF} << 56;

REGISTER_OP("TfdistPsMailbox")
    .Attr("timeout_seconds: float")
    .Attr("spin_us: int = 100")
    .Attr("listen_port: int = -1")
    .Attr("source: int = 0")
    .Output("handle: int64")
    .Output("port: int32")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
Creates a mailbox; with `listen_port` >= 0 (0: any free port) it accepts
connections there and answers with tags whose source field is `source`.
Returns its handle and the port it listens on (-1 for a client).
)doc");

REGISTER_OP("TfdistPsConnect")
    .Input("handle: int64")
    .Input("address: string")
    .Attr("source: int")
    .Attr("connect_seconds: float")
    .Output("peer: int32")
    .Output("id: int64")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("Connects to the server at `address` (host:port); returns its peer index and our id.");

REGISTER_OP("TfdistPsSend")
    .Input("handle: int64")
    .Input("peer: int32")
    .Input("tag: int64")
    .Input("data: T")
    .Attr(TFDIST_PS_TYPES)
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Sends the bytes of `data` to `peer` under `tag`.");

REGISTER_OP("TfdistPsRecv")
    .Input("handle: int64")
    .Input("tag: int64")
    .Input("mask: int64")
    .Input("watch: int32")
    .Attr(TFDIST_PS_TYPES)
    .Output("sender_tag: int64")
    .Output("data: T")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Receives the first message whose tag matches `tag` under `mask`, from any
peer; fails when `watch` (or, with -1, any open peer) fails.
)doc");

REGISTER_OP("TfdistPsExchange")
    .Input("handle: int64")
    .Input("token: resource")
    .Input("data: N * T")
    .Attr(TFDIST_PS_TYPES)
    .Attr("N: int >= 1")
    .Attr("peers: list(int)")
    .Attr("send_tags: list(int)")
    .Attr("reply_kind: int")
    .Attr("sources: list(int)")
    .Output("reply_tags: int64")
    .Output("replies: N * T")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      c->set_output(0, c->Vector(n));
      for (int i = 0; i < n; ++i) c->set_output(1 + i, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Sends `data[i]` to `peers[i]` under `send_tags[i]` (all posted at once), then
receives one message of kind `reply_kind` from each peer, in whatever order
they come; the reply whose tag carries `sources[i]` is output i. `token` is a
per-mailbox resource: exchanges of one mailbox run in program order, those of
different mailboxes concurrently.
)doc");

REGISTER_OP("TfdistPsClose")
    .Input("handle: int64")
    .Input("peer: int32")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Marks `peer` closed: its later failure is not an error.");

REGISTER_OP("TfdistPsDestroy")
    .Input("handle: int64")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Releases the mailbox (its thread finishes the calls already issued).");

// The mailbox of input 0. Calls capture the raw pointer: destroying a
// mailbox waits for the calls already queued (mailbox.h).
Mailbox* Get(OpKernelContext* ctx) {
  int64_t handle = ctx->input(0).scalar<int64_t>()();
  auto mailbox = LookupMailbox(handle);
  if (mailbox == nullptr)
    ctx->SetStatus(errors::FailedPrecondition(
        "tfdist_ext mailbox ", handle, " does not exist (destroyed, or from another process)."));
  return mailbox.get();
}

// The status of a mailbox call that answers "" on success, else the problem.
absl::Status Checked(const Status& status) {
  return status.ok() ? absl::OkStatus() : errors::Unavailable(status.message());
}

// Queues `call` on the mailbox of input 0; its status becomes the op's, then `done` runs.
void SubmitCall(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done,
                std::function<absl::Status(Mailbox*)> call) {
  Mailbox* mailbox = Get(ctx);
  if (mailbox == nullptr) return done();
  mailbox->Submit([ctx, done = std::move(done), mailbox, call = std::move(call)] {
    ctx->SetStatus(call(mailbox));
    done();
  });
}

template <typename T>
absl::Status ScalarOutput(OpKernelContext* ctx, int index, T value) {
  Tensor* out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, TensorShape({}), &out));
  out->scalar<T>()() = value;
  return absl::OkStatus();
}

absl::Status BytesOutput(OpKernelContext* ctx, int index, const std::string& bytes) {
  const size_t item = tensorflow::DataTypeSize(ctx->expected_output_dtype(index));
  if (bytes.size() % item != 0)
    return errors::DataLoss("received ", bytes.size(), " bytes, not a whole number of ", item,
                            "-byte elements");
  Tensor* out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(
      index, TensorShape({static_cast<int64_t>(bytes.size() / item)}), &out));
  if (!bytes.empty())
    std::memcpy(const_cast<char*>(out->tensor_data().data()), bytes.data(), bytes.size());
  return absl::OkStatus();
}

class MailboxOp : public OpKernel {
 public:
  explicit MailboxOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    float timeout;
    int64_t spin, port, source;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("spin_us", &spin));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("listen_port", &port));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("source", &source));
    options_.timeout_seconds = timeout;
    options_.spin_us = static_cast<int>(spin);
    options_.listen_port = static_cast<int>(port);
    options_.source = source;
  }

  void Compute(OpKernelContext* ctx) override {
    auto mailbox = std::make_shared<Mailbox>(options_);
    OP_REQUIRES(ctx, mailbox->init_status().ok(),
                errors::Unavailable("UCX mailbox: ", mailbox->init_status().message()));
    OP_REQUIRES_OK(ctx, ScalarOutput<int32_t>(ctx, 1, mailbox->port()));
    OP_REQUIRES_OK(ctx, ScalarOutput<int64_t>(ctx, 0, RegisterMailbox(std::move(mailbox))));
  }

 private:
  MailboxOptions options_;
};

class ConnectOp : public AsyncOpKernel {
 public:
  explicit ConnectOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("source", &source_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("connect_seconds", &connect_seconds_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::string address(ctx->input(1).scalar<tensorflow::tstring>()());
    const int64_t source = source_;
    const double seconds = connect_seconds_;
    SubmitCall(ctx, std::move(done), [=](Mailbox* mailbox) -> absl::Status {
      int peer = -1;
      int64_t id = -1;
      TF_RETURN_IF_ERROR(Checked(mailbox->Connect(address, source, seconds, &peer, &id)));
      TF_RETURN_IF_ERROR(ScalarOutput<int32_t>(ctx, 0, peer));
      return ScalarOutput<int64_t>(ctx, 1, id);
    });
  }

 private:
  int64_t source_;
  float connect_seconds_;
};

class SendOp : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int peer = ctx->input(1).scalar<int32_t>()();
    uint64_t tag = static_cast<uint64_t>(ctx->input(2).scalar<int64_t>()());
    Tensor data = ctx->input(3);
    SubmitCall(ctx, std::move(done), [=](Mailbox* mailbox) {
      auto bytes = data.tensor_data();
      return Checked(mailbox->Send(peer, tag, bytes.data(), bytes.size()));
    });
  }
};

class RecvOp : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    uint64_t tag = static_cast<uint64_t>(ctx->input(1).scalar<int64_t>()());
    uint64_t mask = static_cast<uint64_t>(ctx->input(2).scalar<int64_t>()());
    int watch = ctx->input(3).scalar<int32_t>()();
    SubmitCall(ctx, std::move(done), [=](Mailbox* mailbox) -> absl::Status {
      uint64_t sender_tag = 0;
      std::string payload;
      TF_RETURN_IF_ERROR(Checked(mailbox->Recv(tag, mask, watch, &sender_tag, &payload)));
      TF_RETURN_IF_ERROR(ScalarOutput<int64_t>(ctx, 0, static_cast<int64_t>(sender_tag)));
      return BytesOutput(ctx, 1, payload);
    });
  }
};

class ExchangeOp : public AsyncOpKernel {
 public:
  explicit ExchangeOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    std::vector<int64_t> peers, send_tags, sources;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("peers", &peers));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("send_tags", &send_tags));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sources", &sources));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reply_kind", &reply_kind_));
    int n;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n));
    OP_REQUIRES(ctx, peers.size() == static_cast<size_t>(n) &&
                         send_tags.size() == peers.size() && sources.size() == peers.size(),
                errors::InvalidArgument("peers, send_tags and sources need N entries"));
    for (size_t i = 0; i < peers.size(); ++i) {
      peers_.push_back(static_cast<int>(peers[i]));
      send_tags_.push_back(static_cast<uint64_t>(send_tags[i]));
      sources_.push_back(sources[i]);
    }
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OpInputList inputs;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->input_list("data", &inputs), done);
    std::vector<Tensor> data(inputs.begin(), inputs.end());
    SubmitCall(ctx, std::move(done), [this, ctx, data](Mailbox* mailbox) {
      return Run(ctx, mailbox, data);
    });
  }

 private:
  // Runs on the mailbox thread; the kernel outlives its queued calls.
  absl::Status Run(OpKernelContext* ctx, Mailbox* mailbox, const std::vector<Tensor>& data) {
    std::vector<const void*> pointers;
    std::vector<size_t> sizes;
    for (const Tensor& t : data) {
      pointers.push_back(t.tensor_data().data());
      sizes.push_back(t.tensor_data().size());
    }
    TF_RETURN_IF_ERROR(Checked(mailbox->SendAll(peers_, send_tags_, pointers, sizes)));
    Tensor* tags_out;
    TF_RETURN_IF_ERROR(ctx->allocate_output(
        0, TensorShape({static_cast<int64_t>(peers_.size())}), &tags_out));
    const uint64_t want = static_cast<uint64_t>(reply_kind_) << 56;
    std::vector<bool> seen(peers_.size(), false);
    for (size_t n = 0; n < peers_.size(); ++n) {
      uint64_t sender_tag = 0;
      std::string payload;
      // Any order: a server blocked sending to us must not wait behind another.
      TF_RETURN_IF_ERROR(Checked(mailbox->Recv(want, kKindMask, -1, &sender_tag, &payload)));
      const int64_t source = static_cast<int64_t>((sender_tag >> 40) & 0xFFFF);
      size_t i = 0;
      while (i < sources_.size() && (sources_[i] != source || seen[i])) ++i;
      if (i == sources_.size()) return errors::Internal("unexpected reply from source ", source);
      seen[i] = true;
      tags_out->flat<int64_t>()(i) = static_cast<int64_t>(sender_tag);
      TF_RETURN_IF_ERROR(BytesOutput(ctx, 1 + static_cast<int>(i), payload));
    }
    return absl::OkStatus();
  }

  std::vector<int> peers_;
  std::vector<uint64_t> send_tags_;
  std::vector<int64_t> sources_;
  int64_t reply_kind_;
};

class CloseOp : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int peer = ctx->input(1).scalar<int32_t>()();
    SubmitCall(ctx, std::move(done), [peer](Mailbox* mailbox) {
      mailbox->Close(peer);
      return absl::OkStatus();
    });
  }
};

class DestroyOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    UnregisterMailbox(ctx->input(0).scalar<int64_t>()());
  }
};

#define TFDIST_PS_KERNEL(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(tensorflow::DEVICE_CPU), kernel)
TFDIST_PS_KERNEL("TfdistPsMailbox", MailboxOp);
TFDIST_PS_KERNEL("TfdistPsConnect", ConnectOp);
TFDIST_PS_KERNEL("TfdistPsSend", SendOp);
TFDIST_PS_KERNEL("TfdistPsRecv", RecvOp);
TFDIST_PS_KERNEL("TfdistPsExchange", ExchangeOp);
TFDIST_PS_KERNEL("TfdistPsClose", CloseOp);
TFDIST_PS_KERNEL("TfdistPsDestroy", DestroyOp);
#undef TFDIST_PS_KERNEL

}  // namespace
}  // namespace tfdist_ucx
