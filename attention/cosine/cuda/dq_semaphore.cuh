// Deterministic dQ for the 16-bit backward kernels (BwdParams::dq_semaphore).
//
// Every CTA of the backward owns one key block n and adds its part dQ_n = dS_n K_n of each query
// row unit (rows r0 .. r0 + n_rows of one (b, h)) to the fp32 accumulator. Float addition is not
// associative, so racing atomics give run-to-run different bits. Here the adds to one unit happen
// in key-block order: the CTA of block n waits until the unit's counter shows every lower block's
// adds (n adds per writer of a block), adds, then counts its own:
//   one thread:   spin on ld.acquire.gpu counter >= target
//   barrier       (the acquire extends to the CTA's / warpgroup's threads)
//   every thread: its atomics, __threadfence()
//   barrier, one thread: red.release.gpu counter += 1
// Progress needs key block n - 1 to be resident or done while n waits: both kernels launch lower
// key blocks of a (b, head) first, and CUDA starts blocks in index order. The Hopper backward's
// deterministic mode without a causal mask orders each unit's adds by a rotation inside bands of
// key blocks instead (hopper::DqTurns in hopper/bwd_order.h): the wait targets differ, the
// counters are these.
#pragma once

#include <cstdint>

namespace flashcos::cuda {

// Counters per head: one per 16 rows, and a spare, so that a unit of 64 rows whose two column halves
// are ordered separately (the Hopper backward's 64-row steps: counters r0 / 16 and r0 / 16 + 1) has
// both for a last unit of 16 rows or fewer too. The buffer holds B x H x dq_counters_per_head(I).
__host__ __device__ __forceinline__ int64_t dq_counters_per_head(int64_t I) { return (I + 15) / 16 + 1; }

// The counter of the unit whose first row is r0 (a multiple of 16) in head (b, h).
__device__ __forceinline__ int* dq_unit_counter(int* base, int b, int H, int h, int I, int r0) {
  return base + (int64_t(b) * H + h) * dq_counters_per_head(I) + r0 / 16;
}

// Spins until *counter >= target (acquire), sleeping sleep_ns between loads (dq_finish.cuh's waits,
// which may last the whole backward, sleep longer).
__device__ __forceinline__ void dq_unit_wait(const int* counter, int target, unsigned sleep_ns = 64) {
  for (;;) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
    if (v >= target) return;
    __nanosleep(sleep_ns);
  }
}

__device__ __forceinline__ void dq_unit_done(int* counter, int count = 1) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(counter), "r"(count) : "memory");
}

}  // namespace flashcos::cuda
