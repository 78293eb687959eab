// The decode step's one-row linear layer (model/decode/cuda/decode_linear.h) on libtorch tensors:
// an optional LayerNorm of the input, the GEMV, bias, GELU, and either a store or an add into the
// float32 residual stream, in one launch. Per block of the decode step this takes the launches
// from about ten (norm, cast, GEMV, bias, GELU, add, ...) to four plus the attention.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flashcos::model {

// Whether the kernel applies on `device` for rows of k features in this build (CUDA, k a multiple
// of 8 up to 2048) and FLASHCOS_DECODE_LINEAR is not "0" (the switch that compares against the
// torch-op step).
bool decode_linear_available(const at::Device& device, int64_t k);

// x (1, K) in float32 or w's dtype; w (N, K) contiguous; bias (N) in w's dtype or undefined;
// ln_gamma / ln_beta (K) float32 or undefined (no LayerNorm); out (1, N): float32 when
// accumulate (out += y), else any of float32 / w's dtype. gelu applies GELU (erf) after the bias.
void decode_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& out,
                   const at::Tensor& ln_gamma, const at::Tensor& ln_beta, double ln_eps, bool gelu, bool accumulate);

}  // namespace flashcos::model
