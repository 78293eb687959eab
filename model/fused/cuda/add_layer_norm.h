// Torch-free parameters of the fused residual add + LayerNorm kernels (add_layer_norm.cu), over N
// rows of width C (row-major, contiguous):
//   forward   s = x + (r + r_bias) (r optional; r_bias optional, only with r, broadcast over rows;
//             r + r_bias in float32, s rounded to s's dtype),  mean, rstd = 1 / sqrt(var + eps) of
//             s in float32 (biased variance),  y = (s - mean) rstd gamma + beta   (in y's dtype)
//   backward  xhat = (s - mean) rstd,  g = dy gamma,
//             dsum = rstd (g - mean_c(g) - xhat mean_c(g xhat)) + ds   (ds optional)
//             dx = dsum (x's dtype),  dr = dsum (r's dtype, optional),
//             dgamma = sum_rows dy xhat,  dbeta = sum_rows dy,  dr_bias = sum_rows dsum (with
//             r_bias)   (per-block partials, then a second tiny kernel sums them in a fixed order:
//             deterministic)
// r_bias is the bias of the GEMM that made r (the feed-forward's ff_out), run without it: adding it
// here spares that GEMM's bias gradient its own column-sum pass over dr.
// Every tensor is fp16, bf16 or fp32 (each its own); C a multiple of 8 up to kMaxWidth, every
// pointer 16-byte aligned.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

struct AddLayerNormParams {
  int64_t rows = 0;  // N
  int width = 0;     // C
  float eps = 1e-5f;
  int num_sms = 1;   // sizes the backward's grid (one partial row per block)

  // forward inputs
  const void* x = nullptr;  // (N, C)
  DType x_dtype = DType::kFloat;
  const void* r = nullptr;  // (N, C) or nullptr (plain LayerNorm of x)
  DType r_dtype = DType::kBFloat16;
  const void* r_bias = nullptr;  // (C) or nullptr; only with r (the backward reads it as a flag)
  DType r_bias_dtype = DType::kFloat;
  const void* gamma = nullptr;  // (C)
  const void* beta = nullptr;   // (C)
  DType w_dtype = DType::kFloat;
  // forward outputs
  void* s = nullptr;  // (N, C) x + r; nullptr when r is (s is then x itself)
  DType s_dtype = DType::kFloat;
  void* y = nullptr;  // (N, C)
  DType y_dtype = DType::kBFloat16;
  float* mean = nullptr;  // (N)
  float* rstd = nullptr;  // (N)

  // backward inputs (s: the forward's s, or x where there was no r; mean, rstd, gamma as above)
  const void* dy = nullptr;  // (N, C), y's dtype
  const void* ds = nullptr;  // (N, C), s's dtype, or nullptr (no gradient through s)
  // backward outputs
  void* dx = nullptr;  // (N, C), x's dtype
  void* dr = nullptr;  // (N, C), r's dtype, or nullptr
  float* partials = nullptr;  // (backward_blocks, backward_partials, C) scratch: dgamma, dbeta(, dr_bias) per block
  void* dgamma = nullptr;     // (C), w's dtype
  void* dbeta = nullptr;      // (C), w's dtype
  void* dr_bias = nullptr;    // (C), r_bias's dtype (with r_bias)
  // Add to what dgamma / dbeta / dr_bias hold instead of overwriting it (a parameter's .grad).
  bool accumulate_dgamma = false, accumulate_dbeta = false, accumulate_dr_bias = false;
};

constexpr int kAddLayerNormMaxWidth = 1024;

bool add_layer_norm_supported(int64_t width);
// Blocks of the backward launch, and the quantities each writes (2, 3 with r_bias): `partials` is
// (add_layer_norm_backward_blocks, add_layer_norm_backward_partials, C) float32.
int add_layer_norm_backward_blocks(const AddLayerNormParams& p);
int add_layer_norm_backward_partials(const AddLayerNormParams& p);

cudaError_t run_add_layer_norm_fwd(const AddLayerNormParams& p, cudaStream_t stream);
cudaError_t run_add_layer_norm_bwd(const AddLayerNormParams& p, cudaStream_t stream);

}  // namespace flashcos::cuda
