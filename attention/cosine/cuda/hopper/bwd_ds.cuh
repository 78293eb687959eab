// dS of the Hopper backward's step (bwd_hopper_ws.cuh), per consumer thread: its N accumulators of
// dP^T (fp32), the 16-bit P^T that dV reads (packed A fragments, N / 8 k-steps of 4 words) and its
// rows' D_i (rD[2 (i / 4) + i % 2] for accumulator i), into dS^T's A fragments:
//   dS = P (dP s - D_i)        s = ds_scale (bf16 folds the softmax scale in; D_i then carries it)
// Two ways, by what the caller's instance allows:
//   ds_fp32     unpack P to fp32 and multiply, in place in rdP (which kBias's dbias reads before the
//               caller packs it, rounding once, with acc_to_frag);
//   ds_paired   bf16 (kPairDs): dP s - D_i rounded to bf16, times the packed P by one bf16x2 multiply
//               per pair (two roundings, no unpacking; bf16 has fp32's range, nothing can overflow).
// fp16 keeps ds_fp32: dP - D_i rounded to fp16 can overflow (|dP - D_i| > 65504) where P (dP - D_i)
// does not. The paired product with an overflow check and a fallback to ds_fp32 per thread was tried
// and not kept (no faster: docs/kernels-tried.md, "Versions tried" 21); the test
// FusedAttentionMisc.Fp16BackwardLargeDpMinusD holds the range.
#pragma once

#include <cstdint>

#include "attention/common/cuda/mma.cuh"  // pack2, unpack2
#include "attention/cosine/cuda/hopper/common.cuh"

namespace flashcos::cuda::hopper {

// In place: rdP[i] = P_i (rdP[i] s - D_i) in fp32.
template <typename T, int N>
__device__ __forceinline__ void ds_fp32(float (&rdP)[N], const uint32_t (&rPf)[N / 8][4], const float (&rD)[N / 2],
                                        float ds_scale) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float2 pp = unpack2<T>(rPf[i / 8][(i % 8) / 2]);
    rdP[i] = (i % 2 ? pp.y : pp.x) * fmaf(rdP[i], ds_scale, -rD[2 * (i / 4) + i % 2]);
  }
}

// bf16: word j of k-step kk is elements i = 8 kk + 2 j, i + 1 (rows i / 4 pairs).
template <int N>
__device__ __forceinline__ void ds_paired(uint32_t (&rdSf)[N / 8][4], const float (&rdP)[N],
                                          const uint32_t (&rPf)[N / 8][4], const float (&rD)[N / 2], float ds_scale) {
#pragma unroll
  for (int kk = 0; kk < N / 8; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 8 * kk + 2 * j;
      rdSf[kk][j] = mul_bf16x2(pack2<__nv_bfloat16>(fmaf(rdP[i], ds_scale, -rD[2 * (i / 4)]),
                                                     fmaf(rdP[i + 1], ds_scale, -rD[2 * (i / 4) + 1])),
                               rPf[kk][j]);
    }
}

}  // namespace flashcos::cuda::hopper
