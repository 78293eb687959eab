// Torch-free parameters of the decode step's one-row linear layer (decode_linear.cu), the GEMV a
// batch-1 decode spends most of its launches on, with what sits around it folded in:
//   x = table[*token]             (when token is given: the step's embedding lookup; x_store, if
//                                  given, receives x in float32 — the residual stream's start)
//   h = LN(x) = round((x - mean) / sqrt(var + eps) * gamma + beta)   (when gamma is given; float32
//       statistics, biased variance, rounded to the compute dtype), else h = x
//   y = round(W h + b)            W (N, K) row-major in the compute dtype, float32 accumulation
//   y = round(gelu(y))            (when gelu: 0.5 y (1 + erf(y / sqrt 2)))
//   out = y  |  out += y          (accumulate: out is the float32 residual stream)
//   *pos += 1                     (when pos is given: the step's position advance, once per launch)
// round() rounds to the compute dtype (W's), so each step matches the torch ops it replaces
// (embedding then a cast, LayerNorm then a cast, a linear with bias, a GELU, a residual add) up to
// summation order. An accumulated out must not be x or x_store (other warps read x while it
// changes). K a multiple of 8, at most 2048; every pointer 16-byte aligned. Launched with
// programmatic dependent launch on sm_90+ (pdl.cuh): W, bias, gamma, beta must not be written by
// the kernels of the same stream; token, x, pos are read after the previous kernel completed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

struct DecodeLinearParams {
  const void* x = nullptr;  // (K) input row, or with token the (rows, K) table
  DType x_dtype = DType::kFloat;
  const int64_t* token = nullptr;  // (1) device: the table's row to take as x, or nullptr (x is the row)
  float* x_store = nullptr;        // (K) float32: receives x (with token only), or nullptr
  const float* ln_gamma = nullptr;  // (K) float32, or nullptr: no LayerNorm
  const float* ln_beta = nullptr;   // (K) float32
  float ln_eps = 1e-5f;
  const void* w = nullptr;     // (N, K)
  const void* bias = nullptr;  // (N) in w's dtype, or nullptr
  DType w_dtype = DType::kFloat;  // also the compute dtype
  void* out = nullptr;            // (N)
  DType out_dtype = DType::kFloat;
  int64_t* pos = nullptr;  // (1) device: += 1 by one thread, or nullptr
  int n = 0, k = 0;
  bool gelu = false;
  bool accumulate = false;  // out (float32) += y
};

constexpr int kDecodeLinearMaxK = 2048;

// Whether the kernel takes a row of K features.
bool decode_linear_supported(int k);
cudaError_t run_decode_linear(const DecodeLinearParams& p, cudaStream_t stream);

}  // namespace flashcos::cuda
