// Backward of cosine-sim attention on Hopper warpgroup MMAs (wgmma, sm_90a), fp16 / bf16, d 64 / 128.
//
// Same math and scratch as bwd_kernel.cuh (read its header first); a key mask or none, no bias
// (launch.cu sends that to the sm_80 kernels). One CTA owns kBN = 128 keys of one (b, kv head) and loops
// over every query head of the group and every block of kBM (128 for d 64, 64 for d 128) query
// rows. Warpgroup w owns keys 64w .. 64w + 63 and, per step it:
//   S^T = K_w Q^T, dP^T = V_w dO^T      wgmma, A (K-major) and B (K-major) from shared memory, as
//                                        two groups: P^T is computed while dP^T runs
//   P^T, dS^T = P^T (dP^T - D)           in registers (dV += P^T dO issued as soon as P^T is);
//                                        dS^T also to shared memory (swizzled, buffer it % 2)
//   dV += P^T dO, dK += dS^T Q           wgmma, A from registers, B = dO / Q N-major
//   dQ(it - 1) = dS(it - 1) K            wgmma, A = dS (M-major, the dS^T tile), B = K N-major;
//                                        128-row steps: rows 64w .. 64w + 63 of the tile,
//                                        64-row steps: every row, half the columns
// dQ needs both warpgroups' dS^T, so it runs a step late, and nothing else ties the warpgroups
// together: there is no CTA-wide barrier in the loop, and while one warpgroup computes P / dS or
// adds dQ to global memory the other's MMAs keep the tensor cores busy (warpgroup 1 starts half a
// step late). Synchronisation is by mbarriers:
//   * Q, dO, c_i, D_i in kStages = 3 stages, loaded by cp.async two steps ahead by all 256
//     threads; "full" counts their cp.async arrivals, "empty" the 256 threads done with the stage
//     (each thread arrives itself: it read c_i / D_i with plain loads);
//   * dS^T in two buffers; "ds_full" counts the 256 threads that stored step it's dS^T, "ds_empty"
//     the 8 warps whose dQ(it) MMA read it (buffer it % 2 is rewritten in step it + 2).
// dK, dV stay in registers for the whole loop (no atomics for grouped heads); dQ is added to the
// zeroed fp32 buffer with vector atomics (scale folded in). Timings of this and the earlier
// lockstep version: docs/kernels.md, "Hopper family".
#pragma once

#include <cstdlib>
#include <string>

#include "attention/cosine/cuda/bwd_kernel.cuh"
#include "attention/cosine/cuda/dq_semaphore.cuh"
#include "attention/cosine/cuda/hopper/bwd_hopper_ws.cuh"
#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/hopper/wgmma.cuh"

namespace flashcos::cuda::hopper {

template <int D, int BM>
struct BwdHopperTile {
  static_assert(D == 64 || D == 128, "the Hopper backward covers head dims 64 and 128");
  static_assert(BM == 64 || BM == 128, "64 or 128 query rows per step");
  static constexpr int kBN = 128;  // keys per CTA, 64 per warpgroup
  static constexpr int kBM = BM;   // query rows per step
  static constexpr int kThreads = 256;
  static constexpr int kStages = 3;  // Q / dO / c_i / D_i stages
  static constexpr bool kSplitRows = BM == 128;  // dQ: warpgroup w takes rows 64w.., else columns
  static constexpr int kNQ = kSplitRows ? D : D / 2;  // dQ columns per warpgroup
  static constexpr int kKBytes = kBN * D * 2;
  static constexpr int kQBytes = kBM * D * 2;
  // dS^T (keys x rows) as BM / 64 blocks of kBN keys x 128 bytes (64 rows), swizzled.
  static constexpr int kSBytes = kBN * kBM * 2;
  static constexpr int kBarriers = 2 * kStages + 4;
  static constexpr size_t kSmem = size_t(2) * kKBytes + 2 * kStages * size_t(kQBytes) + 2 * size_t(kSBytes) +
                                  2 * kStages * kBM * sizeof(float) + kBarriers * sizeof(uint64_t) + kSw128Atom;
};

// kDet: dq added in key-block order (p.dq_semaphore, dq_semaphore.cuh); its own instance, so that
// the default one keeps its registers (the ordering code made it spill).
template <typename T, int D, int BM, bool kDet>
__global__ void __launch_bounds__(BwdHopperTile<D, BM>::kThreads, 1) bwd_hopper_kernel(const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = BwdHopperTile<D, BM>;
  constexpr int kBN = Tile::kBN, kBM = Tile::kBM, kThreads = Tile::kThreads;
  constexpr int kKT = D / 16;
  constexpr int kMT = kBM / 16;
  constexpr int kNT = kBN / 16;
  constexpr bool kSplitRows = Tile::kSplitRows;
  constexpr int kNQ = Tile::kNQ;
  constexpr int kStages = Tile::kStages;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + kSw128Atom - 1) & ~uint32_t(kSw128Atom - 1)) - raw_addr);
  unsigned char* sK = smem;
  unsigned char* sV = sK + Tile::kKBytes;
  unsigned char* sQ = sV + Tile::kKBytes;              // kStages stages
  unsigned char* sdO = sQ + kStages * Tile::kQBytes;   // kStages stages
  unsigned char* sdS = sdO + kStages * Tile::kQBytes;  // 2 buffers
  float* sRowC = reinterpret_cast<float*>(sdS + 2 * Tile::kSBytes);  // (kStages, kBM)
  float* sDelta = sRowC + kStages * kBM;                             // (kStages, kBM)
  uint64_t* bar_full = reinterpret_cast<uint64_t*>(sDelta + kStages * kBM);
  uint64_t* bar_empty = bar_full + kStages;
  uint64_t* bar_ds_full = bar_empty + kStages;
  uint64_t* bar_ds_empty = bar_ds_full + 2;
  const uint32_t aK = smem_addr(sK), aV = smem_addr(sV), aQ = smem_addr(sQ), adO = smem_addr(sdO);
  const uint32_t adS = smem_addr(sdS);

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp = (tid % 128) / 32;
  const int g = lane / 4, t = lane % 4;
  // Linear grid. Causal: key block slowest, so that every (b, kv head)'s block 0, the one with
  // the most query rows, is dispatched first instead of the last (b, head)'s long CTAs trailing
  // the others (H100 bf16 causal n 4096: d64 1.05 -> 1.18x flash, d128 1.17 -> 1.28x). Not
  // causal: key block fastest, so that the CTAs running together share one (b, head)'s Q / dO in
  // L2 (key block slowest cost 10% at d64 n 16384).
  const int n_blocks = (p.J + kBN - 1) / kBN, heads_batches = p.Hkv * p.B;
  // Deterministic (kDet): key block slowest as well, so that the CTAs running together hold a few
  // key blocks of many heads, not every key block of one head: the chain of key blocks that add
  // into one dQ unit in turn (below) stays a few CTAs long.
  const bool block_slowest = p.causal || kDet;
  const unsigned slow = block_slowest ? unsigned(heads_batches) : unsigned(n_blocks);
  const int n_block = block_slowest ? int(blockIdx.x / slow) : int(blockIdx.x % slow);
  const int hb = block_slowest ? int(blockIdx.x % slow) : int(blockIdx.x / slow);
  const int hkv = hb % p.Hkv, b = hb / p.Hkv;
  const int group = p.H / p.Hkv;
  const int I = p.I, J = p.J, H = p.H;
  const int diag = J - I;
  const int n0 = n_block * kBN;
  const int wg_key0 = n0 + wg * 64;
  const int key_local0 = wg * 64 + warp * 16 + g;
  // This thread's two keys n0 + key_local0 + 8 e0: inside J and not masked out.
  const bool has_mask = p.mask != nullptr;
  bool key_ok[2];
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const int c = n0 + key_local0 + 8 * e0;
    key_ok[e0] = c < J && (!has_mask || p.mask[int64_t(b) * p.mask_b_stride + int64_t(c) * p.mask_j_stride]);
  }

  const T* gK = static_cast<const T*>(p.k) + b * p.k_b_stride + hkv * p.k_h_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_b_stride + hkv * p.v_h_stride;

  const int m_blocks = (I + kBM - 1) / kBM;
  const int m_start = p.causal ? max(0, n0 - diag) / kBM : 0;
  const int per_head = max(0, m_blocks - m_start);
  const int n_iters = group * per_head;
  const float scale_log2 = p.scale * kLog2e;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full + s, kThreads);
      mbar_init(bar_empty + s, kThreads);
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      mbar_init(bar_ds_full + s, kThreads);
      mbar_init(bar_ds_empty + s, kThreads / 32);
    }
  }
  __syncthreads();

  // Step it covers query head step_h(it), rows step_m0(it) ..: heads outer, row blocks inner.
  auto step_h = [&](int it) { return hkv * group + it / per_head; };
  auto step_m0 = [&](int it) { return (m_start + it % per_head) * kBM; };
  // Step it's Q, dO, c_i, D_i into `stage`, then this thread's arrival on the stage's full barrier.
  auto load_step = [&](int it, int stage) {
    const int h = step_h(it), m0 = step_m0(it);
    const T* gQ = static_cast<const T*>(p.q) + b * p.q_b_stride + h * p.q_h_stride;
    const T* gdO = static_cast<const T*>(p.dout) + b * p.do_b_stride + h * p.do_h_stride;
    load_tile_sw128<kBM, D, kThreads>(sQ + stage * Tile::kQBytes, gQ + int64_t(m0) * p.q_i_stride, p.q_i_stride,
                                      I - m0, gQ, tid);
    load_tile_sw128<kBM, D, kThreads>(sdO + stage * Tile::kQBytes, gdO + int64_t(m0) * p.do_i_stride,
                                      p.do_i_stride, I - m0, gdO, tid);
    load_row_stats_async<kBM>(sRowC + stage * kBM, sDelta + stage * kBM, p, b, h, m0, tid);
    mbar_arrive_cp_async(bar_full + stage);
  };

  load_tile_sw128<kBN, D, kThreads>(sK, gK + int64_t(n0) * p.k_j_stride, p.k_j_stride, J - n0, gK, tid);
  load_tile_sw128<kBN, D, kThreads>(sV, gV + int64_t(n0) * p.v_j_stride, p.v_j_stride, J - n0, gV, tid);
  if (n_iters > 0) load_step(0, 0);  // stage 0's barrier also covers K and V
  if (n_iters > 1) load_step(1, 1);

  float rdK[D / 2], rdV[D / 2], rdQ[kNQ / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) rdK[i] = rdV[i] = 0.f;
  uint32_t rPf[kMT][4], rdSf[kMT][4];

  // Deterministic (kDet): this warpgroup's rows (128-row steps) or columns (64-row steps) of a unit
  // go in after every lower key block's (dq_semaphore.cuh); named barrier 2 + wg is the
  // warpgroup's. The count of step it's adds waits until the next flush, when their fence finds
  // them long done (a fence right after them stalled every step: +36% backward time at d64 causal
  // n 8192); the next key block then trails this one by a step or two.
  auto unit_rows0 = [&](int it) { return step_m0(it) + (kSplitRows ? wg * 64 : 0); };
  auto count_unit = [&](int it) {
    if (unit_rows0(it) >= I) return;
    __threadfence();
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
    if (tid % 128 == 0) dq_unit_done(dq_unit_counter(p.dq_semaphore, b, H, step_h(it), I, unit_rows0(it)));
  };
  auto flush_dq = [&](int it) {
    const int h = step_h(it), m0 = step_m0(it);
    float* gdQ = static_cast<float*>(p.dq_accum) + (int64_t(b) * H + h) * I * D;
    const bool ordered = kDet && unit_rows0(it) < I;
    if (kDet && it > 0) count_unit(it - 1);
    if (ordered) {
      if (tid % 128 == 0)
        dq_unit_wait(dq_unit_counter(p.dq_semaphore, b, H, h, I, unit_rows0(it)), kSplitRows ? n_block : 2 * n_block);
      asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
    }
#pragma unroll
    for (int e0 = 0; e0 < 2; ++e0) {
      const int r = m0 + (kSplitRows ? wg * 64 : 0) + warp * 16 + g + 8 * e0;
      if (r >= I) continue;
#pragma unroll
      for (int i = 0; i < kNQ / 8; ++i)
        atomic_add2(gdQ + int64_t(r) * D + (kSplitRows ? 0 : wg * kNQ) + i * 8 + 2 * t, rdQ[4 * i + 2 * e0] * p.scale,
                    rdQ[4 * i + 2 * e0 + 1] * p.scale);
    }
  };
  // dQ(it) = dS(it) K: A = dS (rows M-major in dS^T buffer it % 2), B = K (N-major). 128-row
  // steps: this warpgroup's 64 rows (row block wg of the tile), every column; 64-row steps: every
  // row, half the columns (d 64: 64 bytes into the swizzled rows; d 128: the second column block).
  auto issue_dq = [&](int it) {
    const uint32_t s_off = (it & 1) * Tile::kSBytes + (kSplitRows ? wg * kBN * kSw128Row : 0);
    const uint32_t k_off = kSplitRows ? 0 : D == 64 ? wg * 64 : wg * kBN * kSw128Row;
#pragma unroll
    for (int kk = 0; kk < kNT; ++kk)
      Wgmma<T, kNQ>::template ss<1, 1>(rdQ, make_desc(adS + s_off + kk * 16 * kSw128Row, kBN * kSw128Row, kSw128Atom),
                                       make_desc(aK + k_off + kk * 16 * kSw128Row, kBN * kSw128Row, kSw128Atom),
                                       kk > 0);
  };

  int stage = 0;
  uint32_t phase = 0;
  for (int it = 0; it < n_iters; ++it) {
    const int m0 = step_m0(it);
    mbar_wait(bar_full + stage, phase);
    fence_proxy_async();
    if (it == 0 && wg == 1) named_bar_sync<1, kThreads>();  // start half a step after warpgroup 0
    const uint32_t aQs = aQ + stage * Tile::kQBytes, adOs = adO + stage * Tile::kQBytes;
    const float* sRowCs = sRowC + stage * kBM;
    const float* sDeltas = sDelta + stage * kBM;
    unsigned char* sdSb = sdS + (it & 1) * Tile::kSBytes;

    const bool elementwise = has_mask || wg_key0 + 64 > J || (p.causal && wg_key0 + 63 > m0 + diag);
    float rS[kBM / 2], rdP[kBM / 2];
    // acc = A_w B^T over the head dim: S^T (A = K, B = Q) or dP^T (A = V, B = dO); both K-major.
    auto issue_s_dp = [&](float (&acc)[kBM / 2], uint32_t a_base, uint32_t b_base) {
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk) {
        const uint32_t a_off = (kk / 4) * kBN * kSw128Row + wg * 64 * kSw128Row + (kk % 4) * 32;
        const uint32_t b_off = (kk / 4) * kBM * kSw128Row + (kk % 4) * 32;
        Wgmma<T, kBM>::template ss<0, 0>(acc, make_desc(a_base + a_off, 16, kSw128Atom),
                                         make_desc(b_base + b_off, 16, kSw128Atom), kk > 0);
      }
    };
    auto issue_kv_grad = [&](float (&acc)[D / 2], const uint32_t (&frag)[kMT][4], uint32_t b_base) {
#pragma unroll
      for (int kk = 0; kk < kMT; ++kk)
        Wgmma<T, D>::template rs<1>(acc, frag[kk], make_desc(b_base + kk * 16 * kSw128Row, kBM * kSw128Row, kSw128Atom),
                                    1);
    };
    auto store_ds = [&] {
#pragma unroll
      for (int e0 = 0; e0 < 2; ++e0) {
        const int kr = key_local0 + 8 * e0;
        unsigned char* row = sdSb + kr * kSw128Row + 4 * t;
#pragma unroll
        for (int kk = 0; kk < kMT; ++kk) {
          unsigned char* blk = row + (kk / 4) * kBN * kSw128Row;
          *reinterpret_cast<uint32_t*>(blk + ((((2 * kk) % 8) ^ (kr % 8)) * 16)) = rdSf[kk][e0];
          *reinterpret_cast<uint32_t*>(blk + ((((2 * kk + 1) % 8) ^ (kr % 8)) * 16)) = rdSf[kk][2 + e0];
        }
      }
    };
    // Two MMA groups (they complete in order): P^T is computed while dP^T runs, dS^T while dV runs.
    wgmma_fence();
    issue_s_dp(rS, aK, aQs);
    wgmma_commit();
    issue_s_dp(rdP, aV, adOs);
    wgmma_commit();
    wgmma_wait<1>();  // S^T
    fence_regs(rS);
#pragma unroll
    for (int i = 0; i < kBM / 2; ++i) {
      const int rl = (i / 4) * 8 + 2 * t + (i % 2);
      const float x = fmaf(rS[i], scale_log2, sRowCs[rl]);
      bool ok = true;
      if (elementwise) {
        const int c = n0 + key_local0 + 8 * ((i / 2) % 2);
        ok = key_ok[(i / 2) % 2] && (!p.causal || c <= m0 + rl + diag);
      }
      rS[i] = ok ? fast_exp2(x) : 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kMT; ++kk) acc_to_frag<T>(rPf[kk], rS, kk);
    wgmma_fence();
    issue_kv_grad(rdV, rPf, adOs);
    wgmma_commit();
    wgmma_wait<1>();  // dP^T (dV may still run)
    fence_regs(rdP);
    if (it == 0 && wg == 0) named_bar_arrive<1, kThreads>();
#pragma unroll
    for (int i = 0; i < kBM / 2; ++i) {
      const int rl = (i / 4) * 8 + 2 * t + (i % 2);
      rdP[i] = rS[i] * (rdP[i] - sDeltas[rl]);
    }
#pragma unroll
    for (int kk = 0; kk < kMT; ++kk) acc_to_frag<T>(rdSf[kk], rdP, kk);
    // dS^T(it) into buffer it % 2 once both warpgroups' dQ(it - 2) MMAs read it.
    if (it >= 2) mbar_wait(bar_ds_empty + (it & 1), ((it - 2) >> 1) & 1);
    store_ds();
    fence_proxy_async();
    mbar_arrive(bar_ds_full + (it & 1));
    wgmma_fence();
    issue_kv_grad(rdK, rdSf, aQs);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(rdV);
    fence_regs(rdK);
#pragma unroll
    for (int kk = 0; kk < kMT; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(rPf[kk][e]), "+r"(rdSf[kk][e])::"memory");
    mbar_arrive(bar_empty + stage);
    // dQ(it - 1) on its own, after dV / dK: issued with them it kept too many registers live
    // (spills, or serialised MMAs at d 128).
    if (it > 0) {
      // dQ(it - 1) needs the other warpgroup's dS^T(it - 1).
      mbar_wait(bar_ds_full + ((it - 1) & 1), ((it - 1) >> 1) & 1);
      wgmma_fence();
      issue_dq(it - 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(rdQ);
      __syncwarp();  // one arrival per warp: the MMA's reads are done, no thread's own accesses to order
      if (lane == 0) mbar_arrive(bar_ds_empty + ((it - 1) & 1));
      flush_dq(it - 1);
    }
    // Step it + 2 goes into the stage of step it - 1, once both warpgroups are done with it.
    if (it + 2 < n_iters) {
      const int ls = stage == 0 ? kStages - 1 : stage - 1;
      if (it >= 1) mbar_wait(bar_empty + ls, ((it - 1) / kStages) & 1);
      load_step(it + 2, ls);
    }
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  if (n_iters > 0) {
    const int last = n_iters - 1;
    mbar_wait(bar_ds_full + (last & 1), (last >> 1) & 1);
    wgmma_fence();
    issue_dq(last);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(rdQ);
    flush_dq(last);
    if (kDet) count_unit(last);
  }
  cp_async_wait<0>();

#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const int c = n0 + key_local0 + 8 * e0;
    if (c >= J) continue;
    T* gdK = static_cast<T*>(p.dk) + b * p.dk_b_stride + hkv * p.dk_h_stride + int64_t(c) * p.dk_j_stride;
    T* gdV = static_cast<T*>(p.dv) + b * p.dv_b_stride + hkv * p.dv_h_stride + int64_t(c) * p.dv_j_stride;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(gdK + dt * 8 + 2 * t) =
          pack2<T>(rdK[4 * dt + 2 * e0] * p.scale, rdK[4 * dt + 2 * e0 + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(gdV + dt * 8 + 2 * t) = pack2<T>(rdV[4 * dt + 2 * e0], rdV[4 * dt + 2 * e0 + 1]);
    }
  }
#endif
}

}  // namespace flashcos::cuda::hopper

namespace flashcos::cuda {

// Query rows per backward step by tile variant (attention/cosine/cuda/tuning.h): variant 0 is in use,
// d64 variant 1 is the 64-row step (H100 bf16 n8192, TFLOP/s: 128 rows 298, 64 rows 278;
// docs/kernels.md). d128 has one shape: 128-row steps spill heavily there.
template <int D>
constexpr int hopper_bwd_rows(int variant) {
  return D == 64 && variant != 1 ? 128 : 64;
}

// Which Hopper backward runs (FLASHCOS_HOPPER_BWD, read once): "ws" (default) the warp-specialised
// kernel (bwd_hopper_ws.cuh) with dQ added by the producer's TMA reductions, "ws-atomic" the same
// kernel with dQ added by the consumers' atomics, "cp" this file's cp.async kernel, which also runs
// where the TMA unit cannot address the inputs. H100 bf16 b4 h8 n 8192, backward TFLOP/s, d64 / d128
// non-causal: cp 308 / 363, ws-atomic 337 / 404, ws 347 / 432 (docs/kernels.md).
inline int hopper_bwd_kind() {
  static const int kind = [] {
    const char* env = std::getenv("FLASHCOS_HOPPER_BWD");
    const std::string s = env != nullptr ? env : "";
    return s == "cp" ? 0 : s == "ws-atomic" ? 1 : 2;
  }();
  return kind;
}

template <typename T, int D>
cudaError_t launch_bwd_hopper(const BwdParams& p, cudaStream_t stream) {
  {
    const cudaError_t err = launch_delta<T, float>(p, stream);
    if (err != cudaSuccess) return err;
  }
  [[maybe_unused]] static const int variant = tuning_variant("FLASHCOS_HOPPER_BWD_VARIANT");
  return FLASHCOS_VARIANT_SWITCH(variant, kV, [&] {
    constexpr int kBM = hopper_bwd_rows<D>(kV);
    if (const int kind = hopper_bwd_kind(); kind != 0) {
      const cudaError_t err = kind == 2 ? launch_bwd_hopper_ws<T, D, kBM, true>(p, stream)
                                        : launch_bwd_hopper_ws<T, D, kBM, false>(p, stream);
      if (err != cudaErrorNotSupported) return err;
    }
    using Tile = hopper::BwdHopperTile<D, kBM>;
    const int64_t blocks = (int64_t(p.J) + Tile::kBN - 1) / Tile::kBN * p.Hkv * p.B;
    if (blocks > int64_t(INT32_MAX)) return cudaErrorInvalidConfiguration;
    const dim3 grid{unsigned(blocks)};
    return p.dq_semaphore != nullptr
               ? launch_with_smem(hopper::bwd_hopper_kernel<T, D, kBM, true>, grid, Tile::kThreads, Tile::kSmem, stream, p)
               : launch_with_smem(hopper::bwd_hopper_kernel<T, D, kBM, false>, grid, Tile::kThreads, Tile::kSmem, stream, p);
  });
}

}  // namespace flashcos::cuda
