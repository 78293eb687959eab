// Softmax cross-entropy per row, its value and its gradient in one pass pair (math in
// cross_entropy.h). One warp per row: pass 1 reads the row once with an online max / sum per
// lane (m, l: l = sum exp(z - m)), merged across the warp, and picks up z_t; pass 2 re-reads the
// row (an L1 / L2 hit: the caller's chunk was just written by its GEMM) and writes
// dz = exp(z - lse) - [c == t]. All arithmetic in float32.
#include "model/fused/cuda/cross_entropy.h"

#include <cmath>

#include "model/fused/cuda/vec.cuh"

namespace flashcos::cuda {
namespace {

using namespace fused;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// Folds value z into the running (m, l) pair.
__device__ __forceinline__ void online_add(float z, float& m, float& l) {
  if (z > m) {
    l = l * expf(m - z) + 1.f;  // m == -inf: l is 0 and expf(-inf) is 0
    m = z;
  } else if (z != -INFINITY) {  // -inf adds nothing (and -inf - -inf would be NaN)
    l += expf(z - m);
  }
}

// kVectorized: lane handles groups of 8 columns (8 (lane + 32 k) ..), else single columns.
template <bool kVectorized>
__global__ void __launch_bounds__(kThreads) cross_entropy_rows_kernel(const CrossEntropyParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  if (row >= p.rows) return;
  const int64_t base = row * p.vocab;
  const int64_t t = p.target[row];
  const bool t_valid = t >= 0 && t < p.vocab;
  constexpr int step = kVectorized ? kVec : 1;
  float m = -INFINITY, l = 0.f, z_t = 0.f;
  for (int c0 = lane * step; c0 < p.vocab; c0 += 32 * step) {
    float z[kVec];
    if (kVectorized) {
      load8(p.logits, p.dtype, base + c0, z);
    } else {
      z[0] = load1(p.logits, p.dtype, base + c0);
    }
#pragma unroll
    for (int i = 0; i < step; ++i) {
      online_add(z[i], m, l);
      if (c0 + i == t) z_t = z[i];
    }
  }
  // Merge the lanes' (m, l); lanes with no columns carry (-inf, 0).
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1) {
    const float m_o = __shfl_xor_sync(kFullMask, m, s), l_o = __shfl_xor_sync(kFullMask, l, s);
    const float m_new = fmaxf(m, m_o);
    if (m_new == -INFINITY) continue;  // both empty (or an all -inf row so far)
    l = (m == -INFINITY ? 0.f : l * expf(m - m_new)) + (m_o == -INFINITY ? 0.f : l_o * expf(m_o - m_new));
    m = m_new;
  }
  z_t = warp_sum(z_t);  // exactly one lane holds it (the others 0)
  const float lse = m + logf(l);
  if (lane == 0) p.loss[row] = t_valid ? lse - z_t : NAN;
  for (int c0 = lane * step; c0 < p.vocab; c0 += 32 * step) {
    float z[kVec];
    if (kVectorized) {
      load8(p.logits, p.dtype, base + c0, z);
    } else {
      z[0] = load1(p.logits, p.dtype, base + c0);
    }
#pragma unroll
    for (int i = 0; i < step; ++i) z[i] = expf(z[i] - lse) - (c0 + i == t ? 1.f : 0.f);
    if (kVectorized) {
      store8(p.dlogits, p.dtype, base + c0, z);
    } else {
      store1(p.dlogits, p.dtype, base + c0, z[0]);
    }
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

cudaError_t run_cross_entropy_rows(const CrossEntropyParams& p, cudaStream_t stream) {
  if (p.vocab < 1 || p.dtype == DType::kDouble) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const int64_t blocks = (p.rows + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  if (p.vocab % kVec == 0 && aligned16(p.logits) && aligned16(p.dlogits)) {
    cross_entropy_rows_kernel<true><<<unsigned(blocks), kThreads, 0, stream>>>(p);
  } else {
    cross_entropy_rows_kernel<false><<<unsigned(blocks), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
