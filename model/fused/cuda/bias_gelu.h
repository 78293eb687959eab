// Torch-free parameters of the fused bias + GELU kernels (bias_gelu.cu), over N rows of width F
// (row-major, contiguous): y is a GEMM's output computed without its bias b.
//   forward   z = y + b (float32, b broadcast over rows),  h = gelu(z) = z Phi(z)
//             = z / 2 (1 + erf(z / sqrt 2))   (in y's dtype; the float32 formula of at::gelu,
//             approximate 'none')
//   backward  z as above (recomputed from y),  gelu'(z) = Phi(z) + z exp(-z^2 / 2) / sqrt(2 pi),
//             dy = dh gelu'(z)   (in y's dtype),
//             db = sum_rows dy   (float32 sums of the unrounded dy: per-block partials, then a
//             second tiny kernel sums them in a fixed order: deterministic; in b's dtype)
// so the backward reads dh and y once for both the GELU's gradient and the bias gradient (which
// libtorch's linear would take in a separate column-sum pass over dy).
// y, h, dh, dy share one dtype (fp16, bf16 or fp32); b / db fp16, bf16 or fp32. F a multiple of 8,
// every pointer 16-byte aligned.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

struct BiasGeluParams {
  int64_t rows = 0;  // N
  int width = 0;     // F
  int num_sms = 1;   // sizes the grids (the backward's: one partial row per block row)

  const void* y = nullptr;  // (N, F)
  DType dtype = DType::kBFloat16;  // of y, h, dh, dy
  const void* b = nullptr;  // (F)
  DType b_dtype = DType::kFloat;   // of b, db
  // forward output
  void* h = nullptr;  // (N, F)
  // backward
  const void* dh = nullptr;   // (N, F)
  void* dy = nullptr;         // (N, F)
  float* partials = nullptr;  // (bias_gelu_backward_row_blocks, F) scratch
  void* db = nullptr;         // (F)
  bool accumulate_db = false;  // add to what db holds instead of overwriting it (a parameter's .grad)
};

bool bias_gelu_supported(int64_t width);
// Rows of `partials` the caller allocates for the backward.
int bias_gelu_backward_row_blocks(const BiasGeluParams& p);

cudaError_t run_bias_gelu_fwd(const BiasGeluParams& p, cudaStream_t stream);
cudaError_t run_bias_gelu_bwd(const BiasGeluParams& p, cudaStream_t stream);

}  // namespace flashcos::cuda
