// Backward of cosine-sim attention on Hopper (sm_90a, wgmma), fp16 / bf16, d 64 / 128, warp
// specialised: a producer warp loads by TMA, two consumer warpgroups only compute.
//
// Same math and scratch as bwd_kernel.cuh (read its header first); a key mask or none, an
// attention bias or none (kBias: the bias added to the logits as the P is recomputed, dbias = dS by
// fp32 reductions into dbias_accum; both straight from / to global memory, 8 bytes per element, so
// that case is bound by memory, and its instances spill 200-650 bytes). One CTA (on a persistent grid each
// of its items) owns kBN = 128 keys of one (b, kv head) and
// loops over every query head of the group and every block of kBM query rows (d 64: 128; d 128: 80
// in the plain instance, 64 in the others). Consumer c owns keys n0 + 64 c .. n0 + 64 c + 63 and, per step it:
//   S^T = K_c Q^T, dP^T = V_c dO^T      wgmma, A (K-major) and B (K-major) from shared memory, as
//                                        two groups: P^T is computed while dP^T runs
//   P^T = exp2(S^T scale log2e + c_i)   in registers on every element, packed to 16-bit A
//                                        fragments, masked elements cleared there (only in blocks
//                                        with any); dV += P^T dO issued at once (A from registers,
//                                        B = dO N-major)
//   dS^T = P^T (dP^T - D_i)             (bf16: scale P^T (dP^T - D_i), so dQ / dK need no multiply)
//                                        from the 16-bit P that dV uses (by pairs, or unpacked from
//                                        its fragments: the fp32 P dies once packed, which is what
//                                        lets the consumers fit 240 registers; fp16 pairs carry P
//                                        2^6, bwd_ds.cuh), to shared memory
//                                        (swizzled, buffer it % 2); dK += dS^T Q (B = Q N-major)
//   dQ(it - 1) = dS(it - 1) K            wgmma, A = dS (M-major, the dS^T tile), B = K N-major;
//                                        128-row steps: rows 64c .. 64c + 63 of the tile, 64-row
//                                        steps: every row, half the columns; 80-row steps (m64
//                                        cannot cover 80 rows): dQ^T = K^T dS^T, half the columns
//                                        as M, dS stored rows x keys (stmatrix .trans)
// dQ needs both consumers' dS^T, so it runs a step late, and nothing else ties the consumers
// together: there is no CTA-wide barrier in the loop, and while one computes P / dS the other's
// MMAs keep the tensor cores busy (consumer 1 starts half a step late). dK, dV stay in registers for
// the whole loop (no atomics for grouped heads).
//
// The CTA's roles (warpgroup 0 the producer, 1 and 2 the consumers), the dQ path, the mbarriers and
// the modes (deterministic, split tail, persistent grid): bwd_producer.cuh's header.
// Timings of every version: docs/kernels-tried.md, "Timings of the versions". (Past 600 lines: the bias
// code moved into functions of a header of its own changed the biased instances' machine code, their
// backward 3-5 % slower at d 64, run AH5; so it stays inline.)
#pragma once

#include <cuda.h>

#include "attention/common/cuda/pdl.cuh"
#include "attention/cosine/cuda/bwd_kernel.cuh"
#include "attention/cosine/cuda/dq_semaphore.cuh"
#include "attention/cosine/cuda/hopper/bwd_ds.cuh"
#include "attention/cosine/cuda/hopper/bwd_stores.cuh"
#include "attention/cosine/cuda/hopper/bwd_timeline.cuh"
#include "attention/cosine/cuda/hopper/bwd_producer.cuh"
#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/hopper/tma.cuh"
#include "attention/cosine/cuda/hopper/wgmma.cuh"

namespace flashcos::cuda::hopper {

template <typename T, int D, int BM, bool kDet, bool kTmaDq, bool kDetAhead = false, bool kBias = false,
          bool kFixed = false, bool kDsFp32 = false, bool kPersist = false>
__global__ void __launch_bounds__(BwdWsTile<D, BM, kTmaDq>::kThreads, 1)
    bwd_hopper_ws_kernel(const __grid_constant__ BwdTmaMaps maps, const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = BwdWsTile<D, BM, kTmaDq>;
  constexpr int kBN = Tile::kBN, kBM = Tile::kBM;
  constexpr int kKT = D / 16;
  constexpr int kMT = kBM / 16;
  constexpr int kNT = kBN / 16;
  constexpr bool kSplitRows = Tile::kSplitRows;
  constexpr int kNQ = Tile::kNQ;
  constexpr int kStages = Tile::kStages;
  constexpr int kConsumerThreads = 256;
  // 80-row steps (Tile::kDqT): dQ^T = K^T dS^T (below); the plain instance only.
  constexpr bool kDqT = Tile::kDqT;
  static_assert(!kDqT || (kTmaDq && !kDet && !kBias && !kFixed), "80-row steps: the plain instance");
  // dK / dV through shared memory in whole rows (store_dk_dv_rows): 80-row steps (H200: bf16 +0.7 to
  // +0.9 % non-causal in run AJ2; fp16, on the loop without the dQ scale, +1.7 / +0.7 % non-causal n 8192
  // / 16384, -0.3 / +1.3 % causal in run AM1; docs/kernels-tried.md item 33).
  constexpr bool kRowStores = kDqT;
  constexpr bool kFoldScale = bwd_folds_scale<T>();  // bf16: the scale in dS (bwd_stores.cuh)
  constexpr bool kDqUnscaled = bwd_dq_unscaled<T, kDqT>();  // dQ without the scale (bwd_stores.cuh)
  // kPairDs: dS from one bf16x2 / f16x2 multiply per pair (bwd_ds.cuh); fp16 in the plain instances with
  // TMA dQ only (the deterministic ones and the atomic kind keep the fp32 product), with P carried as
  // P 2^kPShift and D_i as D_i 2^-kPShift (the producer shifts both; the launcher sends the exp kind,
  // whose P is not <= 1, to the kDsFp32 instance).
  constexpr bool kPairDs = !kBias && !kDsFp32 && (kFoldScale || (kTmaDq && !kDet && !kFixed));
  constexpr int kPShift = bwd_p_shift<T>(kPairDs);
  // The split tail (split_tail.h): the plain instance only.
  constexpr bool kMaySplit = kTmaDq && !kDet && !kBias && !kFixed;
  // kPersist: a persistent grid (the plain instance; every addition for it below sits behind
  // `if constexpr (kPersist)`, so that the other instances' code stays as it was (cuobjdump: equal but
  // for BwdParams' offsets or a few reordered instructions): moving their per-CTA values into an item
  // loop made the biased instances spill 4x as much, runs AG1-AG3).
  static_assert(!kPersist || (kMaySplit && !kDsFp32 && Tile::kMayPersist), "a persistent grid: the plain instance");
  // The loads of p.bwd_early_loads (bwd_load): in the 80-row instances on a grid of a CTA an item only,
  // so that the others' code stays as it was (in fp16 d 64's plain instance the runtime switch moved
  // five integer instructions into the step loop, cuobjdump).
  constexpr bool kEarlyLoads = kDqT && !kPersist;

#ifdef FLASHCOS_BWD_TIMELINE
  const long long cta_start = clock64();  // the CTA's first stamp (bwd_timeline.cuh)
#endif
  // The launcher's dq_finish_kernel may launch once every CTA has started (it waits for the heads'
  // counts, p.dq_done, and runs on the SMs the last wave leaves idle).
  pdl::allow_next_grid();
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + kSw128Atom - 1) & ~uint32_t(kSw128Atom - 1)) - raw_addr);
  unsigned char* sK = smem;
  unsigned char* sV = sK + Tile::kKBytes;
  unsigned char* sQ = sV + Tile::kKBytes;              // kStages stages
  unsigned char* sdO = sQ + kStages * Tile::kQBytes;   // kStages stages
  unsigned char* sdS = sdO + kStages * Tile::kQBytes;  // 2 buffers
  unsigned char* sdQ = sdS + 2 * Tile::kSBytes;        // kTmaDq: one dQ part per consumer
  float* sRowC = reinterpret_cast<float*>(sdQ + Tile::kDqBytes);  // (kStages, kStatSlots), Tile::stat_slot
  float* sDelta = sRowC + kStages * Tile::kStatSlots;                // (kStages, kStatSlots)
  uint64_t* bar_full = reinterpret_cast<uint64_t*>(sDelta + kStages * Tile::kStatSlots);
  uint64_t* bar_empty = bar_full + kStages;
  uint64_t* bar_ds_full = bar_empty + kStages;
  uint64_t* bar_ds_empty = bar_ds_full + 2;
  uint64_t* bar_kv = bar_ds_empty + 2;
  uint64_t* bar_dq_full = bar_kv + 1;       // kTmaDq: consumer c stored its dQ part (128 arrivals)
  uint64_t* bar_dq_empty = bar_dq_full + 2;  // the producer's reduction has read it (1 arrival)
  // kPersist: the consumers are done with the item's K, V (256 arrivals); the split tail's count
  // (split_gather; else an int of the row stats, which a later item's would overwrite); the item queue.
  uint64_t* bar_kv_empty = bar_dq_empty + 2;
  int* split_flag = kPersist ? reinterpret_cast<int*>(bar_kv_empty + 1) : reinterpret_cast<int*>(sRowC);
  const BwdItemQueue queue{reinterpret_cast<int*>(bar_kv_empty + 6), bar_kv_empty + 2, bar_kv_empty + 4};

  // wg (and warp) broadcast from lane 0: the compiler then knows them warp-uniform and keeps the
  // wgmma descriptors built from them in uniform registers.
  const int tid = threadIdx.x, lane = tid % 32;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0), warp = __shfl_sync(0xffffffffu, (tid % 128) / 32, 0);
  const int n_blocks = (p.J + kBN - 1) / kBN, heads_batches = p.Hkv * p.B;
  // A piece of a split block takes a share of its steps (split_tail.h); every other CTA all of them.
  // (bwd_item, bwd_order.h, computes the same for a persistent grid's items; taking this CTA's from it
  // changed every instance's machine code, cuobjdump, so it stays written out here.)
  const SplitPiece piece = kMaySplit ? split_piece(p, blockIdx.x) : SplitPiece{int(blockIdx.x), 0, 1, -1};
  const BwdCta cta = bwd_cta(p, unsigned(piece.block), n_blocks, heads_batches);
  const int n_block = cta.n_block, hb = cta.hb;
  // kBias with an (H, I, J) bias: batch fastest, so that the CTAs of one (key block, head) run side
  // by side and their bias loads and dbias reductions meet in L2 (with band 1, choose_bwd_order).
  const bool batch_fastest = kBias && !p.bias_batch_dim;
  const int hkv = batch_fastest ? hb / p.B : hb % p.Hkv, b = batch_fastest ? hb % p.B : hb / p.Hkv;
  const int group = p.H / p.Hkv;
  const int I = p.I, J = p.J, H = p.H;
  const int diag = J - I;
  const int n0 = n_block * kBN;
  // The steps' first row: on the kBM-row grid but in the plain 80-row instance (bwd_rows).
  const BwdRows rows = bwd_rows(p, n0, kBM, !kDqT || p.bwd_rows_on_grid);
  const int per_head = rows.per_head;
  const int n_iters = group * per_head;  // the block's steps
  const int step0 = split_piece_first(n_iters, piece.piece, piece.pieces);
  const int n_steps = split_piece_first(n_iters, piece.piece + 1, piece.pieces) - step0;  // this CTA's

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full + s, 32);
      mbar_init(bar_empty + s, kConsumerThreads);
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      mbar_init(bar_ds_full + s, kConsumerThreads);
      mbar_init(bar_ds_empty + s, kConsumerThreads / 32);
    }
    mbar_init(bar_kv, 1);
    if constexpr (kPersist) {
      mbar_init(bar_kv_empty, kConsumerThreads);
      queue.init();
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      mbar_init(bar_dq_full + s, 128);
      mbar_init(bar_dq_empty + s, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    // kEarlyLoads and p.bwd_early_loads: K, V on their way while the CTA passes its barrier and sets up.
    if (kEarlyLoads && p.bwd_early_loads) bwd_load_kv<Tile, D>(maps, sK, sV, bar_kv, n0, hkv, b);
  }
  __syncthreads();

  // Step it covers query head steps.h(it), rows steps.m0(it) ..: heads outer, row blocks inner,
  // from unit turns.rot() in the rotated deterministic order (DqTurns; p.det_rotate, not causal).
  const BwdOrder order = bwd_order(p, cta, hkv * group, rows, kBM, n_iters, kDet);
  const DqTurns turns = order.turns;
  BwdSteps piece_steps = order.steps;
  if (kMaySplit) piece_steps.rot = step0;  // a piece starts at its first step (rot is 0 here otherwise)
  const BwdSteps steps = piece_steps;
  // kPersist: after blockIdx.x each CTA takes its next item (bwd_item: a key block of a (b, kv head),
  // or a split piece) from the queue as it comes free, until one past the grid's; the barriers' phases
  // and the dS buffers count the CTA's steps over its items (`done`).
  [[maybe_unused]] const int64_t items = bwd_grid_items(p, int64_t(n_blocks) * heads_batches);
  auto item_at = [&](unsigned w) { return bwd_item(p, w, kBN, kBM, true, false, !kDqT || p.bwd_rows_on_grid, false); };

  if (wg == 0) {
    // Producer: warp 0 loads, warps 1 and 2 add consumer 0's and 1's dQ (kTmaDq), warp 3 only gives
    // its registers away.
    regs_dealloc<Tile::kProducerRegs>();
    if (kTmaDq && (warp == 1 || warp == 2) && lane == 0) {
      if constexpr (kPersist) {
        bwd_dq_reduce_items<Tile>(maps, p, sdQ, bar_dq_full, bar_dq_empty, warp - 1, queue, items, item_at);
      } else {
        bwd_dq_reduce<Tile, kDet, kDetAhead>(maps, p, sdQ, bar_dq_full, bar_dq_empty, warp - 1, b, hkv, turns, n_steps,
                                             steps, 0, blockIdx.x);
      }
    } else if (warp == 0) {
      if constexpr (kPersist) {
        bwd_load_items<Tile, D, kFoldScale, kPShift>(maps, p, sK, sV, sQ, sdO, sRowC, sDelta, bar_kv, bar_kv_empty,
                                                     bar_full, bar_empty, lane, queue, items, item_at);
      } else {
        bwd_load<Tile, D, kFoldScale, kPShift, kEarlyLoads>(maps, p, sK, sV, sQ, sdO, sRowC, sDelta, bar_kv, bar_kv_empty,
                                                            bar_full, bar_empty, lane, n0, hkv, b, n_steps, steps, 0, 0);
      }
    }
    return;
  }

  // Consumers.
  regs_alloc<Tile::kConsumerRegs>();
  const int c = wg - 1;
  const int g = lane / 4, t = lane % 4;
  const uint32_t aK = smem_addr(sK), aV = smem_addr(sV), aQ = smem_addr(sQ), adO = smem_addr(sdO);
  const uint32_t adS = smem_addr(sdS);
  const int key_local0 = c * 64 + warp * 16 + g;
  // store_ds's stmatrix: lane l gives row l % 8 of matrix l / 8 (keys 8 ((l / 8) % 2) + l % 8 of the
  // warp's 16, 16-byte chunk 2 kk + l / 16, swizzled by the key row % 8 = l % 8).
  const uint32_t ds_row_addr = adS + uint32_t(c * 64 + warp * 16 + 8 * ((lane / 8) % 2) + lane % 8) * kSw128Row;
  const uint32_t ds_chunk_x = uint32_t(lane / 16) ^ uint32_t(lane % 8);
  // kDqT: dS (rows x keys) by stmatrix .trans: lane l gives stored row l % 8 of matrix l / 8, i.e. row
  // 8 (l / 16) + l % 8 of the k-step's 16, 16-byte chunk 2 warp + (l / 8) % 2 of column block c (the
  // warp's 16 keys), swizzled by the row % 8 = l % 8.
  const uint32_t dst_row_addr = adS + uint32_t(c * kBM + 8 * (lane / 16) + lane % 8) * kSw128Row +
                                ((uint32_t(2 * warp + (lane / 8) % 2) ^ uint32_t(lane % 8)) << 4);
  int stage = 0;  // the Q / dO stage of the next step, and its phase
  uint32_t phase = 0;
  // One item (a CTA's only one but with kPersist): done, the CTA's steps in its earlier items; item,
  // their count; w, its index.
  auto consume = [&](const int n0, const int hkv, const int b, const BwdRows rows, const int n_steps,
                     const DqTurns turns, const BwdSteps steps, const int done, const int item, const unsigned w) {
  const int per_head = rows.per_head;
#ifdef FLASHCOS_BWD_TIMELINE  // a diagnostic build's stamps (bwd_timeline.cuh); FLASHCOS_BWD_MARK is empty otherwise
  auto mark = [&](int m) {
    constexpr bool kStamped = kMaySplit && !kDsFp32;  // the plain instance, either grid (kPersist implies it)
    if (kStamped && tid % 128 == 0) bwd_timeline_mark(g_bwd_timeline, item, c, m, int(w), n_steps, cta_start);
  };
#endif
  FLASHCOS_BWD_MARK(kMarkEnter);
  const int wg_key0 = n0 + c * 64;
  // This thread's two keys n0 + key_local0 + 8 e0: inside J and not masked out.
  const bool has_mask = p.mask != nullptr;
  bool key_ok[2];
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const int col = n0 + key_local0 + 8 * e0;
    key_ok[e0] = col < J && (!has_mask || p.mask[int64_t(b) * p.mask_b_stride + int64_t(col) * p.mask_j_stride]);
  }
  const float scale_log2 = p.scale * kLog2e;
  // kFoldScale: dS carries the scale (dS' = scale dS, D_i scaled by the producer), so dQ = dS' K and
  // dK = dS'^T Q need no multiply; otherwise it is applied where dQ and dK are written (kDqUnscaled:
  // dQ's by dq_out's conversion).
  // kPShift: dS from P 2^kPShift and (dP - D_i) 2^-kPShift (bwd_ds.cuh); dV, summed from the shifted P,
  // scaled back as it is stored.
  const float ds_scale = bwd_ds_scale(kFoldScale, kPShift, p.scale), dk_scale = kFoldScale ? 1.f : p.scale;
  const float dv_scale = bwd_p_unshift(kPShift);
  const float dq_scale = kFoldScale || kDqUnscaled ? 1.f : p.scale;

  float rdK[D / 2], rdV[D / 2], rdQ[Tile::kDqRegs];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) rdK[i] = rdV[i] = 0.f;
  uint32_t rPf[kMT][4], rdSf[kMT][4];

  // Deterministic (kDet) without kTmaDq: this consumer's rows (128-row steps) or columns (64-row
  // steps, one counter per column half) of a unit go in after every lower key block's; named barrier 2 + c is the consumer
  // warpgroup's. The count of step it's adds waits until the next flush, when their fence finds
  // them long done.
  auto unit_rows0 = [&](int it) { return steps.m0(it) + (kSplitRows ? c * 64 : 0); };
  auto count_unit = [&](int it) {
    if (unit_rows0(it) >= I) return;
    __threadfence();
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + c) : "memory");
    if (tid % 128 == 0) dq_unit_done(dq_unit_counter(p.dq_semaphore, b, H, steps.h(it), I, unit_rows0(it)) + (kSplitRows ? 0 : c));
  };
  auto hand_off_dq = [&] {
    fence_proxy_async();
    mbar_arrive(bar_dq_full + c);
  };
  // kFixed: the grid constants c_i (p.dq_grid) of this thread's two rows of the step whose dQ is
  // flushed next, loaded a step ahead (at the end of that step).
  float grid_c[2] = {0.f, 0.f};
  auto load_grid = [&](int m0s, int hs) {
    if constexpr (kFixed) {
      const float* gc = p.dq_grid + (int64_t(b) * H + hs) * I;
#pragma unroll
      for (int e0 = 0; e0 < 2; ++e0)
        grid_c[e0] = __ldg(gc + min(m0s + (kSplitRows ? c * 64 : 0) + warp * 16 + g + 8 * e0, I - 1));
    }
  };
  auto flush_dq = [&](int it) {
    if constexpr (kTmaDq) {
      // This consumer's part into its staging tile (SW128, fp32: 4 floats per 16-byte chunk), for
      // the producer's reduction; its reduction of the CTA's step before must have read the tile.
      if (done + it > 0) mbar_wait(bar_dq_empty + c, (done + it - 1) & 1);
      unsigned char* tile = sdQ + c * Tile::kDqTileBytes;
      if constexpr (kDqT) {
        stage_dq_transposed<Tile>(tile, rdQ, dq_scale, warp, g, t);
      } else {
        stage_dq_rows<Tile, kFixed>(tile, rdQ, dq_scale, grid_c, warp, g, t);
      }
      // Handed to the producer (fence, dq_full) at the start of the next step, or here after
      // the last one (hand_off_dq).
      return;
    }
    const int h = steps.h(it), m0 = steps.m0(it);
    float* gdQ = static_cast<float*>(p.dq_accum) + (int64_t(b) * H + h) * I * p.D;
    const bool ordered = kDet && unit_rows0(it) < I;
    if (kDet && it > 0) count_unit(it - 1);
    if (ordered) {
      if (tid % 128 == 0)
        dq_unit_wait(dq_unit_counter(p.dq_semaphore, b, H, h, I, unit_rows0(it)) + (kSplitRows ? 0 : c),
                     turns.target(steps, it));
      asm volatile("bar.sync %0, 128;\n" ::"r"(2 + c) : "memory");
    }
#pragma unroll
    for (int e0 = 0; e0 < 2; ++e0) {
      const int r = m0 + (kSplitRows ? c * 64 : 0) + warp * 16 + g + 8 * e0;
      if (r >= I) continue;
#pragma unroll
      for (int i = 0; i < kNQ / 8; ++i)
        if ((kSplitRows ? 0 : c * kNQ) + i * 8 < p.D)
          atomic_add2(gdQ + int64_t(r) * p.D + (kSplitRows ? 0 : c * kNQ) + i * 8 + 2 * t, rdQ[4 * i + 2 * e0] * dq_scale,
                      rdQ[4 * i + 2 * e0 + 1] * dq_scale);
    }
  };
  // dQ(it) = dS(it) K: A = dS (rows M-major in dS^T buffer (done + it) % 2), B = K (N-major). 128-row steps:
  // this consumer's 64 rows (row block c of the tile), every column; 64-row steps: every row, half
  // the columns (d 64: 64 bytes into the swizzled rows; d 128: the second column block).
  // Descriptors of the tiles' first bytes; every operand's is one of these plus an offset.
  const uint64_t ds_desc0 = make_desc(adS, kBN * kSw128Row, kSw128Atom);   // dS (M-major), dQ's A
  const uint64_t k_desc_n = make_desc(aK, kBN * kSw128Row, kSw128Atom);    // K (N-major), dQ's B
  const uint64_t k_desc = make_desc(aK, 16, kSw128Atom), v_desc = make_desc(aV, 16, kSw128Atom);  // K-major
  const uint64_t q_desc_k = make_desc(aQ, 16, kSw128Atom), do_desc_k = make_desc(adO, 16, kSw128Atom);
  const uint64_t q_desc_n = make_desc(aQ, kBM * kSw128Row, kSw128Atom);    // Q, dO (N-major): dK, dV's B
  const uint64_t do_desc_n = make_desc(adO, kBM * kSw128Row, kSw128Atom);
  // kDqT: dQ^T(it) = K^T dS^T(it): A = K^T (M-major: column block c of K, this consumer's 64
  // columns), B = dS^T (K-major: the rows x keys tile, keys in column blocks of 64).
  const uint64_t ds_desc_k = make_desc(adS, 16, kSw128Atom);
  auto issue_dq = [&](int it) {
    if constexpr (kDqT) {
#pragma unroll
      for (int kk = 0; kk < kNT; ++kk)
        Wgmma<T, kBM>::template ss<1, 0>(
            rdQ, desc_add(k_desc_n, c * kBN * kSw128Row + kk * 16 * kSw128Row),
            desc_add(ds_desc_k, ((done + it) & 1) * Tile::kSBytes + (kk / 4) * kBM * kSw128Row + (kk % 4) * 32), kk > 0);
    } else {
      const uint32_t s_off = ((done + it) & 1) * Tile::kSBytes + (kSplitRows ? c * kBN * kSw128Row : 0);
      const uint32_t k_off = kSplitRows ? 0 : D == 64 ? c * 64 : c * kBN * kSw128Row;
#pragma unroll
      for (int kk = 0; kk < kNT; ++kk)
        Wgmma<T, kNQ>::template ss<1, 1>(rdQ, desc_add(ds_desc0, s_off + kk * 16 * kSw128Row),
                                         desc_add(k_desc_n, k_off + kk * 16 * kSw128Row), kk > 0);
    }
  };

  mbar_wait(bar_kv, item & 1);
  FLASHCOS_BWD_MARK(kMarkKv);
  // One step; kPrev (it > 0 as a constant, so that every path has a fixed number of MMA groups in
  // flight): dQ(it - 1) is still to do.
  // The stats of this thread's rows 8 q + 2 t, + 1 (q < N / 2) of a stage into dst[2 q], dst[2 q + 1]
  // (`stats` points at this thread's slots: Tile::stat_slot).
  auto load_row_pairs = [&](auto& dst, const float* stats) {
    constexpr int kQuads = sizeof(dst) / sizeof(dst[0]) / 4;
#pragma unroll
    for (int j = 0; j < kQuads; ++j) {
      const float4 v = reinterpret_cast<const float4*>(stats)[j];
      dst[4 * j] = v.x;
      dst[4 * j + 1] = v.y;
      dst[4 * j + 2] = v.z;
      dst[4 * j + 3] = v.w;
    }
  };
  // The step's first query row, computed a step ahead (its computation stalled the step's start:
  // ncu, 2.3 % of the consumers' stall samples). Kept by increment, not steps.m0's division (its reciprocal and corrections: 25 instructions a step).
  // (steps.unit(0) > 0 only where per_head > 0)
  const int unit0 = steps.unit(0);
  int m_next = unit0 == 0 ? 0 : unit0 % per_head;  // steps.unit(it + 1) % per_head
  int m0_next = rows.first + m_next * kBM;
  int h_next = hkv * group + (unit0 == 0 ? 0 : unit0 / per_head);  // kBias: steps.h(it + 1), likewise
  // Backwards (steps.rev) the row block and head step down (constants but in the deterministic mode).
  const bool rev = kDet && steps.rev;
  const int m_dir = rev ? -1 : 1, m_wrap = rev ? -1 : per_head, m_restart = rev ? per_head - 1 : 0;
  // kBias: step it's bias and dbias rows m0 + rl, keys n0 + key_local0 + 8 e0 (the sm_80 kernel's
  // indexing: the bias of head or batch `lead`, dbias (lead, I, J), or (B, H, I, J) with
  // dbias_per_head, where every element is added once). Keys past J read key J - 1 instead
  // (kbias_off; their P is cleared), rows past I row m0 (their c_i is -inf), so that the loads need
  // no predicate.
  float inv_ds_scale = 1.f;
  int64_t kbias_off[2] = {0, 0};
  bool key_in[2] = {false, false};
  if constexpr (kBias) {
    inv_ds_scale = 1.f / ds_scale;
#pragma unroll
    for (int e0 = 0; e0 < 2; ++e0) {
      const int col = n0 + key_local0 + 8 * e0;
      key_in[e0] = col < J;
      kbias_off[e0] = int64_t(min(col, J - 1) - (n0 + key_local0)) * p.bias_j_stride;
    }
  }
  auto run_step = [&](int it, auto prev) {
    constexpr bool kPrev = decltype(prev)::value;
    const int gi = done + it;  // the CTA's step: its dS buffer gi % 2 and the barriers' phases
    const int m0 = m0_next;
    [[maybe_unused]] const int h = h_next;
    mbar_wait(bar_full + stage, phase);
    if (it == 0 && c == 1) named_bar_sync<1, kConsumerThreads>();  // start half a step after consumer 0
    const float* sRowCs = sRowC + stage * Tile::kStatSlots + t * Tile::kStatStride;  // this thread's rows
    const float* sDeltas = sDelta + stage * Tile::kStatSlots + t * Tile::kStatStride;

    const bool elementwise = has_mask || wg_key0 + 64 > J || (p.causal && wg_key0 + 63 > m0 + diag);
    float rS[kBM / 2], rdP[kBM / 2];
    auto issue_s_dp = [&](float (&acc)[kBM / 2], uint64_t a_desc, uint64_t b_desc) {
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk) {
        const uint32_t a_off = (kk / 4) * kBN * kSw128Row + c * 64 * kSw128Row + (kk % 4) * 32;
        const uint32_t b_off = (kk / 4) * kBM * kSw128Row + (kk % 4) * 32;
        Wgmma<T, kBM>::template ss<0, 0>(acc, desc_add(a_desc, a_off), desc_add(b_desc, b_off), kk > 0);
      }
    };
    auto issue_kv_grad = [&](float (&acc)[D / 2], const uint32_t (&frag)[kMT][4], uint64_t b_desc) {
#pragma unroll
      for (int kk = 0; kk < kMT; ++kk)
        Wgmma<T, D>::template rs<1>(acc, frag[kk], desc_add(b_desc, kk * 16 * kSw128Row),
                                    1);
    };
    // dS^T (keys x rows) into buffer it % 2 by stmatrix, one per k-step: word j of the fragment is the
    // 8 x 8 matrix of keys 8 (j % 2) .. + 7 and rows 16 kk + 8 (j / 2) .. + 7, i.e. 16-byte chunk
    // 2 kk + j / 2 of those key rows (ds_row_addr, ds_chunk_x: this lane's row and swizzle).
    auto store_ds = [&] {
      if constexpr (kDqT) {  // rows x keys: k-step kk is rows 16 kk ..
        const uint32_t buf = dst_row_addr + (gi & 1) * Tile::kSBytes;
#pragma unroll
        for (int kk = 0; kk < kMT; ++kk)
          stmatrix_x4_trans(buf + kk * 16 * kSw128Row, rdSf[kk][0], rdSf[kk][1], rdSf[kk][2], rdSf[kk][3]);
      } else {
        const uint32_t buf = ds_row_addr + (gi & 1) * Tile::kSBytes;
#pragma unroll
        for (int kk = 0; kk < kMT; ++kk)
          stmatrix_x4(buf + (kk / 4) * kBN * kSw128Row + ((uint32_t((2 * kk) % 8) ^ ds_chunk_x) << 4), rdSf[kk][0],
                      rdSf[kk][1], rdSf[kk][2], rdSf[kk][3]);
      }
    };
    wgmma_fence();
    const uint32_t stage_off = stage * Tile::kQBytes;
    issue_s_dp(rS, k_desc, desc_add(q_desc_k, stage_off));
    wgmma_commit();
    issue_s_dp(rdP, v_desc, desc_add(do_desc_k, stage_off));
    wgmma_commit();
    m_next += m_dir;  // while S^T / dP^T run
    if (m_next == m_wrap) {
      m_next = m_restart;
      h_next += m_dir;
      if (h_next == hkv * group + group) h_next = hkv * group;  // the rotated order goes round
    }
    m0_next = rows.first + m_next * kBM;
    // dQ(it - 2), stored to its staging tile at the end of step it - 1, handed to the producer's
    // reduction now: by here the stores have long completed, and the proxy fence does not wait for
    // them (right behind them it did: ncu, 7 % of the consumers' stall samples). Before the row
    // stats' loads below, which the fence would wait for.
    if (kTmaDq && kPrev && it >= 2) hand_off_dq();
    // The rows' c_i into registers while S^T runs (loaded at their use, their latency stalled
    // the exponentials: ncu short-scoreboard stalls). Row 8 q + 2 t + h is rc[2 q + h]; with
    // 128-row steps only the first 32 rows' (more spilled), the rest loaded in the loop.
    constexpr int kPre = kBM == 64 ? 8 : 4;
    float rc[2 * kPre];
    load_row_pairs(rc, sRowCs);
    wgmma_wait<1>();  // S^T
    fence_regs(rS);
    // P = exp2(S scale log2e + c_i) on every element, then, only in blocks that need it, the
    // masked-out elements cleared in the packed fragments. (With `ok ? exp2(x) : 0` per element
    // behind the block test, the compiler branched around every exponential: ncu, H100 d64 causal,
    // 14 instructions per element instead of 2, half of the consumers' instructions; with a select
    // per element it precomputed the 64 compares and spilled.) Masked elements are finite or +inf
    // before they are cleared (keys past J are zero-filled, rows past I have c_i = -inf), so
    // clearing their bits leaves an exact 0 for dV and dS.
    // kBias: + bias log2e (clamped rows and keys read in-range elements; those elements are cleared
    // below or have c_i = -inf).
    [[maybe_unused]] const int lead = p.bias_batch_dim ? b : h;
    [[maybe_unused]] const int rows_left = I - m0;  // rows m0 + rl with rl >= rows_left are past I
    [[maybe_unused]] const float* gBias = nullptr;
    if constexpr (kBias) {
      gBias = static_cast<const float*>(p.bias) + int64_t(lead) * p.bias_0_stride + int64_t(m0) * p.bias_i_stride +
              int64_t(n0 + key_local0) * p.bias_j_stride;
    }
    if constexpr (kBias) {
      // Element i = 4 q + 2 e0 + hh: row 8 q + 2 t + hh, key + 8 e0; row pointers walked by 8 rows.
      const int64_t bis = p.bias_i_stride;
      const float* rowp = gBias + int64_t(2 * t) * bis;
#pragma unroll
      for (int q = 0; q < kBM / 8; ++q) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float* src = 8 * q + 2 * t + hh < rows_left ? rowp + (hh ? bis : 0) : gBias;
#pragma unroll
          for (int e0 = 0; e0 < 2; ++e0) {
            const int i = 4 * q + 2 * e0 + hh;
            const float ci = i / 4 < kPre ? rc[2 * (i / 4) + i % 2] : sRowCs[2 * (i / 4) + i % 2];
            rS[i] = fast_exp2(fmaf(__ldg(src + kbias_off[e0]), kLog2e, fmaf(rS[i], scale_log2, ci)));
          }
        }
        rowp += 8 * bis;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBM / 2; ++i) {
        const float ci = i / 4 < kPre ? rc[2 * (i / 4) + i % 2] : sRowCs[2 * (i / 4) + i % 2];
        rS[i] = fast_exp2(fmaf(rS[i], scale_log2, ci));
      }
    }
#pragma unroll
    for (int kk = 0; kk < kMT; ++kk) acc_to_frag<T>(rPf[kk], rS, kk);
    if (elementwise) {
      // Word j of k-step kk holds elements i = 8 kk + 2 j + h: row rl = (2 kk + j / 2) 8 + 2 t + h,
      // key n0 + key_local0 + 8 (j % 2).
      const int causal_lim = p.causal ? m0 + diag - (n0 + key_local0) : (1 << 30);  // ok: 8 e0 <= rl + this
#pragma unroll
      for (int kk = 0; kk < kMT; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int e0 = j % 2, rl = (2 * kk + j / 2) * 8 + 2 * t;
          const uint32_t lo = 8 * e0 <= rl + causal_lim ? 0x0000ffffu : 0u;
          const uint32_t hi = 8 * e0 <= rl + 1 + causal_lim ? 0xffff0000u : 0u;
          rPf[kk][j] &= key_ok[e0] ? (lo | hi) : 0u;
        }
    }
    wgmma_fence();
    issue_kv_grad(rdV, rPf, desc_add(do_desc_n, stage_off));
    wgmma_commit();
    float rD[kBM / 4];  // D_i likewise, while dP^T completes
    load_row_pairs(rD, sDeltas);
    wgmma_wait<1>();  // dP^T (dV may still run)
    fence_regs(rdP);
    if (it == 0 && c == 0) named_bar_arrive<1, kConsumerThreads>();
    // dS^T from the 16-bit P that dV uses (rS is dead once packed: its registers are what the
    // 240-register consumers lack), straight into dS's A fragments: bwd_ds.cuh. kPairDs: one bf16x2 /
    // f16x2 multiply per pair; otherwise (kBias, whose dbias wants dS in fp32, fp16's deterministic
    // instances and kDsFp32) the product in fp32, rounded once.
    if constexpr (kPairDs) {
      ds_paired<T, kBM / 2>(rdSf, rdP, rPf, rD, ds_scale);
    } else {
      ds_fp32<T, kBM / 2>(rdP, rPf, rD, ds_scale);
    }
    if constexpr (kBias) {
      // dbias = dS (without the folded scale), added by fp32 reductions (sm_80's bwd_kernel.cuh does
      // the same); masked elements add their exact 0 only where the key is kept.
      const int64_t slice = p.dbias_per_head ? int64_t(b) * H + h : lead;
      float* gdBias = static_cast<float*>(p.dbias_accum) + (slice * I + m0) * J + n0 + key_local0;
      float* rowp = gdBias + int64_t(2 * t) * J;
#pragma unroll
      for (int q = 0; q < kBM / 8; ++q) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const bool row_in = 8 * q + 2 * t + hh < rows_left;
#pragma unroll
          for (int e0 = 0; e0 < 2; ++e0)
            if (row_in && key_in[e0]) red_add(rowp + (hh ? J : 0) + 8 * e0, rdP[4 * q + 2 * e0 + hh] * inv_ds_scale);
        }
        rowp += 8 * int64_t(J);
      }
    }
    if constexpr (!kPairDs) {  // the fp32 product rounded once, after dbias read it
#pragma unroll
      for (int kk = 0; kk < kMT; ++kk) acc_to_frag<T>(rdSf[kk], rdP, kk);
    }
    if (gi >= 2) mbar_wait(bar_ds_empty + (gi & 1), ((gi - 2) >> 1) & 1);
    store_ds();
    // dK reads dS from registers: issued before the proxy fence, which waits for the dS stores that
    // only the other consumer's dQ reads.
    wgmma_fence();
    issue_kv_grad(rdK, rdSf, desc_add(q_desc_n, stage_off));
    wgmma_commit();
    fence_proxy_async();
    mbar_arrive(bar_ds_full + (gi & 1));
    // kTmaDq: dQ(it - 1) goes in right behind dK, so that the tensor cores are not left idle
    // while this warpgroup waits for dK; otherwise it is issued once dV and dK completed (with the
    // atomics, issuing it early measured the same: H100 bf16 n 8192 d64 341 against 337 TFLOP/s).
    constexpr bool early_dq = kTmaDq && kPrev;
    if constexpr (early_dq) {
      mbar_wait(bar_ds_full + ((gi - 1) & 1), ((gi - 1) >> 1) & 1);
      wgmma_fence();
      issue_dq(it - 1);
      wgmma_commit();
      wgmma_wait<1>();  // dV, dK
    } else {
      wgmma_wait<0>();
    }
    fence_regs(rdV);
    fence_regs(rdK);
#pragma unroll
    for (int kk = 0; kk < kMT; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(rPf[kk][e]), "+r"(rdSf[kk][e])::"memory");
    mbar_arrive(bar_empty + stage);
    if constexpr (kPrev) {
      if constexpr (!early_dq) {
        mbar_wait(bar_ds_full + ((gi - 1) & 1), ((gi - 1) >> 1) & 1);
        wgmma_fence();
        issue_dq(it - 1);
        wgmma_commit();
      }
      wgmma_wait<0>();
      fence_regs(rdQ);
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_ds_empty + ((gi - 1) & 1));
      flush_dq(it - 1);
    }
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
    load_grid(m0, h);  // kFixed: this step's rows, flushed in the next step
  };
  if (n_steps > 0) run_step(0, std::false_type{});
  FLASHCOS_BWD_MARK(kMarkFirstStep);
  for (int it = 1; it < n_steps; ++it) run_step(it, std::true_type{});
  FLASHCOS_BWD_MARK(kMarkLoopEnd);
  if (n_steps > 0) {
    const int last = n_steps - 1, glast = done + last;
    mbar_wait(bar_ds_full + (glast & 1), (glast >> 1) & 1);
    wgmma_fence();
    issue_dq(last);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(rdQ);
    FLASHCOS_BWD_MARK(kMarkDqMma);
    if constexpr (kPersist || kRowStores) {  // for the next item's steps, and the staged dK / dV stores
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_ds_empty + (glast & 1));
    }
    if (kTmaDq && last >= 1) hand_off_dq();  // dQ(last - 1), flushed in the last step
    flush_dq(last);
    if (kTmaDq) hand_off_dq();
    if (kDet && !kTmaDq) count_unit(last);
    FLASHCOS_BWD_MARK(kMarkDqOut);
  }
  if constexpr (kPersist) mbar_arrive(bar_kv_empty);  // K, V free for the next item's

  if constexpr (kMaySplit) {
    // A piece: its parts to its slot; the piece that counts last sums every piece's and stores them.
    // (The piece found again from the item's index, not kept in registers through the loop.)
    const SplitPiece tail = split_piece(p, w);
    if (tail.pieces > 1 && !split_gather<D>(p, tail, rdK, rdV, tid - 128, split_flag)) return;
  }
  if constexpr (kRowStores) {
    // Through this consumer's key block of both dS buffers, once both consumers' dQ(last) and
    // dQ(last - 1) have read them (store_dk_dv_rows). (glast's phase implies glast - 1's: every warp
    // arrives in step order. The second wait is redundant but is the code runs AJ2 / AJ3 timed.)
    const int glast = done + n_steps - 1;
    if (n_steps > 0) {
      mbar_wait(bar_ds_empty + (glast & 1), (glast >> 1) & 1);
      if (glast >= 1) mbar_wait(bar_ds_empty + ((glast - 1) & 1), ((glast - 1) >> 1) & 1);
    }
    const uint32_t region[2] = {adS + uint32_t(c * kBM * kSw128Row), adS + uint32_t(Tile::kSBytes + c * kBM * kSw128Row)};
    store_dk_dv_rows<T, D>(p, rdK, rdV, dk_scale, dv_scale, b, hkv, n0 + c * 64, region, 2 + c, warp, lane,
                           tid % 128);
  } else {
    store_dk_dv<T, D>(p, rdK, rdV, dk_scale, dv_scale, b, hkv, n0 + key_local0, t);
  }
  FLASHCOS_BWD_MARK(kMarkStored);
  };
  if constexpr (kPersist) {
    int done = 0;
    unsigned w = blockIdx.x;
    for (int item = 0;; ++item) {
      const BwdItem x = item_at(w);
      consume(x.n0, x.hkv, x.b, x.rows, x.n_steps, x.order.turns, x.order.steps, done, item, w);
      done += x.n_steps;
      w = queue.read(item);
      if (int64_t(w) >= items) break;
    }
  } else {
    consume(n0, hkv, b, rows, n_steps, turns, steps, 0, 0, blockIdx.x);
  }
#endif
}

}  // namespace flashcos::cuda::hopper
