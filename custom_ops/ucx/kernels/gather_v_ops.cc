// TfdistUcxAllGatherV: an all-gather of 1-D tensors whose lengths differ
// between ranks and are known only when the step runs (the rows of an
// embedding gradient). The lengths arrive as an input (every rank's, gathered
// beforehand with a fixed-length all-gather), and the ring plan is built from
// them for each call, so no length is fixed when the graph is traced.
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "ucx/comm.h"
#include "ucx/kernels/schedule_kernel.h"

namespace tfdist_ucx {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::TensorShape;

REGISTER_OP("TfdistUcxAllGatherV")
    .Input("input: T")
    .Input("counts: int64")
    .Input("token: resource")
    .Output("output: T")
    .Attr(TFDIST_UCX_TYPES)
    .Attr("handle: int")
    .Attr("label: string")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Concatenates every rank's 1-D `input` in rank order over the communicator
`handle`. `counts[r]` is rank r's length, the same vector on every rank (this
rank's entry must be its input's length). A ring: each rank sends every block
but its successor's once. `token` orders this rank's collectives, as for
TfdistUcxRun.
)doc");

// The ring all-gather over blocks of `counts` elements: in round k, rank r
// passes block (r - k) mod p to its successor. Empty blocks are not sent.
Plan RingPlan(const std::vector<int64_t>& counts, int rank) {
  const int p = static_cast<int>(counts.size());
  std::vector<int64_t> offsets(p + 1, 0);
  for (int r = 0; r < p; ++r) offsets[r + 1] = offsets[r] + counts[r];
  Plan plan;
  for (int k = 0; k + 1 < p; ++k) {
    std::vector<Step> round;
    int sent = ((rank - k) % p + p) % p, received = ((rank - k - 1) % p + p) % p;
    if (counts[sent] > 0)
      round.push_back({kSend, (rank + 1) % p, offsets[sent], offsets[sent + 1]});
    if (counts[received] > 0)
      round.push_back({kRecvCopy, (rank + p - 1) % p, offsets[received], offsets[received + 1]});
    if (!round.empty()) plan.rounds.push_back(std::move(round));
  }
  return plan;
}

class AllGatherVOp : public AsyncOpKernel {
 public:
  explicit AllGatherVOp(tensorflow::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    tensorflow::DataType dtype;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("handle", &handle_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype));
    OP_REQUIRES_OK(ctx, ToDType(dtype, &dtype_));
    itemsize_ = tensorflow::DataTypeSize(dtype);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto comm = GetComm(ctx, handle_);
    if (comm == nullptr) return done();
    const Tensor& input = ctx->input(0);
    const Tensor& counts_tensor = ctx->input(1);
    OP_REQUIRES_ASYNC(ctx, input.dims() == 1,
                      errors::InvalidArgument("UCX collectives take 1-D tensors; got shape ",
                                              input.shape().DebugString()), done);
    OP_REQUIRES_ASYNC(ctx, counts_tensor.dims() == 1 &&
                               counts_tensor.NumElements() == comm->world_size(),
                      errors::InvalidArgument("`counts` must hold ", comm->world_size(),
                                              " lengths; got shape ",
                                              counts_tensor.shape().DebugString()), done);
    auto flat_counts = counts_tensor.vec<int64_t>();
    std::vector<int64_t> counts(flat_counts.data(), flat_counts.data() + flat_counts.size());
    const int rank = comm->rank();
    int64_t total = 0, offset = 0;
    for (int r = 0; r < comm->world_size(); ++r) {
      OP_REQUIRES_ASYNC(ctx, counts[r] >= 0,
                        errors::InvalidArgument("`counts` has a negative length"), done);
      if (r < rank) offset += counts[r];
      total += counts[r];
    }
    OP_REQUIRES_ASYNC(ctx, counts[rank] == input.NumElements(),
                      errors::InvalidArgument("`counts[", rank, "]` is ", counts[rank],
                                              " but this rank's input has ",
                                              input.NumElements(), " elements"), done);
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({total}), &output), done);
    if (input.NumElements() > 0)
      std::memcpy(static_cast<char*>(output->data()) + offset * itemsize_, input.data(),
                  input.TotalBytes());
    auto plan = std::make_shared<Plan>(RingPlan(counts, rank));
    if (plan->rounds.empty()) return done();
    auto held = std::make_shared<Held>();
    held->output = std::make_shared<Tensor>(*output);  // shares the buffer
    Job job;
    job.plan = std::move(plan);
    job.dtype = dtype_;
    job.itemsize = itemsize_;
    job.data = static_cast<char*>(output->data());
    job.num_elements = total;
    job.name = label_;
    job.keep_alive = held;
    Comm* raw = comm.get();
    job.done = [ctx, done, raw, label = label_](const Status& status,
                                                const std::shared_ptr<void>&) {
      if (!status.ok()) ctx->SetStatus(errors::Unavailable(Describe(*raw, label, status)));
      done();
    };
    comm->Submit(std::move(job));
  }

 private:
  int64_t handle_ = 0;
  std::string label_;
  DType dtype_;
  size_t itemsize_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("TfdistUcxAllGatherV").Device(tensorflow::DEVICE_CPU),
                        AllGatherVOp);

}  // namespace
}  // namespace tfdist_ucx
