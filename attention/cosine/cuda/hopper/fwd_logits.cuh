// The Hopper forward's two logit extras (fwd_hopper_ws.cuh, kBias / kOnline), per consumer thread
// and key block of kBN keys, in the accumulator layout of wgmma.cuh: element i of the thread's
// block is row row0 + 8 ((i / 2) % 2), column n0 + (i / 4) 8 + 2 t + (i % 2).
//   * The attention bias (fwd_kernel.cuh's math): x = S scale log2e + offset, then
//     x = fmaf(bias, log2e, x) for the unmasked, causal-allowed, in-range elements. FwdBias loads a
//     block's bias (float32, (H, I, J) or (B, I, J), any strides) into registers before the caller
//     waits for S, so that the loads overlap the MMA; elements outside [0, I) x [0, causal limit or J)
//     are not read and load as 0 (fmaf(0, log2e, x) == x). The forward streams the whole bias once
//     (4 bytes per logit: more bytes than the MMAs can use, so its speed is the bias's bandwidth), so
//     FwdBias also asks L2 for the next block's rows one block ahead (prefetch, j stride 1 only).
//   * The online row max (fwd_kernel.cuh's kOnline): online_exp() turns a block's log2 logits
//     (-inf where P = 0) into P = exp2(x - m_use), with m the running row max (m_use = 0 while a
//     row has no finite logit), rescales the fp32 sum lt at once and returns alpha = exp2(m_old -
//     m_use), the factor for O and l, which the caller applies once the P V MMA that still adds
//     under the old max has completed.
#pragma once

#include <cstdint>

#include "attention/cosine/cuda/fwd_kernel.cuh"

namespace flashcos::cuda::hopper {

// The bias of one consumer thread's two rows (row0, row0 + 8).
template <int kBN>
struct FwdBias {
  const float* row[2];  // bias (row, column 2 t) of (b, h); the row is clamped to I - 1 (not read past I)
  int64_t j_stride;
  int col_end[2];  // columns >= col_end - 2 t are not read: J, or the causal limit r + J - I + 1; 0 past I
  bool vec2;       // float2 loads (j stride 1, J even, every row start 8-byte aligned)
  int t;

  __device__ __forceinline__ void init(const FwdParams& p, int b, int h, int row0, int t) {
    const float* base = static_cast<const float*>(p.bias) + int64_t(p.bias_batch_dim ? b : h) * p.bias_0_stride;
    j_stride = p.bias_j_stride;
    this->t = t;
    vec2 = p.bias_j_stride == 1 && p.J % 2 == 0 && p.bias_i_stride % 2 == 0 && p.bias_0_stride % 2 == 0 &&
           reinterpret_cast<uintptr_t>(p.bias) % 8 == 0;
#pragma unroll
    for (int e0 = 0; e0 < 2; ++e0) {
      const int r = row0 + 8 * e0;
      row[e0] = base + int64_t(min(r, p.I - 1)) * p.bias_i_stride + int64_t(2 * t) * p.bias_j_stride;
      const int end = p.causal ? min(p.J, r + p.J - p.I + 1) : p.J;
      col_end[e0] = r < p.I ? end - 2 * t : 0;
    }
  }

  // rB[i] = the bias of element i of the key block at n0 (0 where not read).
  __device__ __forceinline__ void load(float (&rB)[kBN / 2], int n0) const {
    if (vec2) {
#pragma unroll
      for (int e0 = 0; e0 < 2; ++e0) {
        const float* src = row[e0] + n0;
        const int lim = col_end[e0] - n0;
#pragma unroll
        for (int q = 0; q < kBN / 8; ++q) {
          // J even: column n0 + 8 q + 2 t < J implies its pair column is too.
          float2 v = make_float2(0.f, 0.f);
          if (8 * q < lim) v = __ldg(reinterpret_cast<const float2*>(src + 8 * q));
          rB[4 * q + 2 * e0] = v.x;
          rB[4 * q + 2 * e0 + 1] = v.y;
        }
      }
    } else {
#pragma unroll
      for (int e0 = 0; e0 < 2; ++e0) {
        const float* src = row[e0] + int64_t(n0) * j_stride;
        const int lim = col_end[e0] - n0;
#pragma unroll
        for (int q = 0; q < kBN / 8; ++q)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            rB[4 * q + 2 * e0 + e] = 8 * q + e < lim ? __ldg(src + int64_t(8 * q + e) * j_stride) : 0.f;
      }
    }
  }

  // L2 prefetch of the block at n0: thread t of a quad asks for the 128-byte line at column
  // n0 + 32 t of each of its two rows (the quad: the 512 bytes of the block's row); nothing past
  // the rows' column limits or past I.
  __device__ __forceinline__ void prefetch(int n0) const {
    if (j_stride != 1) return;
#pragma unroll
    for (int e0 = 0; e0 < 2; ++e0) {
      // Column n0 + 32 t (row[e0] is at column 2 t; col_end[e0] counts from there).
      const float* src = row[e0] + n0 + 30 * t;
      if (n0 + 30 * t < col_end[e0])
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src));
    }
  }
};

// kOnline, one key block: rS holds the log2 logits (-inf where P = 0); on return P = exp2(x - m_use)
// per row, rM the new running max, rLt (this thread's fp32 sums of the unrounded P) rescaled and
// increased by the block's P, and alpha[e0] the factor for the row's earlier O and l.
template <int N>
__device__ __forceinline__ void online_exp(float (&rS)[N], float (&rM)[2], float (&alpha)[2], float (&rLt)[2]) {
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    float tmax = -INFINITY;
#pragma unroll
    for (int q = 0; q < N / 4; ++q) tmax = fmaxf(tmax, fmaxf(rS[4 * q + 2 * e0], rS[4 * q + 2 * e0 + 1]));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float m_new = fmaxf(rM[e0], tmax);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no finite logit yet: P = 0
    alpha[e0] = fast_exp2(rM[e0] - m_use);                  // exp2(-inf) = 0 at the start
    rM[e0] = m_new;
    float lt = rLt[e0] * alpha[e0];
#pragma unroll
    for (int q = 0; q < N / 4; ++q)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pe = fast_exp2(rS[4 * q + 2 * e0 + e] - m_use);
        rS[4 * q + 2 * e0 + e] = pe;
        lt += pe;
      }
    rLt[e0] = lt;
  }
}

// ptxas moves a wgmma.wait_group up across straight-line code that does not use the wgmma's
// registers: in the overlapped loop it put the wait for P_{j-1} V_{j-1} ahead of the whole online
// softmax of block j (both waits back to back, no overlap left). A branch on the block's row sums
// ends the basic block after the exps, and the wait stays behind it. Never taken (lt >= 0, and NaN
// compares false); its body only has to be something the compiler keeps: a nanosleep is harmless
// even where it runs (a trap there made ptxas spill and serialise the wgmmas).
__device__ __forceinline__ void keep_ahead_of_wait(const float (&rLt)[2]) {
  if (rLt[0] + rLt[1] < 0.f) asm volatile("nanosleep.u32 0;\n" ::: "memory");
}

}  // namespace flashcos::cuda::hopper
