// The deterministic mode's dQ grid on the GPU (the math and the bound: attention/cosine/dq_grid.h,
// whose libtorch dq_grid_constants is the reference tests/test_dq_grid.cpp compares these with):
//   kv pass:  m_v = max_j |v_j|_2 and m_k = max_jd |k_jd| of each (b, kv head), by atomicMax on the
//             bits of the non-negative floats (NaN's bits order above every number, so a NaN wins)
//             into p.dq_grid_kv, zeroed by the caller;
//   row pass: b_i = 2.5 |scale| |do_i|_2 m_v m_k (at least 2^-78), u_i = ceil(log2 b_i) - 22,
//             p.dq_grid[i] = c_i = 1.5 * 2^(u_i + 23) (NaN where b_i is not finite).
// Launched by the Hopper backward before its delta kernel. Both read their rows a warp per row with
// 2-byte loads: H100 bf16 b4 h8 n 8192 d64, 99 and 94 us (ncu, run K6 of 2026-11-27) against the
// backward kernel's 1.3 ms (causal); 16-byte loads, and the row pass inside the delta kernel (which
// reads do_i anyway), would take about a tenth of that (docs/kernels.md, "Open performance work").
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "attention/cosine/cuda/params.h"
#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

// Each warp takes a contiguous chunk of the (b, kv head, j) rows of K and V, one row at a time (lane
// l holds elements l, l + 32, ..), and adds its maxima to a (b, kv head)'s slots when the chunk
// moves on to the next one or ends: a few atomics per warp.
template <typename T>
__global__ void dq_grid_kv_kernel(const BwdParams p) {
  const int64_t rows = int64_t(p.B) * p.Hkv * p.J;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t chunk = (rows + warps - 1) / warps;
  const int64_t row_end = min(rows, (warp + 1) * chunk);
  auto nan_max = [](float a, float x) { return x > a || x != x ? x : a; };  // NaN wins
  float v_max = 0.f, k_max = 0.f;
  int bh_now = -1;
  auto flush = [&] {
    if (lane == 0 && bh_now >= 0) {
      atomicMax(p.dq_grid_kv + 2 * bh_now, __float_as_uint(v_max));
      atomicMax(p.dq_grid_kv + 2 * bh_now + 1, __float_as_uint(k_max));
    }
    v_max = k_max = 0.f;
  };
  for (int64_t row = warp * chunk; row < row_end; ++row) {
    const int j = int(row % p.J);
    const int bh = int(row / p.J);
    if (bh != bh_now) {
      flush();
      bh_now = bh;
    }
    const int h = bh % p.Hkv, b = bh / p.Hkv;
    const T* v = static_cast<const T*>(p.v) + b * p.v_b_stride + h * p.v_h_stride + int64_t(j) * p.v_j_stride;
    const T* k = static_cast<const T*>(p.k) + b * p.k_b_stride + h * p.k_h_stride + int64_t(j) * p.k_j_stride;
    float ss = 0.f, km = 0.f;
    for (int d = lane; d < p.D; d += 32) {
      const float vd = float(v[d]);
      ss = fmaf(vd, vd, ss);
      km = nan_max(km, fabsf(float(k[d])));
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      ss += __shfl_xor_sync(0xffffffffu, ss, off);
      km = nan_max(km, __shfl_xor_sync(0xffffffffu, km, off));
    }
    v_max = nan_max(v_max, sqrtf(ss));
    k_max = nan_max(k_max, km);
  }
  flush();
}

// c_i from the bound b (see the header): 1.5 * 2^(ceil(log2 b) + 1), NaN where b is not finite.
__device__ __forceinline__ float dq_grid_constant(float bound) {
  if (!(bound <= 3.4e38f)) return __int_as_float(0x7fc00000);  // inf or NaN
  bound = fmaxf(bound, 0x1p-78f);
  int e = 0;
  const float m = frexpf(bound, &e);  // bound = m 2^e, m in [0.5, 1)
  const int ceil_log2 = m == 0.5f ? e - 1 : e;
  return ldexpf(1.5f, ceil_log2 + 1);
}

// One warp per row of dO.
template <typename T>
__global__ void dq_grid_rows_kernel(const BwdParams p) {
  const int64_t rows = int64_t(p.B) * p.H * p.I;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int i = int(row % p.I);
  const int h = int((row / p.I) % p.H);
  const int b = int(row / (int64_t(p.I) * p.H));
  const T* dout = static_cast<const T*>(p.dout) + b * p.do_b_stride + h * p.do_h_stride + int64_t(i) * p.do_i_stride;
  float ss = 0.f;
  for (int d = lane; d < p.D; d += 32) {
    const float x = float(dout[d]);
    ss = fmaf(x, x, ss);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if (lane == 0) {
    const int hkv = h / (p.H / p.Hkv);
    const float v_max = __uint_as_float(p.dq_grid_kv[2 * (b * p.Hkv + hkv)]);
    const float k_max = __uint_as_float(p.dq_grid_kv[2 * (b * p.Hkv + hkv) + 1]);
    p.dq_grid[row] = dq_grid_constant(2.5f * fabsf(p.scale) * sqrtf(ss) * v_max * k_max);
  }
}

// Both passes on `stream`; p.dq_grid_kv zeroed (B, Hkv, 2), p.dq_grid (B, H, I).
template <typename T>
cudaError_t launch_dq_grid(const BwdParams& p, cudaStream_t stream) {
  if (p.dq_grid == nullptr || p.dq_grid_kv == nullptr) return cudaErrorInvalidValue;
  const int64_t kv_rows = int64_t(p.B) * p.Hkv * p.J, rows = int64_t(p.B) * p.H * p.I;
  if (kv_rows == 0 || rows == 0) return cudaSuccess;
  // About 4 blocks of 8 warps per SM of an H100 over the K / V rows (each warp walks a chunk).
  const unsigned kv_blocks = unsigned(std::min<int64_t>((kv_rows + 7) / 8, 132 * 4));
  dq_grid_kv_kernel<T><<<kv_blocks, 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if ((rows + 7) / 8 > int64_t(INT32_MAX)) return cudaErrorInvalidConfiguration;
  dq_grid_rows_kernel<T><<<unsigned((rows + 7) / 8), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
