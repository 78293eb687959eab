// The deterministic mode's dQ grid on the GPU (the math and the bound: attention/cosine/dq_grid.h,
// whose libtorch dq_grid_constants is the reference tests/test_dq_grid.cpp compares these with):
//   kv pass:  m_v = max_j |v_j|_2 and m_k = max_jd |k_jd| of each (b, kv head), by atomicMax on the
//             bits of the non-negative floats (NaN's bits order above every number, so a NaN wins)
//             into p.dq_grid_kv, zeroed by the caller;
//   row pass: b_i = 2.5 |scale| |do_i|_2 m_v m_k (at least 2^-78), u_i = ceil(log2 b_i) - 22,
//             p.dq_grid[i] = c_i = 1.5 * 2^(u_i + 23) (NaN where b_i is not finite).
// The kv pass is its own kernel, launched by the Hopper backward before its delta kernel; the row
// pass runs inside the delta kernels (bwd_kernel.cuh, store_dq_grid_row), which read do_i anyway.
// H100 bf16 b4 h8 n 8192 d64 causal (ncu, run M4 of 2026-11-27): the kv pass 48.5 us, the delta kernel
// 34.6 us with the row pass against 27.5 us without, the backward kernel 1.3 ms.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "attention/cosine/cuda/params.h"
#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

// kLanes = D / 8 lanes per row of K and V, 16 bytes each (elements 8 t .. 8 t + 7 of lane t; the
// operands' rows are 16-byte aligned, cuda_ops.cpp makes them so). Each group of kLanes lanes takes
// a contiguous chunk of the (b, kv head, j) rows, keeps its maxima while the rows stay in one
// (b, kv head), and adds them to its slots (atomicMax) when the chunk moves on or ends.
template <typename T, int kLanes>
__global__ void dq_grid_kv_kernel(const BwdParams p) {
  const int64_t rows = int64_t(p.B) * p.Hkv * p.J;
  const int t = threadIdx.x % kLanes;
  const int64_t groups = int64_t(gridDim.x) * (blockDim.x / kLanes);
  const int64_t group = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int64_t chunk = (rows + groups - 1) / groups;
  const int64_t row_end = min(rows, (group + 1) * chunk);
  auto nan_max = [](float a, float x) { return x > a || x != x ? x : a; };  // NaN wins
  float v_max = 0.f, k_max = 0.f;
  int bh_now = -1;
  auto flush = [&] {
    if (t == 0 && bh_now >= 0) {
      atomicMax(p.dq_grid_kv + 2 * bh_now, __float_as_uint(v_max));
      atomicMax(p.dq_grid_kv + 2 * bh_now + 1, __float_as_uint(k_max));
    }
    v_max = k_max = 0.f;
  };
  // Every lane of a warp runs the same number of iterations (the shuffles need them all): groups
  // past their chunk's end read nothing and add nothing.
  for (int64_t it = 0; it < chunk; ++it) {
    const int64_t row = group * chunk + it;
    const bool in = row < row_end;
    float ss = 0.f, km = 0.f;
    int bh = bh_now;
    if (in) {
      const int j = int(row % p.J);
      bh = int(row / p.J);
      if (t * 8 < p.D) {
        const int h = bh % p.Hkv, b = bh / p.Hkv;
        const uint4 vv = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.v) + b * p.v_b_stride +
                                                         h * p.v_h_stride + int64_t(j) * p.v_j_stride + t * 8);
        const uint4 kk = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.k) + b * p.k_b_stride +
                                                         h * p.k_h_stride + int64_t(j) * p.k_j_stride + t * 8);
        const T* ve = reinterpret_cast<const T*>(&vv);
        const T* ke = reinterpret_cast<const T*>(&kk);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          ss = fmaf(float(ve[e]), float(ve[e]), ss);
          km = nan_max(km, fabsf(float(ke[e])));
        }
      }
    }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2) {
      ss += __shfl_xor_sync(0xffffffffu, ss, off);
      km = nan_max(km, __shfl_xor_sync(0xffffffffu, km, off));
    }
    if (!in) continue;
    if (bh != bh_now) {
      flush();
      bh_now = bh;
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

// Row `row` ((b, h, i) flattened) of p.dq_grid from |do_i|^2 = ss (the delta kernels call it, as
// they read do_i anyway).
__device__ __forceinline__ void store_dq_grid_row(const BwdParams& p, int64_t row, int b, int h, float ss) {
  const int hkv = h / (p.H / p.Hkv);
  const float v_max = __uint_as_float(p.dq_grid_kv[2 * (b * p.Hkv + hkv)]);
  const float k_max = __uint_as_float(p.dq_grid_kv[2 * (b * p.Hkv + hkv) + 1]);
  p.dq_grid[row] = dq_grid_constant(2.5f * fabsf(p.scale) * sqrtf(ss) * v_max * k_max);
}

// The K / V pass on `stream` (p.dq_grid_kv zeroed (B, Hkv, 2)); the delta kernel that follows
// writes p.dq_grid (store_dq_grid_row). fp16 / bf16 rows of D <= 128, D % 8 == 0.
template <typename T>
cudaError_t launch_dq_grid_kv(const BwdParams& p, cudaStream_t stream) {
  if (p.dq_grid == nullptr || p.dq_grid_kv == nullptr || p.D > 128 || p.D % 8 != 0) return cudaErrorInvalidValue;
  const int64_t kv_rows = int64_t(p.B) * p.Hkv * p.J;
  if (kv_rows == 0) return cudaSuccess;
  if (p.D <= 64) {
    dq_grid_kv_kernel<T, 8><<<unsigned(std::min<int64_t>((kv_rows + 31) / 32, 132 * 4)), 256, 0, stream>>>(p);
  } else {
    dq_grid_kv_kernel<T, 16><<<unsigned(std::min<int64_t>((kv_rows + 15) / 16, 132 * 4)), 256, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
