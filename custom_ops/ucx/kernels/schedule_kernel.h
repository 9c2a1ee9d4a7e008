// What the ops that run a schedule share (ucx_ops.cc, inflight_ops.cc): the
// dtype list, communicator lookup, and job creation from a kernel's attributes.
#ifndef TFDIST_CUSTOM_OPS_UCX_KERNELS_SCHEDULE_KERNEL_H_
#define TFDIST_CUSTOM_OPS_UCX_KERNELS_SCHEDULE_KERNEL_H_

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "ucx/comm.h"

#define TFDIST_UCX_TYPES "T: {half, bfloat16, float, double, int32, int64}"

namespace tfdist_ucx {

using tensorflow::DataType;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
namespace errors = tensorflow::errors;

inline absl::Status ToDType(DataType dtype, DType* out) {
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

inline std::shared_ptr<Comm> GetComm(OpKernelContext* ctx, int64_t handle) {
  std::shared_ptr<Comm> comm = Lookup(handle);
  if (comm == nullptr)
    ctx->SetStatus(errors::FailedPrecondition(
        "tfdist_ext UCX communicator ", handle,
        " does not exist (destroyed, or created in another process)."));
  return comm;
}

// What a job reads and writes, kept alive until it is retired (and, for a
// started job, until it is awaited).
struct Held {
  Tensor input;  // unset when the job ran in place
  std::shared_ptr<Tensor> output;  // unset for an in-process member other than rank 0
};

// A result in memory the job does not own (a shared-memory sum's block, which
// every rank's result reads). Not owning it, TF never forwards it to an op
// that would write it in place.
class SharedBuffer : public tensorflow::TensorBuffer {
 public:
  SharedBuffer(char* data, size_t bytes, std::shared_ptr<void> owner)
      : TensorBuffer(data), bytes_(bytes), owner_(std::move(owner)) {}
  size_t size() const override { return bytes_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(bytes_));
    proto->set_allocator_name("tfdist_ucx_shared_memory");
  }
  bool OwnsMemory() const override { return false; }

 private:
  const size_t bytes_;
  const std::shared_ptr<void> owner_;
};

// Shared by Run and Start: validated attributes and job creation.
class ScheduleKernel {
 protected:
  void Init(OpKernelConstruction* ctx) {
    std::vector<int64_t> flat;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("handle", &handle_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("plan", &flat));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label_));
    bool in_process, host_sum;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("in_process", &in_process));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("host_sum", &host_sum));
    OP_REQUIRES(ctx, !(in_process && host_sum),
                errors::InvalidArgument("in_process and host_sum exclude each other"));
    path_ = in_process ? Path::kLocal : host_sum ? Path::kHost : Path::kWire;
    DataType dtype;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype));
    OP_REQUIRES_OK(ctx, ToDType(dtype, &dtype_));
    itemsize_ = tensorflow::DataTypeSize(dtype);
    auto comm = Lookup(handle_);
    OP_REQUIRES(ctx, comm != nullptr,
                errors::FailedPrecondition("tfdist_ext UCX communicator ", handle_,
                                           " does not exist."));
    OP_REQUIRES(ctx, path_ != Path::kLocal || comm->local_index() >= 0 || comm->rehearsal(),
                errors::FailedPrecondition("an in-process collective on communicator ",
                                           handle_, ", which is in no local group"));
    auto plan = std::make_shared<Plan>();
    Status parsed = ParsePlan(flat, comm->world_size(), plan.get());
    OP_REQUIRES(ctx, parsed.ok(), errors::InvalidArgument("bad UCX plan: ", parsed.message()));
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
    if (path_ != Path::kLocal && max_index_ > input.NumElements())
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
      if (path_ != Path::kLocal || comm.local_index() == 0 || comm.rehearsal() ||
          !Runs(input.NumElements())) {
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
    job->path = path_;
    job->dtype = dtype_;
    job->itemsize = itemsize_;
    job->data = held->output ? static_cast<char*>(held->output->data()) : nullptr;
    job->num_elements = input.NumElements();
    job->name = label_;
    job->keep_alive = held;
    job->alias = [dtype = input.dtype(), shape = input.shape()](
                     char* data, std::shared_ptr<void> owner) -> std::shared_ptr<void> {
      auto result = std::make_shared<Held>();
      auto* buffer = new SharedBuffer(data, tensorflow::DataTypeSize(dtype) * shape.num_elements(),
                                      std::move(owner));
      result->output = std::make_shared<Tensor>(dtype, shape, buffer);
      buffer->Unref();  // the tensor holds its own reference
      return result;
    };
    return absl::OkStatus();
  }

  // Whether a job over `n` elements communicates (else the input is the result).
  bool Runs(int64_t n) const {
    return n > 0 && (path_ != Path::kWire || !plan_->rounds.empty());
  }

  int64_t handle_ = 0;
  Path path_ = Path::kWire;
  std::string label_;
  DType dtype_;
  size_t itemsize_ = 0;
  int64_t max_index_ = 0;
  std::shared_ptr<const Plan> plan_;
};

inline std::string Describe(const Comm& comm, const std::string& label, const Status& status) {
  return "tfdist_ext UCX collective '" + label + "' on rank " + std::to_string(comm.rank()) +
         " of " + std::to_string(comm.world_size()) + ": " + status.message();
}

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_KERNELS_SCHEDULE_KERNEL_H_
