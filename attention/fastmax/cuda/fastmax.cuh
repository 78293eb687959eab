// Fastmax CUDA kernels (attention/fastmax/cuda/fastmax.cu): torch-free launchers, raw pointers + stream.
//
// Math in float32 (float64 for kF64).
// Feature map of one row x (D) into F = 1 + D (+ D (D + 1) / 2) values, row-major upper triangle:
//   phi(x) = [c0, c1 x_0 .. c1 x_{D-1}, c2 w_mr x_m x_r (m <= r)],  w_mr = 1 (m == r) or offdiag
// Feature gradient of one row: gx_t = c1 u_{1+t} + 2 c2 sum_r U_tr x_r, with U the symmetric
// matrix whose upper triangle is u[1 + D ..] (the packed quadratic part of u).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashcos::cuda {

enum class FmDtype { kF64, kF32, kBF16, kF16 };

// Largest head dim of these kernels (the feature table lives in shared memory).
constexpr int kFastmaxMaxHeadDim = 128;

struct FastmaxFeatureParams {
  const void* x = nullptr;  // (rows, D) in dtype, contiguous
  void* phi = nullptr;      // (rows, F) in dtype, contiguous
  int64_t rows = 0;
  int d = 0, f = 0, p = 2;
  float c0 = 1, c1 = 1, c2 = 1, offdiag = 1;
  FmDtype dtype = FmDtype::kF32;
};

struct FastmaxFeatureGradParams {
  const void* u = nullptr;  // (rows, F) float64 for kF64, else float32; contiguous
  const void* x = nullptr;  // (rows, D) in dtype, contiguous
  void* gx = nullptr;       // (rows, D) in u's type
  int64_t rows = 0;
  int d = 0, f = 0, p = 2;
  float c1 = 1, c2 = 1;
  FmDtype dtype = FmDtype::kF32;
};

// Both return cudaSuccess or the launch error.
cudaError_t launch_fastmax_features(const FastmaxFeatureParams& params, cudaStream_t stream);
cudaError_t launch_fastmax_feature_grad(const FastmaxFeatureGradParams& params, cudaStream_t stream);

// Fused moment scan (attention/fastmax/cuda/fastmax_scan.cu), bf16 x / y, head dims 16 / 32 / 64.
// Adds into out (N, Lx, Ep) and gx (N, Lx, D) (float32, += through atomics):
//   out_i += sum_{j visible} f(x_i . y_j) w_j
//   gx_i  += sum_{j visible} f'(x_i . y_j) (g_i . w_j) y_j
// with f(s) = a0 + a1 s (+ a2 s^2 when p = 2), computed from the moments
//   Z0 = sum_j w_j,  Z1[r, e] = sum_j y_jr w_je,  Z2[m, r, e] = sum_j y_jm y_jr w_je
// held on chip (Z2 in tensor-core accumulators, sliced over 16 columns e and a few m per CTA);
// nothing of size F = O(D^2) per token is ever written to memory.
// Non-causal: every row sees every column. Causal: Lx == Ly == L, a multiple of 64, and row i sees
// the columns j <= i (the moments of the earlier 64-token chunks plus the exact in-chunk part).
struct FastmaxScanParams {
  const void* x = nullptr;  // (N, Lx, D) bf16, contiguous
  const void* y = nullptr;  // (N, Ly, D) bf16, contiguous
  const float* w = nullptr; // (N, Ly, Ep) float32, contiguous, Ep a multiple of 16 (zero padded)
  const float* g = nullptr; // (N, Lx, Ep) float32 or null (no gx)
  float* out = nullptr;     // (N, Lx, Ep) or null (no out)
  float* gx = nullptr;      // (N, Lx, D); needed when g is set
  int64_t n = 0;
  int lx = 0, ly = 0, d = 0, ep = 0, p = 2;
  float a0 = 1, a1 = 1, a2 = 0.5f;
  bool causal = false;
};
constexpr int kFastmaxScanChunk = 64;
bool fastmax_scan_supported(int d);
cudaError_t launch_fastmax_scan(const FastmaxScanParams& params, cudaStream_t stream);

}  // namespace flashcos::cuda
