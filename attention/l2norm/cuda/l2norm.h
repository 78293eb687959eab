// Torch-free parameters of the fused l2norm kernels (attention/l2norm/cuda/l2norm.cu):
//   y = x r,  r = 1 / max(|x_g|, eps)  per group g of `gs` consecutive elements of the last dim;
//   dx = r (dy - y sum_g(dy y))  where |x_g| > eps, else r dy   (y recomputed from x in fp32;
//   times dy_scale where the caller's dy comes without a factor of the gradient).
// With `rotary` (DESIGN.md, Positions) the forward writes R(t) y instead of y, and the backward
// takes dy as the gradient of R(t) y and applies R(t)^T to it first. R(t) rotates each pair of
// features (2m, 2m + 1) of a group by the angle t * inv_freq[m] (m = 0 .. gs / 2 - 1; the caller
// fills inv_freq[m] = base^(-2m / gs) rounded to float); the angle is formed in fp32 as
// float(t) * inv_freq[m]. t = i2 + pos_offset: the position is the index along dim 2 of the 4-D
// view (T of a (B, H, T, D) tensor).
// Tensors are 4-D (n0, n1, n2, D) with a contiguous last dim and any other strides (elements);
// r is (n0, n1, n2, groups) float32, contiguous. Used by the packed attention (no copies of the
// q / k views of a fused projection) and by l2norm() for fp16 / bf16 / fp32 CUDA tensors.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

// The largest group size the kernels take is 32 lanes x 8 elements = 256: at most 128 pairs.
constexpr int kMaxRotaryPairs = 128;

struct NormTensor {
  const void* ptr = nullptr;
  DType dtype = DType::kBFloat16;  // fp16, bf16 or fp32
  int64_t s0 = 0, s1 = 0, s2 = 0;  // element strides of dims 0..2 (dim 3 contiguous)
};

struct L2NormParams {
  int64_t n0 = 0, n1 = 0, n2 = 0;
  int D = 0, groups = 1;
  float eps = 1e-12f;
  NormTensor x;        // input (both directions)
  NormTensor y;        // forward output (ptr written through)
  NormTensor dy;       // backward: incoming gradient
  NormTensor dx;       // backward output (ptr written through)
  float* r = nullptr;  // forward writes it, backward reads it
  float dy_scale = 1.f;  // backward: the gradient is dy times it (dx scaled alike)
  // Rotary positions (see the top): off unless `rotary`.
  bool rotary = false;
  int64_t pos_offset = 0;
  float inv_freq[kMaxRotaryPairs] = {};
  // With `rotary`, n2 x (gs / 2) float2 (cos, sin): the rotations (fp32 sincosf of the angle
  // above), which the main kernels read. run_l2norm_* fill it first, unless rotary_table_filled
  // says it already holds them (a table kept between launches, filled by run_rotary_table).
  float2* rotary_table = nullptr;
  bool rotary_table_filled = false;
};

// The kernels take 8 consecutive elements per thread with 16-byte loads (32-byte for fp32): D and
// the group size a multiple of 8, group size / 8 a power of two up to 32, every pointer 16-byte
// aligned (32 for fp32 is not needed: two 16-byte loads) and every stride a multiple of 8.
bool l2norm_supported(const L2NormParams& p);  // shape, groups and x's alignment
bool l2norm_aligned(const NormTensor& t);  // also false for fp64

cudaError_t run_l2norm_fwd(const L2NormParams& p, cudaStream_t stream);
// Fills p.rotary_table for p's n2, group size, inv_freq and pos_offset (one small kernel).
cudaError_t run_rotary_table(const L2NormParams& p, cudaStream_t stream);
cudaError_t run_l2norm_bwd(const L2NormParams& p, cudaStream_t stream);

}  // namespace flashcos::cuda
