// What the Hopper backward's consumers (bwd_hopper_ws.cuh) write to memory besides dS:
//   stage_dq_rows / stage_dq_transposed  their dQ part of a step into a staging tile, which the
//     producer's dQ warp adds to the fp32 accumulator by TMA reductions (bwd_producer.cuh,
//     bwd_dq_reduce);
//   store_dk_dv  dK and dV of their 64 keys, once, from the registers that summed them;
//   split_gather a piece of a split block (split_tail.h): its dK / dV parts to its slot, and in the
//     piece that counts last the sum of every piece's.
// The staging tile is two SW128 boxes of Tile::kDqRows rows x 32 fp32 columns: row r's
// 16-byte chunk c at r 128 + (c ^ (r % 8)) 16, the layout of the accumulator's tensor map
// (make_f32_sw128_map). The wgmma accumulator layout (wgmma.cuh): d[4 j + 2 e0 + h] is row
// 16 warp + g + 8 e0, column 8 j + 2 t + h (g = lane / 4, t = lane % 4).
#pragma once

#include "attention/cosine/cuda/hopper/split_tail.h"
#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/params.h"

namespace flashcos::cuda::hopper {

// dQ = dS K as rows x columns (64 rows, this consumer's 64 columns): each thread's column pairs are
// adjacent, one 8-byte store per pair. kFixed (the deterministic grid): each value rounded to its
// row's grid first, (x + c) - c with c = grid_c[e0] (not fused or reassociated: attention/cosine/dq_grid.h).
template <typename Tile, bool kFixed>
__device__ __forceinline__ void stage_dq_rows(unsigned char* tile, const float (&rdQ)[Tile::kDqRegs], float scale,
                                              const float (&grid_c)[2], int warp, int g, int t) {
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const int r = warp * 16 + g + 8 * e0;
#pragma unroll
    for (int i = 0; i < Tile::kDqRegs / 4; ++i) {
      const int cb = 8 * (i % 4) + 2 * t;  // column inside the 32-column box i / 4
      float x0 = rdQ[4 * i + 2 * e0] * scale, x1 = rdQ[4 * i + 2 * e0 + 1] * scale;
      if constexpr (kFixed) {
        x0 = __fadd_rn(__fadd_rn(x0, grid_c[e0]), -grid_c[e0]);
        x1 = __fadd_rn(__fadd_rn(x1, grid_c[e0]), -grid_c[e0]);
      }
      *reinterpret_cast<float2*>(tile + (i / 4) * Tile::kDqBoxBytes + r * kSw128Row + (((cb / 4) ^ (r % 8)) * 16) +
                                 (cb % 4) * 4) = make_float2(x0, x1);
    }
  }
}

// dQ^T = K^T dS^T (80-row steps, Tile::kDqT): accumulator row warp 16 + g + 8 e0 is column cb + 8 e0
// of box warp / 2 (cb = (warp % 2) 16 + g), accumulator column 8 i + 2 t + h is tile row r = 8 i + 2 t
// + h, at r 128 + (((cb + 8 e0) / 4) ^ (r % 8)) 16 + (cb % 4) 4: one address per (e0, h) plus 1024 i.
// Scalar 32-bit shared stores (a thread's pairs are not adjacent in the tile; generic addresses per
// store made the consumers spill 200 bytes). No kFixed variant: the deterministic instances keep
// 64-row steps (rounding to the grid here needs 20 rows' constants a thread; read where they were
// used, they made that backward 4-7 % slower than with 64 rows, run AA4).
template <typename Tile>
__device__ __forceinline__ void stage_dq_transposed(unsigned char* tile, const float (&rdQ)[Tile::kDqRegs], float scale,
                                                    int warp, int g, int t) {
  const int cb = (warp % 2) * 16 + g;
  const uint32_t box = smem_addr(tile) + (warp / 2) * Tile::kDqBoxBytes + (cb % 4) * 4;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = 2 * t + hh;
    const uint32_t a0 = box + r * kSw128Row + (((cb / 4) ^ r) * 16);
    const uint32_t a1 = box + r * kSw128Row + (((cb / 4 + 2) ^ r) * 16);
#pragma unroll
    for (int i = 0; i < Tile::kDqRegs / 4; ++i) {
      st_shared_f32(a0 + i * 8 * kSw128Row, rdQ[4 * i + hh] * scale);
      st_shared_f32(a1 + i * 8 * kSw128Row, rdQ[4 * i + 2 + hh] * scale);
    }
  }
}

// dK (times dk_scale) and dV of this thread's two keys, col0 and col0 + 8 (accumulator rows g, g + 8
// of the warp's 16), to T; keys past J and columns past a head dim below D (padding) not stored.
template <typename T, int D>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const float (&rdK)[D / 2], const float (&rdV)[D / 2],
                                            float dk_scale, int b, int hkv, int col0, int t) {
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const int col = col0 + 8 * e0;
    if (col >= p.J) continue;
    T* gdK = static_cast<T*>(p.dk) + b * p.dk_b_stride + hkv * p.dk_h_stride + int64_t(col) * p.dk_j_stride;
    T* gdV = static_cast<T*>(p.dv) + b * p.dv_b_stride + hkv * p.dv_h_stride + int64_t(col) * p.dv_j_stride;
    const int store_cols = p.D < D ? p.D : D;  // kept out of the common case's loop
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      if (dt * 8 >= store_cols) break;
      *reinterpret_cast<uint32_t*>(gdK + dt * 8 + 2 * t) =
          pack2<T>(rdK[4 * dt + 2 * e0] * dk_scale, rdK[4 * dt + 2 * e0 + 1] * dk_scale);
      *reinterpret_cast<uint32_t*>(gdV + dt * 8 + 2 * t) = pack2<T>(rdV[4 * dt + 2 * e0], rdV[4 * dt + 2 * e0 + 1]);
    }
  }
}

// A piece of a split block (split_tail.h), the 256 consumer threads (ctid = tid - 128): its dK / dV
// parts (fp32, unscaled) to its slot of p.split_scratch (float i of thread ctid at i 256 + ctid: the
// warps' stores and loads coalesced), then one count on the block's counter (split_counted_last,
// common.cuh). False for every piece but the one that counted last; in that one rdK / rdV become the
// sum of the pieces' slots in piece order (its own read back, as this thread stored it), so that the
// sum does not depend on which piece finished last. `flag`: an int of shared memory the consumers no
// longer use.
template <int D>
__device__ __forceinline__ bool split_gather(const BwdParams& p, const SplitPiece& piece, float (&rdK)[D / 2],
                                             float (&rdV)[D / 2], int ctid, int* flag) {
  constexpr int kSlot = 256 * D;
  float* slots = p.split_scratch + int64_t(piece.slot) * piece.pieces * kSlot + ctid;
  float* mine = slots + int64_t(piece.piece) * kSlot;
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    mine[i * 256] = rdK[i];
    mine[(D / 2 + i) * 256] = rdV[i];
  }
  if (!split_counted_last<4, 256>(p, piece, ctid, flag)) return false;
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    float k = __ldcg(slots + i * 256), v = __ldcg(slots + (D / 2 + i) * 256);
    for (int j = 1; j < piece.pieces; ++j) {
      k += __ldcg(slots + int64_t(j) * kSlot + i * 256);
      v += __ldcg(slots + int64_t(j) * kSlot + (D / 2 + i) * 256);
    }
    rdK[i] = k;
    rdV[i] = v;
  }
  return true;
}

}  // namespace flashcos::cuda::hopper
