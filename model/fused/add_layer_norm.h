// Residual add + LayerNorm as one operator (one CUDA kernel each way, model/fused/cuda/):
//   sum = x + (r + r_bias)   (the new residual stream; r, r_bias optional; see below for dtypes)
//   normed = (sum - mean) / sqrt(var + eps) * gamma + beta   in out_dtype, statistics in float32
// so a pre-LN block reads the residual stream once for both the add and the norm, and the norm
// writes the next GEMM's input dtype (bf16 under autocast) directly. The gradient of sum and of
// normed arrive together in the backward: dx = dsum + dLN, dr = the same in r's dtype, dgamma /
// dbeta reduced across rows, and d r_bias = sum_rows dsum (what r's GEMM's bias would get).
//
// r_bias is the bias of the GEMM that made r, run without it (the feed-forward's ff_out, model/
// gpt.h), broadcast over rows: sum = x + (r + r_bias) is taken in float32 (float64 for double) and
// rounded once to result_type(x, r, r_bias), and the bias gradient comes out of the backward's
// column-sum pass instead of a separate reduction over dr. Numerics against libtorch's linear with
// its bias under bf16 autocast: there the GEMM adds the bias, cast to bf16, to its float32
// accumulator and rounds r + bias once to bf16; here the GEMM rounds r alone to bf16 and the
// float32 bias is added after, in float32 (one bf16 rounding either way; the bias itself is never
// rounded to bf16). The model's composite path (CPU, FLASHCOS_FUSED_OPS=0) keeps libtorch's linear
// with its bias and passes no r_bias.
//
// On CPU tensors, in double, and at widths the kernel does not take (not a multiple of 8 or over
// 1024, model/fused/cuda/add_layer_norm.h) the same math runs as libtorch ops inside the same
// autograd Function.
#pragma once

#include <ATen/core/Tensor.h>

namespace flashcos::model::fused {

struct AddLayerNormOut {
  at::Tensor sum;     // x + (r + r_bias); x itself where r is undefined
  at::Tensor normed;  // LayerNorm(sum), out_dtype
};

// x, r: (..., C), the same shape; r_bias: (C) or undefined (only with r); gamma, beta: (C), one
// dtype. Dtypes fp16 / bf16 / fp32 / fp64.
AddLayerNormOut add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& r_bias,
                               const at::Tensor& gamma, const at::Tensor& beta, double eps, at::ScalarType out_dtype);
// Without r_bias.
AddLayerNormOut add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& gamma,
                               const at::Tensor& beta, double eps, at::ScalarType out_dtype);
// LayerNorm(x) in out_dtype: add_layer_norm without a residual.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps,
                      at::ScalarType out_dtype);
// True where the CUDA kernels take these tensors (else the libtorch-op path runs).
bool add_layer_norm_uses_kernel(const at::Tensor& x, const at::Tensor& r, const at::Tensor& gamma,
                                at::ScalarType out_dtype, const at::Tensor& r_bias = at::Tensor());

}  // namespace flashcos::model::fused
