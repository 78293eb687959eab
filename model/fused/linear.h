// The trainer's projections as one operator: y = x W^T with W = cat(weights, 0) (one weight, or
// q / k / v's three stacked), where
//   - the GEMMs read `copy`, W in x's dtype made once per optimiser step (weight_copy.h), not a
//     per-micro-step autocast cast of every float32 weight;
//   - dx = dy W in x's dtype (one GEMM, as libtorch's linear);
//   - dW_i = dy_i^T x (dy_i: weight i's columns of dy) is computed by a GEMM with a float32 output
//     and float32 accumulation, straight into weight i's .grad with beta 1 (beta 0 and a fresh
//     float32 tensor where .grad is undefined). Under autocast libtorch instead writes dW in bf16,
//     casts it to float32 and adds it to .grad: three kernels and a bf16 rounding of every micro-
//     step's weight gradient more. The Function then returns no gradient for the weights, so
//     autograd's accumulation does nothing for them.
//   - With several weights (q / k / v), their .grad tensors become row blocks of one float32
//     buffer (made where all are undefined), so that one GEMM of all their rows accumulates them.
//   - Where something hooks a weight's gradient accumulation (data parallel's Reducer does),
//     dW_i goes back to autograd instead (the same GEMM into a fresh float32 tensor), so the hooks
//     see it.
// CUDA x of fp16 / bf16 with float32 weights takes the cuBLAS path (gemm_accumulate.h); everything
// else (CPU, float32 / float64 x) runs the same math as libtorch ops in float32 (float64 for
// double), with the same gradient semantics. The model's composite path (CPU, FLASHCOS_FUSED_OPS=0)
// does not call it: it keeps libtorch's linear.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace flashcos::model::fused {

// x (..., in); copy (sum of the weights' rows, in) in x's dtype; weights (out_i, in) leaves.
// Returns y (..., sum out_i) in x's dtype.
at::Tensor linear_from_copy(const at::Tensor& x, const at::Tensor& copy, const std::vector<at::Tensor>& weights);

}  // namespace flashcos::model::fused
