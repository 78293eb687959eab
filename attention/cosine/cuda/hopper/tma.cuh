// Tensor Memory Accelerator (TMA) pieces for the Hopper family (sm_90a): a tile load of a 4-D
// tensor map (cp.async.bulk.tensor) that completes on an mbarrier's transaction count, and the
// arrive that sets that count. One thread issues a load; the hardware writes the tile into shared
// memory in the map's swizzle (tma_map.h builds maps whose 128-byte swizzle is the SW128 layout of
// common.cuh, so a TMA-loaded tile is a wgmma operand as a cp.async-loaded one is) and fills rows
// past the tensor's end with zeros. Consumers wait on the barrier's phase (mbar_wait, common.cuh).
//
// Protocol per stage and phase: the issuing thread calls mbar_arrive_expect_tx(bar, bytes of every
// load of the stage) once, then the loads; the barrier's phase completes when that arrival (the
// barrier is initialised with count 1 for it) and all the bytes have landed.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attention/cosine/cuda/hopper/common.cuh"

namespace flashcos::cuda::hopper {

// One arrival on `bar` that also expects `bytes` more bytes of asynchronous (TMA) writes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}

// `bytes` more bytes of asynchronous (TMA) writes expected on `bar`, without an arrival.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}

// The box of `map` at element coordinates (c0 innermost .. c3) into shared memory at `dst` (1024-byte
// aligned for the 128-byte swizzle), completing on `bar`.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
#endif
}

// Adds the fp32 box at `src` (shared memory, laid out as `map`'s swizzle) into the box of `map` at
// (c0 .. c3) in global memory (cp.reduce.async.bulk.tensor, add); elements past the tensor's end are
// dropped. Completion is tracked by bulk groups: bulk_commit, then bulk_wait_read<0> before `src` is
// rewritten and bulk_wait<0> before the writes must have landed.
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2,
                                                  int c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Orders this thread's global-memory accesses through the generic proxy (loads, atomics, fences)
// with its accesses through the async proxy (TMA reductions), both ways.
__device__ __forceinline__ void fence_proxy_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// Brings a tensor map (a __grid_constant__ kernel parameter) into the TMA unit's cache ahead of its
// first use.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

}  // namespace flashcos::cuda::hopper
