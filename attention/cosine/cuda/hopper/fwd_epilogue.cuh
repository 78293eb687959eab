// The Hopper forward's epilogue (fwd_hopper_ws.cuh): a thread's two rows of O / l,
// written in pairs straight from the wgmma accumulators (layout: wgmma.cuh), and the row sums the
// backward needs; with the split tail (split_tail.h), the pieces' parts added first:
//   O = sum_k O_k, lt = sum_k lt_k   over the pieces k of a row block's key blocks, in piece order
// (the fixed offset only: every piece's P has the same scale, so the parts add as they are).
//   o_r = O_r / l_r  (l_r = the row sum of the 16-bit P; 0 for an empty row; 1 for the exp kind)
//   l (saved) = the fp32 sum of the unrounded P of the row, without the fp16 kernels' 2^15 shift, or
//               with kOnline lt 2^m (m the row max in log2 units; -inf and l = 0 for an empty row):
//               the sum of exp(scale (q.k - 1) + bias), what the sm_80 kernel saves
#pragma once

#include "attention/cosine/cuda/fwd_kernel.cuh"
#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/hopper/split_tail.h"

namespace flashcos::cuda::hopper {

// Keeps the compiler from reusing A-fragment registers that an asynchronous wgmma may still read.
template <int K>
__device__ __forceinline__ void hold_frags(uint32_t (&frag)[K][4]) {
#pragma unroll
  for (int kk = 0; kk < K; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(frag[kk][e])::"memory");
}

// Rows row0 and row0 + 8 of head (b, h): l[e0] is row e0's normaliser, lt[e0] its fp32 sum of the
// unrounded P (quad_sum of the threads' parts), rM[e0] its running max (kOnline only).
template <typename T, int D, bool kOnline, int kRegs>
__device__ __forceinline__ void store_fwd_rows(const FwdParams& p, const float (&rO)[kRegs], const float (&l)[2],
                                               const float (&lt)[2], const float (&rM)[2], int b, int h, int row0,
                                               int t) {
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const int r = row0 + 8 * e0;
    if (r >= p.I) continue;
    const float inv = p.exp_kind ? 1.f : (l[e0] > 0.f ? 1.f / l[e0] : 0.f);
    T* gO = static_cast<T*>(p.o) + b * p.o_b_stride + h * p.o_h_stride + int64_t(r) * p.o_i_stride;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      if (dt * 8 < p.D)  // a head dim below the kernel's D: the padding columns are not stored
        *reinterpret_cast<uint32_t*>(gO + dt * 8 + 2 * t) =
            pack2<T>(rO[4 * dt + 2 * e0] * inv, rO[4 * dt + 2 * e0 + 1] * inv);
    if (t == 0 && p.l != nullptr)
      static_cast<float*>(p.l)[(int64_t(b) * p.H + h) * p.I + r] =
          kOnline ? lt[e0] * exp2f(rM[e0]) : lt[e0] * exp2f(-kFwdShiftLog2<T>);
  }
}

// The floats of one piece's slot (FwdParams::split_scratch): kRegs O accumulators and 2 row-sum parts
// for each of the 128 kWG consumer threads.
constexpr int fwd_split_slot_floats(int kRegs, int kWG) { return (kRegs + 2) * 128 * kWG; }

// A piece of a split block, the 128 kWG consumer threads (ctid = tid - 128): its unnormalised O and
// the thread's row-sum parts rLt (fp32) to its slot of p.split_scratch (float i of thread ctid at
// i 128 kWG + ctid: the warps' stores and loads coalesced), then one count on the block's counter
// (split_counted_last, common.cuh; as split_gather, bwd_stores.cuh). False for every piece but the
// one that counted last; in that one rO / rLt become the sums of the pieces' parts in piece order
// (its own read back as this thread stored it), whichever piece finished last. `flag`: an int of
// shared memory; kBar: a named barrier the consumers alone use.
template <int kWG, int kBar, int kRegs>
__device__ __forceinline__ bool fwd_split_gather(const FwdParams& p, const SplitPiece& piece, float (&rO)[kRegs],
                                                 float (&rLt)[2], int ctid, int* flag) {
  constexpr int kThreads = 128 * kWG, kSlot = fwd_split_slot_floats(kRegs, kWG);
  float* slots = p.split_scratch + int64_t(piece.slot) * piece.pieces * kSlot + ctid;
  float* mine = slots + int64_t(piece.piece) * kSlot;
#pragma unroll
  for (int i = 0; i < kRegs; ++i) mine[i * kThreads] = rO[i];
  mine[kRegs * kThreads] = rLt[0];
  mine[(kRegs + 1) * kThreads] = rLt[1];
  if (!split_counted_last<kBar, kThreads>(p, piece, ctid, flag)) return false;
  auto sum = [&](int i) {
    float x = __ldcg(slots + i * kThreads);
#pragma unroll 1
    for (int k = 1; k < piece.pieces; ++k) x += __ldcg(slots + int64_t(k) * kSlot + i * kThreads);
    return x;
  };
#pragma unroll
  for (int i = 0; i < kRegs; ++i) rO[i] = sum(i);
  rLt[0] = sum(kRegs);
  rLt[1] = sum(kRegs + 1);
  return true;
}

}  // namespace flashcos::cuda::hopper
