// The feed-forward's first bias and its GELU as one operator (one CUDA kernel each way,
// model/fused/cuda/bias_gelu.h), on the output y of a GEMM run without its bias b:
//   h = gelu(y + b)   erf GELU (at::gelu, approximate 'none') in float32, written in y's dtype
//   dy = dh gelu'(y + b)   in y's dtype;   db = sum_rows dy   in float32, then b's dtype
// The Function saves y (not y + b), and its backward reads dh and y once for both gradients, where
// libtorch's linear + gelu would run GeluBackward and then a separate column sum of dy for the
// bias. Numerics against linear(x, W, b) then gelu under bf16 autocast: there the GEMM adds the
// bf16-cast bias to its float32 accumulator, rounds y + b to bf16 and the GELU reads that; here the
// GEMM rounds y to bf16 and the float32 bias is added in float32 inside the GELU (one bf16
// rounding before the GELU either way; the bias never rounded to bf16); db sums the unrounded
// float32 dy (libtorch's sums the bf16 dy).
// On CPU tensors, in double, and at widths the kernel does not take (not a multiple of 8), the
// same math runs as libtorch ops (at::gelu / at::gelu_backward on y + b in float32, float64 for
// double) inside the same autograd Function. The model's composite path (CPU,
// FLASHCOS_FUSED_OPS=0) does not call it: it keeps libtorch's linear with its bias and F::gelu.
#pragma once

#include <ATen/core/Tensor.h>

namespace flashcos::model::fused {

// y: (..., F) fp16 / bf16 / fp32 / fp64; b: (F). Returns h, y's shape and dtype.
at::Tensor bias_gelu(const at::Tensor& y, const at::Tensor& b);
// True where the CUDA kernels take these tensors (else the libtorch-op path runs).
bool bias_gelu_uses_kernel(const at::Tensor& y, const at::Tensor& b);

}  // namespace flashcos::model::fused
