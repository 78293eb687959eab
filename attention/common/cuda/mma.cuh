// Warp-level tensor-core building blocks for sm_80+: cp.async, ldmatrix, mma.sync m16n8k16.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4), used throughout the kernels:
//   A (16 x 16, row major)  a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   B (16 x 8, "col")       b0: (k 2t..2t+1, n g)  b1: (k 2t+8.., n g)
//   C (16 x 8, fp32)        c0, c1: (g, 2t..2t+1)  c2, c3: (g+8, 2t..2t+1)
// Shared-memory tiles are row major with a row pitch of (cols + 8) elements: the 16-byte pad
// shifts consecutive rows by four banks, so every ldmatrix phase is free of bank conflicts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/common/cuda/device_attribute.h"  // current_device_sm_count, for the launchers

namespace flashcos::cuda {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; valid == false zero-fills the destination (src is not read).
__device__ __forceinline__ void cp_async_16(void* s_dst, const void* g_src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(s_dst)),
               "l"(g_src), "r"(valid ? 16 : 0));
}
// 4-byte global -> shared copy (cp.async.ca); valid == false zero-fills.
__device__ __forceinline__ void cp_async_4(void* s_dst, const void* g_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(s_dst)),
               "l"(g_src), "r"(valid ? 4 : 0));
}
// dst[0] += a, dst[1] += b (8-byte aligned); one vector reduction on sm_90, two before.
__device__ __forceinline__ void atomic_add2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}
// dst[0..3] += v (16-byte aligned); one vector reduction on sm_90, four before.
__device__ __forceinline__ void atomic_add4(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w)
               : "memory");
#else
  atomicAdd(dst, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}
// Launches kernel(params...) with `smem` bytes of dynamic shared memory, raising the kernel's limit
// first where it is over the default 48 KB (per launch: the attribute belongs to the current
// device), and returns the first error.
template <typename... Params>
cudaError_t launch_with_smem(void (*kernel)(Params...), dim3 grid, int threads, size_t smem, cudaStream_t stream,
                             const Params&... params) {
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, threads, smem, stream>>>(params...);
  return cudaGetLastError();
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices; lanes 8m .. 8m+7 give the row addresses of matrix m.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* s_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(s_ptr)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* s_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(s_ptr)));
}
// Two matrices; lanes 0..15 give the addresses (the others are ignored but must be valid).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* s_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(s_ptr)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* s_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(s_ptr)));
}

// d += a * b, fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit values (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// The two values of a pack2 pair, back in fp32 (exact).
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t x);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t x) {
  return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t x) {
  return __half22float2(*reinterpret_cast<const __half2*>(&x));
}

// x rounded to T and back (what pack2 will store), so sums of P match the P that P V uses.
template <typename T>
__device__ __forceinline__ float round_to(float x);
template <>
__device__ __forceinline__ float round_to<__nv_bfloat16>(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
template <>
__device__ __forceinline__ float round_to<__half>(float x) {
  return __half2float(__float2half_rn(x));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Copies a (ROWS x D) tile of 16-bit elements (row pitch g_stride elements, 16-byte aligned
// rows) into shared memory with pitch D + 8; rows >= valid_rows are zero-filled (their source
// address is replaced by g_safe, a valid address of the same tensor).
template <int ROWS, int D, int THREADS, typename T>
__device__ __forceinline__ void load_tile_async(T* s_tile, const T* g_tile, int64_t g_stride,
                                                int valid_rows, const T* g_safe, int tid) {
  constexpr int kChunksPerRow = D / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
  constexpr int kPitch = D + 8;
#pragma unroll
  for (int c = tid; c < kChunks; c += THREADS) {
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * 8;
    const bool valid = row < valid_rows;
    const T* src = valid ? g_tile + row * g_stride + col : g_safe;
    cp_async_16(s_tile + row * kPitch + col, src, valid);
  }
}

}  // namespace flashcos::cuda
