// When the model uses the fused trainer operators (model/fused/): on CUDA tensors, in a build with
// the CUDA kernels, unless FLASHCOS_FUSED_OPS=0 is set (read on every call, for comparisons
// between the fused and the composite step in one build). CPU tensors always take the composite
// libtorch ops, so CPU training is unchanged (tests can lift that, below).
// FLASHCOS_FUSED_OPS may instead list the operators to fuse, comma-separated, out of
//   norm (residual add + LayerNorm), gelu (the feed-forward's bias + GELU, with ff_out's bias carried
//   to the next norm), embedding (the token table's gradient kernels), classifier (classifier +
//   cross-entropy), copies (the projections from weight copies, below),
// the others taking their composite ops (to find which one moves a result); unset or 1: all.
#pragma once

#include <ATen/core/Tensor.h>

namespace flashcos::model::fused {

bool kernels_compiled();
bool fused_ops_enabled(const at::Tensor& t);
// fused_ops_enabled(t), and `op` (norm, gelu, embedding, classifier, copies) not left out of a list
// in FLASHCOS_FUSED_OPS (op nullptr: fused_ops_enabled(t) itself). copies: the fused path's projections run from weight copies with their
// gradients accumulated by the GEMM (model/fused/linear.h); FLASHCOS_WEIGHT_COPIES=0 also turns
// that one off (libtorch's linear under autocast there).
bool fused_op_enabled(const at::Tensor& t, const char* op);
// The dtype the layer after a norm computes in: autocast's dtype where autocast is on for t's
// device, else t's own. The fused norms write their output in it (no separate cast pass).
at::ScalarType activation_dtype(const at::Tensor& t);

// For tests: while one of these lives, fused_ops_enabled is also true for CPU tensors (still false
// under FLASHCOS_FUSED_OPS=0), so that the model takes its fused structure (the carried biases,
// the fused Functions) with the operators' libtorch-op paths, which a CPU test can check against
// the plain pre-LN block in float64. Process-wide; not for training.
class FusedOpsOnCpuForTesting {
 public:
  FusedOpsOnCpuForTesting();
  ~FusedOpsOnCpuForTesting();
  FusedOpsOnCpuForTesting(const FusedOpsOnCpuForTesting&) = delete;
  FusedOpsOnCpuForTesting& operator=(const FusedOpsOnCpuForTesting&) = delete;
};

}  // namespace flashcos::model::fused
