// Residual add + LayerNorm as one operator (one CUDA kernel each way, model/fused/cuda/):
//   sum = x + r   (the new residual stream, in result_type(x, r); r optional)
//   normed = (sum - mean) / sqrt(var + eps) * gamma + beta   in out_dtype, statistics in float32
// so a pre-LN block reads the residual stream once for both the add and the norm, and the norm
// writes the next GEMM's input dtype (bf16 under autocast) directly. The gradient of sum and of
// normed arrive together in the backward: dx = dsum + dLN, dr = the same in r's dtype, dgamma /
// dbeta reduced across rows. On CPU tensors, in double, and at widths the kernel does not take
// (not a multiple of 8 or over 1024, model/fused/cuda/add_layer_norm.h) the same math runs as
// libtorch ops inside the same autograd Function.
#pragma once

#include <ATen/core/Tensor.h>

namespace flashcos::model::fused {

struct AddLayerNormOut {
  at::Tensor sum;     // x + r; x itself where r is undefined
  at::Tensor normed;  // LayerNorm(sum), out_dtype
};

// x, r: (..., C), the same shape; gamma, beta: (C), one dtype. Dtypes fp16 / bf16 / fp32 / fp64.
AddLayerNormOut add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& gamma,
                               const at::Tensor& beta, double eps, at::ScalarType out_dtype);
// LayerNorm(x) in out_dtype: add_layer_norm without a residual.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps,
                      at::ScalarType out_dtype);
// True where the CUDA kernels take these tensors (else the libtorch-op path runs).
bool add_layer_norm_uses_kernel(const at::Tensor& x, const at::Tensor& r, const at::Tensor& gamma,
                                at::ScalarType out_dtype);

}  // namespace flashcos::model::fused
