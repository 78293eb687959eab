// dq = f dq_accum in the inputs' type (fp16 / bf16): the 16-bit backward's last kernel when the caller
// asks for dq so (BwdParams::dq_out), in place of a separate copy by the caller. f (launch_dq_finish's
// `scale`): 1, or the softmax scale where the backward left it out of dq_accum (the Hopper fp16 80-row
// steps, hopper::bwd_dq_unscaled).
//
//   dq_accum, dq_out (B, H, I, D) contiguous. The query heads of kv head hkv of batch b,
//   hkv g .. hkv g + g - 1 (g = H / Hkv), are one contiguous range of R = g I D elements: range
//   hb = b Hkv + hkv starts at element hb R. Items: chunks of kChunk elements, range by range; a
//   thread converts 4 float4 of an item (16-byte loads from L2, ld.global.cg; 8-byte stores).
//
// Two ways to launch (launch_dq_finish):
// * plain, after the backward (expected 0): CTA x converts items x, x + grid, ...
// * overlapped (expected > 0, the Hopper backward with p.dq_done): the backward's dQ warps count
//   each CTA's completed adds into its range's counter p.dq_done[hb] (2 per CTA), and this kernel is
//   launched behind it with programmatic dependent launch (attention/common/cuda/pdl.cuh), which the
//   backward's CTAs allow as they start. So its CTAs take the SMs that the backward's last wave
//   leaves idle, and go through their items (x, x + grid, ...: range by range, in the order the
//   backward finishes them) as the ranges are done: before the first item of a range, thread 0
//   waits until the range's counter reaches `expected` (dq_semaphore.cuh's wait and count: acquire
//   loads against the backward's release adds, made once its reductions completed).
//   Each CTA ends in griddepcontrol.wait, so that this kernel completes after the backward: the
//   stream's next kernel may read dk and dv.
// H100 (runs W2, W3 of 2026-11-27; docs/performance.md, "The backward's dq conversion"): the copy
// this replaces took 61-62 us at bf16 b4 h8 d 128 n 8192 (ncu), this kernel alone 64-67 us; the
// overlapped backward's median was 0.0-3.2 % below the copy's in each of 8 bf16 cases.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/common/cuda/device_attribute.h"
#include "attention/common/cuda/mma.cuh"  // pack2
#include "attention/common/cuda/env_switch.h"
#include "attention/common/cuda/pdl.cuh"
#include "attention/cosine/cuda/dq_semaphore.cuh"  // dq_unit_wait
#include "attention/cosine/cuda/params.h"

namespace flashcos::cuda {

constexpr int kDqFinishThreads = 256;
constexpr int kDqFinishVecs = 4;  // float4 per thread and item
constexpr int64_t kDqFinishChunk = int64_t(kDqFinishThreads) * kDqFinishVecs * 4;

template <typename T>
__global__ void __launch_bounds__(kDqFinishThreads) dq_finish_kernel(const BwdParams p, int expected, float f) {
  const int64_t range = int64_t(p.H / p.Hkv) * p.I * p.D;  // a multiple of 4: D is
  // Item counts fit 32 bits (the launcher checks): 32-bit divisions in the loop.
  const uint32_t per_range = uint32_t((range + kDqFinishChunk - 1) / kDqFinishChunk);
  const uint32_t items = uint32_t(p.B) * uint32_t(p.Hkv) * per_range;
  const float* acc = static_cast<const float*>(p.dq_accum);
  T* out = static_cast<T*>(p.dq_out);
  int64_t ready = -1;  // the last range seen done
  for (uint32_t item = blockIdx.x; item < items; item += gridDim.x) {
    const uint32_t hb = item / per_range;
    if (expected > 0 && hb != ready) {
      if (threadIdx.x == 0) dq_unit_wait(p.dq_done + hb, expected, 1000);
      __syncthreads();
      ready = hb;
    }
    const int64_t end = (int64_t(hb) + 1) * range;
    const int64_t e0 = int64_t(hb) * range + int64_t(item - hb * per_range) * kDqFinishChunk + 4 * int64_t(threadIdx.x);
    float4 v[kDqFinishVecs];
#pragma unroll
    for (int j = 0; j < kDqFinishVecs; ++j) {
      const int64_t e = e0 + int64_t(j) * 4 * kDqFinishThreads;
      if (e < end) v[j] = __ldcg(reinterpret_cast<const float4*>(acc + e));
    }
#pragma unroll
    for (int j = 0; j < kDqFinishVecs; ++j) {
      const int64_t e = e0 + int64_t(j) * 4 * kDqFinishThreads;
      if (e < end) {
        uint2 w;
        w.x = pack2<T>(f * v[j].x, f * v[j].y);
        w.y = pack2<T>(f * v[j].z, f * v[j].w);
        *reinterpret_cast<uint2*>(out + e) = w;
      }
    }
  }
  pdl::wait_for_previous_grid();
}

// Launches dq_finish_kernel for p (p.dq_accum complete once the stream's earlier work is: expected
// 0; or counted by the kernel just launched: expected adds per range, see the header).
// FLASHCOS_DQ_FINISH_PDL=0: the counted kernel launched plainly (for comparisons).
template <typename T>
cudaError_t launch_dq_finish(const BwdParams& p, int expected, cudaStream_t stream, float scale = 1.f) {
  if (p.dq_out == nullptr || p.dq_accum == nullptr) return cudaErrorInvalidValue;
  if (p.D % 4 != 0 || p.Hkv < 1 || p.H % p.Hkv != 0 || (expected > 0 && p.dq_done == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t range = int64_t(p.H / p.Hkv) * p.I * p.D;
  const int64_t items = int64_t(p.B) * p.Hkv * ((range + kDqFinishChunk - 1) / kDqFinishChunk);
  if (items == 0) return cudaSuccess;
  if (items + int64_t(8) * 1024 * 1024 > int64_t(UINT32_MAX)) return cudaErrorInvalidValue;  // 32-bit item indices
  int sms = 0;
  const cudaError_t attr = current_device_sm_count(&sms);
  if (attr != cudaSuccess) return attr;
  static const bool pdl_on = env_switch_on("FLASHCOS_DQ_FINISH_PDL");
  const bool overlap = pdl_on && expected > 0;
  // Overlapped: few enough CTAs that all of them fit on the SMs the last wave leaves (the backward
  // holds a whole SM's registers per CTA), since a CTA that starts only after the backward also
  // converts heads done long before.
  const int64_t cap = int64_t(sms) * (overlap ? 4 : 8);
  const int64_t grid = items < cap ? items : cap;
  return pdl::launch<dq_finish_kernel<T>>(overlap, dim3(unsigned(grid)), dim3(kDqFinishThreads), stream, p, expected, scale);
}

}  // namespace flashcos::cuda
