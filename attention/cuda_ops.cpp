// Placeholder until the fused kernels land: every entry point raises a clear error.
#include "attention/core.h"

#include <c10/util/Exception.h>

namespace flashcos::detail {

ForwardResult fused_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, const CoreArgs&) {
  TORCH_CHECK(false, "flashcos: the fused CUDA attention kernel is not implemented yet; "
                     "use Backend::kTiled or kPlain");
}

BackwardResult fused_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, const CoreArgs&) {
  TORCH_CHECK(false, "flashcos: the fused CUDA attention kernel is not implemented yet");
}

bool fused_supports_head_dim(int64_t) { return false; }

}  // namespace flashcos::detail
