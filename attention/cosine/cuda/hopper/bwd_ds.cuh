// dS of the Hopper backward's step (bwd_hopper_ws.cuh), per consumer thread: its N accumulators of
// dP^T (fp32), the 16-bit P^T that dV reads (packed A fragments, N / 8 k-steps of 4 words) and its
// rows' D_i (rD[2 (i / 4) + i % 2] for accumulator i), into dS^T's A fragments:
//   dS = P (dP s - D_i)        s = ds_scale (bf16 folds the softmax scale in; D_i then carries it)
// Two ways, by what the caller's instance allows:
//   ds_fp32     unpack P to fp32 and multiply, in place in rdP (which kBias's dbias reads before the
//               caller packs it, rounding once, with acc_to_frag);
//   ds_paired   dP s - D_i rounded to T, times the packed P by one bf16x2 / f16x2 multiply per pair (two
//               roundings, no unpacking: 4 instructions a pair against ds_fp32's 7).
// bf16 pairs: it has fp32's range, nothing can overflow. fp16 pairs (the plain instances, not the exp
// kind: bwd_p_shift) with a fixed exponent shift, since dP - D_i rounded to fp16 can overflow (|dP -
// D_i| > 65504) where P (dP - D_i) does not: P is carried as P 2^kFp16PShift (the producer adds the
// shift to c_i; P <= 1 without the exp kind, so P 2^6 <= 64) and dP s - D_i as (dP - D_i) 2^-kFp16PShift
// (s = 2^-6, D_i scaled by the producer), whose product is P (dP - D_i) again; dV, which sums the shifted
// P, is scaled back as it is stored. Range: |dP - D_i| up to 65504 2^6 (4.2e6) instead of |P (dP - D_i)|
// up to 65504; FusedAttentionMisc.Fp16BackwardLargeDpMinusD (dP - D_i up to 2.7e5) holds it. Below
// |dP - D_i| = 2^-14 2^6 (0.0039) the shifted value is subnormal in fp16 (an absolute error up to 2^-19
// there); the shifted P, on the other hand, stays normal down to P = 2^-20 (ds_fp32's P: 2^-14).
// The paired fp16 product with an overflow check and a fallback to ds_fp32 per thread (no shift) was
// tried and not kept (no faster: docs/kernels-tried.md, "Versions tried" 21).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/common/cuda/mma.cuh"  // pack2, unpack2
#include "attention/cosine/cuda/hopper/common.cuh"

namespace flashcos::cuda::hopper {

inline constexpr int kFp16PShift = 6;

// The exponent shift of the 16-bit P in an instance that forms dS by pairs (kPairDs): kFp16PShift for
// fp16, 0 for bf16 (and where dS is formed in fp32).
template <typename T>
constexpr int bwd_p_shift(bool pair_ds) {
  return pair_ds && std::is_same_v<T, __half> ? kFp16PShift : 0;
}

// 2^-p_shift: what undoes the shift of P (dV, summed from the shifted P, is stored times it).
__host__ __device__ constexpr float bwd_p_unshift(int p_shift) {
  return 1.f / float(1 << p_shift);
}

// s of dS = P (dP s - D_i) as both sides use it: the consumers multiply dP by it, the producer stores
// D_i times it. The softmax scale where bf16 folds it into dS (fold_scale), else 2^-p_shift (1 but for
// fp16's shifted pairs).
__host__ __device__ constexpr float bwd_ds_scale(bool fold_scale, int p_shift, float softmax_scale) {
  return fold_scale ? softmax_scale : bwd_p_unshift(p_shift);
}

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

// Word j of k-step kk is elements i = 8 kk + 2 j, i + 1 (rows i / 4 pairs).
template <typename T, int N>
__device__ __forceinline__ void ds_paired(uint32_t (&rdSf)[N / 8][4], const float (&rdP)[N],
                                          const uint32_t (&rPf)[N / 8][4], const float (&rD)[N / 2], float ds_scale) {
#pragma unroll
  for (int kk = 0; kk < N / 8; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 8 * kk + 2 * j;
      rdSf[kk][j] = mul2<T>(
          pack2<T>(fmaf(rdP[i], ds_scale, -rD[2 * (i / 4)]), fmaf(rdP[i + 1], ds_scale, -rD[2 * (i / 4) + 1])),
          rPf[kk][j]);
    }
}

}  // namespace flashcos::cuda::hopper
