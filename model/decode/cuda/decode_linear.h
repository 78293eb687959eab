// Torch-free parameters of the decode step's one-row linear layer (decode_linear.cu), the GEMV a
// batch-1 decode spends most of its launches on, with what sits around it folded in:
//   h = LN(x) = round((x - mean) / sqrt(var + eps) * gamma + beta)   (when gamma is given; float32
//       statistics, biased variance, rounded to the compute dtype), else h = x
//   y = round(W h + b)            W (N, K) row-major in the compute dtype, float32 accumulation
//   y = round(gelu(y))            (when gelu: 0.5 y (1 + erf(y / sqrt 2)))
//   out = y  |  out += y          (accumulate: out is the float32 residual stream)
// round() rounds to the compute dtype (W's), so each step matches the torch ops it replaces
// (LayerNorm then a cast, a linear with bias, a GELU, a residual add) up to summation order.
// A LayerNorm'd x must not be the accumulated out (other blocks would read it while it changes).
// K a multiple of 8, at most 2048; every pointer 16-byte aligned.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

struct DecodeLinearParams {
  const void* x = nullptr;  // (K) input row
  DType x_dtype = DType::kFloat;
  const float* ln_gamma = nullptr;  // (K) float32, or nullptr: no LayerNorm
  const float* ln_beta = nullptr;   // (K) float32
  float ln_eps = 1e-5f;
  const void* w = nullptr;     // (N, K)
  const void* bias = nullptr;  // (N) in w's dtype, or nullptr
  DType w_dtype = DType::kFloat;  // also the compute dtype
  void* out = nullptr;            // (N)
  DType out_dtype = DType::kFloat;
  int n = 0, k = 0;
  bool gelu = false;
  bool accumulate = false;  // out (float32) += y
};

constexpr int kDecodeLinearMaxK = 2048;

// Whether the kernel takes a row of K features.
bool decode_linear_supported(int k);
cudaError_t run_decode_linear(const DecodeLinearParams& p, cudaStream_t stream);

}  // namespace flashcos::cuda
