// Kernel for TfdistBuildInfo: a scalar string stamped at compile time.
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

// setup.py defines TFDIST_TF_VERSION from tf.__version__ at build time (the shipped
// release_version.h needs Bazel-provided macros and cannot be used here).
#ifndef TFDIST_TF_VERSION
#error "TFDIST_TF_VERSION must be defined by setup.py"
#endif

namespace tfdist {

class BuildInfoOp : public tensorflow::OpKernel {
 public:
  explicit BuildInfoOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = TFDIST_TF_VERSION;
  }
};

REGISTER_KERNEL_BUILDER(Name("TfdistBuildInfo").Device(tensorflow::DEVICE_CPU), BuildInfoOp);

}  // namespace tfdist
