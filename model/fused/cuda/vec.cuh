// Device helpers shared by the fused trainer kernels (model/fused/cuda/*.cu): 8 consecutive
// elements of a runtime-typed (fp16 / bf16 / fp32) row in and out of float registers with 16-byte
// accesses, dtype rounding, warp sums, and the fixed-order column sums of per-block partials. The
// dtype switch is uniform across a launch, so it costs a predicated branch, not divergence; it
// spares a template instance per dtype combination.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda::fused {

constexpr int kVec = 8;  // elements per 16-byte access (two for fp32)
constexpr unsigned kFullMask = 0xffffffffu;

// One element of a runtime-typed row, in and out of float.
__device__ __forceinline__ float load1(const void* ptr, DType dtype, int64_t i) {
  if (dtype == DType::kFloat) return static_cast<const float*>(ptr)[i];
  if (dtype == DType::kHalf) return __half2float(static_cast<const __half*>(ptr)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(ptr)[i]);
}

__device__ __forceinline__ void store1(void* ptr, DType dtype, int64_t i, float v) {
  if (dtype == DType::kFloat) {
    static_cast<float*>(ptr)[i] = v;
  } else if (dtype == DType::kHalf) {
    static_cast<__half*>(ptr)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(ptr)[i] = __float2bfloat16_rn(v);
  }
}

// Two 16-bit values of one 32-bit word as floats, and two floats rounded into one word.
template <DType kDtype>
__device__ __forceinline__ float2 word_to_float2(uint32_t w) {
  if constexpr (kDtype == DType::kHalf) {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
  } else {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  }
}

template <DType kDtype>
__device__ __forceinline__ uint32_t float2_to_word(float a, float b) {
  if constexpr (kDtype == DType::kHalf) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

__device__ __forceinline__ void load8_f32(const void* ptr, int64_t off, float (&out)[kVec]) {
  const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(ptr) + off);
  const float4 a = p[0], b = p[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

__device__ __forceinline__ void store8_f32(void* ptr, int64_t off, const float (&in)[kVec]) {
  float4* p = reinterpret_cast<float4*>(static_cast<float*>(ptr) + off);
  p[0] = make_float4(in[0], in[1], in[2], in[3]);
  p[1] = make_float4(in[4], in[5], in[6], in[7]);
}

// Loads elements [off, off + 8) of a row; off a multiple of 8, the pointer 16-byte aligned.
__device__ __forceinline__ void load8(const void* ptr, DType dtype, int64_t off, float (&out)[kVec]) {
  if (dtype == DType::kFloat) {
    load8_f32(ptr, off, out);
    return;
  }
  const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(ptr) + off);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = dtype == DType::kHalf ? word_to_float2<DType::kHalf>(w[i]) : word_to_float2<DType::kBFloat16>(w[i]);
    out[2 * i] = f.x, out[2 * i + 1] = f.y;
  }
}

// Stores 8 floats, rounded to nearest in `dtype`, at [off, off + 8) of a 16-byte aligned row.
__device__ __forceinline__ void store8(void* ptr, DType dtype, int64_t off, const float (&in)[kVec]) {
  if (dtype == DType::kFloat) {
    store8_f32(ptr, off, in);
    return;
  }
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = dtype == DType::kHalf ? float2_to_word<DType::kHalf>(in[2 * i], in[2 * i + 1])
                                 : float2_to_word<DType::kBFloat16>(in[2 * i], in[2 * i + 1]);
  }
  *reinterpret_cast<uint4*>(static_cast<uint16_t*>(ptr) + off) = make_uint4(w[0], w[1], w[2], w[3]);
}

// load8 / store8 with the dtype known at compile time (for the hottest kernels: no switch, fewer
// registers, so more rows in flight).
template <DType kDtype>
__device__ __forceinline__ void load8(const void* ptr, int64_t off, float (&out)[kVec]) {
  if constexpr (kDtype == DType::kFloat) {
    load8_f32(ptr, off, out);
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(ptr) + off);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = word_to_float2<kDtype>(w[i]);
      out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
  }
}

template <DType kDtype>
__device__ __forceinline__ void store8(void* ptr, int64_t off, const float (&in)[kVec]) {
  if constexpr (kDtype == DType::kFloat) {
    store8_f32(ptr, off, in);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = float2_to_word<kDtype>(in[2 * i], in[2 * i + 1]);
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(ptr) + off) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// v rounded to nearest in `dtype` and back: what a store then a load would give.
__device__ __forceinline__ float round_to(DType dtype, float v) {
  if (dtype == DType::kHalf) return __half2float(__float2half_rn(v));
  if (dtype == DType::kBFloat16) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(kFullMask, v, m);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}

// Column sums of per-block partials, in a fixed order (deterministic): `rows` rows of float32,
// `stride` floats apart; a thread block of kColSumCols x kColSumRows threads takes kColSumCols
// consecutive columns, its thread rows stride over the rows, then one shared-memory sum over the
// thread rows. Returns the sum of column `blockIdx.x * kColSumCols + threadIdx.x % kColSumCols` to
// the threads of thread row 0 (threadIdx.x < kColSumCols), 0 to the others; `cols` bounds it.
constexpr int kColSumCols = 32, kColSumRows = 8, kColSumThreads = kColSumCols * kColSumRows;

__device__ __forceinline__ float column_sum_of_partials(const float* partials, int rows, int64_t stride, int cols) {
  __shared__ float s_acc[kColSumRows][kColSumCols + 1];
  const int tx = threadIdx.x % kColSumCols, ty = threadIdx.x / kColSumCols;
  const int col = blockIdx.x * kColSumCols + tx;
  float acc = 0.f;
  if (col < cols) {
    for (int b = ty; b < rows; b += kColSumRows) acc += partials[int64_t(b) * stride + col];
  }
  s_acc[ty][tx] = acc;
  __syncthreads();
  if (ty != 0) return 0.f;
#pragma unroll
  for (int r = 1; r < kColSumRows; ++r) acc += s_acc[r][tx];
  return acc;
}

}  // namespace flashcos::cuda::fused
