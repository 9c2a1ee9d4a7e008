// Op registration: TfdistBuildInfo, the TF version this library was compiled against.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/common_shape_fns.h"

REGISTER_OP("TfdistBuildInfo")
    .Output("tf_version: string")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Returns the TensorFlow version string the tfdist_ext op library was built for.
Used at import to verify the loaded library matches the running TensorFlow.
)doc");
