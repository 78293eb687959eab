// Fastmax CUDA kernels (attention/cuda/fastmax.cu): torch-free launchers, raw pointers + stream.
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

}  // namespace flashcos::cuda
