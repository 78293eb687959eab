// What the Hopper backward's consumers (bwd_hopper_ws.cuh) write to memory besides dS:
//   stage_dq_rows / stage_dq_transposed  their dQ part of a step into a staging tile, which the
//     producer's dQ warp adds to the fp32 accumulator by TMA reductions (bwd_producer.cuh,
//     bwd_dq_reduce); bwd_dq_unscaled says whether that part carries the softmax scale;
//   store_dk_dv  dK and dV of their 64 keys, once, from the registers that summed them;
//   store_dk_dv_rows  the same through shared memory in whole rows (80-row steps);
//   split_gather a piece of a split block (split_tail.h): its dK / dV parts to its slot, and in the
//     piece that counts last the sum of every piece's.
// The staging tile is two SW128 boxes of Tile::kDqRows rows x 32 fp32 columns: row r's
// 16-byte chunk c at r 128 + (c ^ (r % 8)) 16, the layout of the accumulator's tensor map
// (make_f32_sw128_map). The wgmma accumulator layout (wgmma.cuh): d[4 j + 2 e0 + h] is row
// 16 warp + g + 8 e0, column 8 j + 2 t + h (g = lane / 4, t = lane % 4).
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "attention/cosine/cuda/hopper/split_tail.h"
#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/params.h"

namespace flashcos::cuda::hopper {

// Whether the kernel folds the softmax scale into dS before its rounding (dS' = scale dS, D_i scaled
// by the producer), so that dQ = dS' K and dK = dS'^T Q need no multiply: bf16 (same relative
// rounding, bf16 has fp32's range); fp16 keeps dS unscaled, where scale dS could pass 65504.
template <typename T>
constexpr bool bwd_folds_scale() {
  return std::is_same_v<T, __nv_bfloat16>;
}

// Whether the kernel stages dQ without the softmax scale, leaving it to dq_out's conversion
// (launch_dq_finish's `scale`): where dS is unscaled (!bwd_folds_scale, fp16) in 80-row steps (kDqT),
// so that stage_dq_transposed takes no multiply (40 a thread and step). Where the caller keeps
// dq_accum (no dq_out), the launcher hands the scale to it (BwdParams::dq_scale_left).
template <typename T, bool kDqT>
constexpr bool bwd_dq_unscaled() {
  return kDqT && !bwd_folds_scale<T>();
}

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

// dK (times dk_scale) and dV (times dv_scale) of this thread's two keys, col0 and col0 + 8 (accumulator
// rows g, g + 8 of the warp's 16), to T; keys past J and columns past a head dim below D (padding) not stored.
template <typename T, int D>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const float (&rdK)[D / 2], const float (&rdV)[D / 2],
                                            float dk_scale, float dv_scale, int b, int hkv, int col0, int t) {
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
      *reinterpret_cast<uint32_t*>(gdV + dt * 8 + 2 * t) =
          pack2<T>(rdV[4 * dt + 2 * e0] * dv_scale, rdV[4 * dt + 2 * e0 + 1] * dv_scale);
    }
  }
}

// 80-row steps (Tile::kDqT): the same stores through shared memory, in whole 128-byte rows. `region`
// [0] / [1]: this consumer's key block (c) of the two dS buffers, 64 of their kBM rows x 128 bytes
// each, free once both consumers' dQ(last) and dQ(last - 1) have read them (the caller waits), and
// written again only by this consumer's next dS (after the barrier at the end here). dK, then dV:
// columns 64 hf .. 64 hf + 63 into region[hf], 16-byte chunk j of key row r at r 128 + (j ^ (r % 8)) 16
// (common.cuh's sw128_offset layout, written out: the helper's signed arithmetic cost this instance
// 48 instructions) by stmatrix (8 a thread, free of bank conflicts); the consumer's named barrier
// `bar`; then 16-byte chunks to global memory, 8 lanes a key row (the direct stores write 16 bytes a
// row per warp instruction: 4x the instructions, twice the sectors). dK / dV rows are 16-byte aligned
// (BwdParams::dk: cuda_ops.cpp allocates dk and checks a caller's dv_out).
template <typename T, int D>
__device__ __forceinline__ void store_dk_dv_rows(const BwdParams& p, const float (&rdK)[D / 2],
                                                 const float (&rdV)[D / 2], float dk_scale, float dv_scale, int b,
                                                 int hkv, int key0, const uint32_t (&region)[2], int bar,
                                                 int warp, int lane, int ctid) {
  static_assert(D == 128, "two 64-column halves");
  const uint32_t row_x = uint32_t(16 * warp + 8 * ((lane / 8) % 2) + lane % 8) * 128;  // this lane's stmatrix row
  const int r_out = ctid / 8, j_out = ctid % 8;  // its first 16-byte chunk out (rows r_out + 16 i)
#pragma unroll
  for (int kv = 0; kv < 2; ++kv) {
    const float(&acc)[D / 2] = kv == 0 ? rdK : rdV;
    const float sc = kv == 0 ? dk_scale : dv_scale;
#pragma unroll
    for (int dt0 = 0; dt0 < D / 8; dt0 += 2) {
      // Matrices (rows 0-7 / 8-15 of the warp's 16 keys) x (column groups dt0, dt0 + 1).
      const uint32_t j = uint32_t(dt0 % 8 + lane / 16);
      stmatrix_x4(region[dt0 / 8] + row_x + ((j ^ uint32_t(lane % 8)) << 4),
                  pack2<T>(acc[4 * dt0] * sc, acc[4 * dt0 + 1] * sc),
                  pack2<T>(acc[4 * dt0 + 2] * sc, acc[4 * dt0 + 3] * sc),
                  pack2<T>(acc[4 * dt0 + 4] * sc, acc[4 * dt0 + 5] * sc),
                  pack2<T>(acc[4 * dt0 + 6] * sc, acc[4 * dt0 + 7] * sc));
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
    T* base = static_cast<T*>(kv == 0 ? p.dk : p.dv) +
              (kv == 0 ? b * p.dk_b_stride + hkv * p.dk_h_stride : b * p.dv_b_stride + hkv * p.dv_h_stride);
    const int64_t j_stride = kv == 0 ? p.dk_j_stride : p.dv_j_stride;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int hf = i / 4, r = r_out + 16 * (i % 4), col = 64 * hf + 8 * j_out;
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(region[hf] + uint32_t(r) * 128 + (uint32_t(j_out ^ (r % 8)) << 4)));
      if (key0 + r < p.J && col < p.D) *reinterpret_cast<uint4*>(base + int64_t(key0 + r) * j_stride + col) = v;
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
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
