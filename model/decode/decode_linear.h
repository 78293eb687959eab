// The decode step's one-row linear layer (model/decode/cuda/decode_linear.h) on libtorch tensors:
// an optional LayerNorm of the input, the GEMV, bias, GELU, and either a store or an add into the
// float32 residual stream, in one launch. Per block of the decode step this takes the launches
// from about ten (norm, cast, GEMV, bias, GELU, add, ...) to four plus the attention; the step's
// embedding lookup and position advance fold into its first and last launch (DecodeLinearFolds).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flashcos::model {

// Whether the kernel applies on `device` for rows of k features in this build (CUDA, k a multiple
// of 8 up to 2048) and FLASHCOS_DECODE_LINEAR is not "0" (the switch that compares against the
// torch-op step).
bool decode_linear_available(const at::Device& device, int64_t k);

// What else a decode_linear launch may do; each field undefined: not that.
struct DecodeLinearFolds {
  // (1) or (1, 1) int64 on the device: x is then a (rows, K) table and the input row is
  // x[token] (the step's embedding lookup; token in [0, rows) is the caller's to check).
  at::Tensor token;
  // (1, K) float32, with token: receives the input row (the start of the residual stream).
  at::Tensor x_store;
  // (1) int64 on the device: += 1 after every earlier kernel of the stream has completed.
  at::Tensor pos;
};

// x (1, K) in float32 or w's dtype; w (N, K) contiguous; bias (N) in w's dtype or undefined;
// ln_gamma / ln_beta (K) float32 or undefined (no LayerNorm); out (1, N): float32 when
// accumulate (out += y; out must not be x or folds.x_store), else any of float32 / w's dtype.
// gelu applies GELU (erf) after the bias. Every tensor 16-byte aligned.
void decode_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& out,
                   const at::Tensor& ln_gamma, const at::Tensor& ln_beta, double ln_eps, bool gelu, bool accumulate,
                   const DecodeLinearFolds& folds = {});

}  // namespace flashcos::model
