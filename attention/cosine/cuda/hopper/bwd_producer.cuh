// The Hopper backward's tiles, tensor maps and producer warpgroup (warpgroup 0 of
// bwd_hopper_ws.cuh's kernel, whose header explains the schedule and the barriers):
//   bwd_load      warp 0: K, V once by TMA; per step the row stats c_i, D_i (plain loads into
//                 registers before the stage is free, then into shared memory at Tile::stat_slot)
//                 and Q, dO by TMA into stage it % kStages;
//   bwd_dq_reduce warp 1 + c, one lane (kTmaDq): consumer c's dQ part of each step, added to the fp32
//                 accumulator by TMA reductions (cp.reduce.async.bulk.tensor), in key-block order in
//                 the deterministic mode (dq_semaphore.cuh); once all are complete, the CTA's
//                 count in p.dq_done (dq_finish.cuh).
#pragma once

#include <cuda.h>

#include "attention/cosine/cuda/dq_semaphore.cuh"
#include "attention/cosine/cuda/hopper/bwd_order.h"
#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/hopper/tma.cuh"
#include "attention/cosine/cuda/hopper/tma_map.h"
#include "attention/cosine/cuda/params.h"

namespace flashcos::cuda::hopper {

struct BwdTmaMaps {
  CUtensorMap q, k, v, dout;
  CUtensorMap dq;  // kTmaDq: the fp32 accumulator, 64-row x 32-column boxes (make_f32_sw128_map)
};

template <int D, int BM, bool kTmaDq>
struct BwdWsTile {
  // Head dims below D run on the same tiles: their operands' columns past p.D load as zeros (TMA),
  // and nothing past p.D is stored (bwd_hopper_ws_kernel); 16 / 32 on d 64, 80 / 96 on d 128.
  static_assert(D == 64 || D == 128, "the Hopper backward's tiles have 64 or 128 columns");
  static_assert(BM == 64 || BM == 80 || BM == 128, "64, 80 or 128 query rows per step");
  // 80-row steps (d 128, the TMA dQ): dQ^T = K^T dS^T, each consumer 64 columns of dQ (M) by the
  // step's 80 rows (N), and dS stored rows x keys (query-major) for it; m64 cannot cover 80 rows.
  static constexpr bool kDqT = BM == 80;
  static_assert(!kDqT || D == 128, "80-row steps: d 128");
  static constexpr int kBN = 128;  // keys per CTA, 64 per consumer warpgroup
  static constexpr int kBM = BM;   // query rows per step
  static constexpr int kThreads = 384;
  // Q / dO / c_i / D_i stages: 3 where they fit beside the dQ staging tiles (d 128 with 64-row
  // steps: 8 bytes to spare; against 2 stages, H100 run N2: bf16 causal n 8192 +3.9 %, the other
  // seven d 128 cases level within the noise), else 2.
  static constexpr int kStages = kTmaDq && !(D == 128 && BM == 64) ? 2 : 3;
  static constexpr bool kSplitRows = BM == 128;  // dQ: consumer c takes rows 64c.., else columns
  static constexpr int kNQ = kSplitRows ? D : D / 2;  // dQ columns per consumer
  static constexpr int kKBytes = kBN * D * 2;
  static constexpr int kQBytes = kBM * D * 2;
  // dS^T (keys x rows) as BM / 64 blocks of kBN keys x 128 bytes (64 rows), swizzled; kDqT: dS
  // (rows x keys) as kBN / 64 blocks of BM rows x 128 bytes (64 keys).
  static constexpr int kSBytes = kBN * kBM * 2;
  // kTmaDq: each consumer's kDqRows x 64 fp32 part of dQ, as two SW128 boxes of kDqRows rows x 32
  // columns.
  static constexpr int kDqRows = kSplitRows ? 64 : kBM;
  static constexpr int kDqBoxBytes = kDqRows * 32 * 4;
  static constexpr int kDqTileBytes = 2 * kDqBoxBytes;
  static constexpr int kDqBytes = kTmaDq ? 2 * kDqTileBytes : 0;
  static_assert(!kTmaDq || kNQ == 64, "a consumer's dQ part is 64 columns");
  // Registers of a consumer's dQ part (fp32, one warpgroup's wgmma accumulator).
  static constexpr int kDqRegs = kDqT ? kBM / 2 : kNQ / 2;
  static constexpr int kBarriers = 2 * kStages + 9;
  // Row stats (c_i, D_i) of a stage in shared memory, ordered by the consumer thread that reads them:
  // rows 8 q + 2 t + h (q < kBM / 8, h < 2) of quad lane t at t kStatStride + 2 q + h, so that each
  // thread's are contiguous (float4 loads); the 4 floats of padding per t keep those loads free of
  // bank conflicts.
  static constexpr int kStatStride = kBM / 4 + 4;
  static constexpr int kStatSlots = 4 * kStatStride;
  __host__ __device__ static constexpr int stat_slot(int r) { return ((r % 8) / 2) * kStatStride + 2 * (r / 8) + r % 2; }
  // The CTA gets 168 registers x 384 threads at launch; setmaxnreg only moves them between the
  // warpgroups, so 24 + 2 x 240 is the most (with 32 for the producer the consumers' setmaxnreg.inc
  // waited forever: a hang on the H100). The kTmaDq instances spill a few bytes (loop invariants).
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr size_t kSmem = size_t(2) * kKBytes + 2 * kStages * size_t(kQBytes) + 2 * size_t(kSBytes) +
                                  kDqBytes + 2 * kStages * kStatSlots * sizeof(float) + kBarriers * sizeof(uint64_t) +
                                  kSw128Atom;
  static_assert(kSmem <= 227 * 1024, "shared memory");
  static_assert(128 * (kProducerRegs + 2 * kConsumerRegs) <= 168 * kThreads, "registers allocated at launch");
};

// Warp 1 + cc's lane 0 (kTmaDq): consumer cc's dQ part of each step into the accumulator.
template <typename Tile, bool kDet, bool kDetAhead>
__device__ __forceinline__ void bwd_dq_reduce(const BwdTmaMaps& maps, const BwdParams& p, unsigned char* sdQ,
                                              uint64_t* bar_dq_full, uint64_t* bar_dq_empty, int cc, int b,
                                              int hkv, const DqTurns& turns, int n_iters, const BwdSteps& steps) {
  constexpr bool kSplitRows = Tile::kSplitRows;
  const int I = p.I, H = p.H;
  // dQ: consumer cc's part of step k, added to the accumulator by a TMA reduction once the
  // consumer stored it; the buffer is handed back once the reduction has read it. One thread
  // per consumer (with one thread for both, a late tile of one consumer held up the other's,
  // and the deterministic mode's waits added up).
  // Deterministic (kDet): a unit's reduction waits for this block's turn (DqTurns), and this block
  // counts each unit as soon as its reduction has completed, before it waits for its next turn.
  // Counted after the next turn (the order before 2026-11-26 night, which overlapped the two
  // waits), a unit's count waited for every later block's next turn, a chain as long as the
  // blocks adding into one unit in turn (3.5x the backward time in the first version of the
  // causal head groups, run F4 of 2026-11-26 night), and in the rotated order two blocks could each
  // hold the count the other waits for.
  // kDetAhead (the default; FLASHCOS_HOPPER_BWD=ws-det-serial turns it off): the counter is polled
  // before the consumer's tile is waited for (its latency hides behind their step), and the count
  // needs no __threadfence (the reduction completed before it, so the next block's adds come after
  // ours whatever the fences).
  tma_prefetch_map(&maps.dq);
  int* pending = nullptr;  // kDet: the unit reduced and not yet counted
  auto count = [&](int*& counter) {
    if (counter == nullptr) return;
    fence_proxy_async_global();
    if constexpr (!kDetAhead) __threadfence();
    dq_unit_done(counter);
    counter = nullptr;
  };
  const int col0 = kSplitRows ? 0 : 64 * cc;
  // 32-column boxes of this consumer's dQ part below the head dim (2 unless it is below D).
  const int boxes = min(2, (p.D - col0 + 31) / 32);
  for (int k = 0; k < n_iters; ++k) {
    const int h = steps.h(k), m0 = steps.m0(k);
    const int row0 = m0 + (kSplitRows ? 64 * cc : 0);
    int* counter = nullptr;
    auto wait_turn = [&] {  // 64-row steps: each column half has its own counter
      counter = dq_unit_counter(p.dq_semaphore, b, H, h, I, row0) + (kSplitRows ? 0 : cc);
      dq_unit_wait(counter, turns.target(steps, k));
      fence_proxy_async_global();
    };
    if (kDet && pending != nullptr) {
      bulk_wait<0>();
      count(pending);
    }
    if constexpr (kDet && kDetAhead) {
      if (row0 < I) wait_turn();
    }
    mbar_wait(bar_dq_full + cc, k & 1);
    if (row0 < I) {
      if constexpr (kDet && !kDetAhead) wait_turn();
#pragma unroll
      for (int box = 0; box < 2; ++box)
        if (box < boxes)
          tma_reduce_add_4d(&maps.dq, sdQ + cc * Tile::kDqTileBytes + box * Tile::kDqBoxBytes, col0 + 32 * box,
                            row0, h, b);
    }
    bulk_commit();
    bulk_wait_read<0>();
    mbar_arrive(bar_dq_empty + cc);
    if constexpr (kDet) pending = counter;
  }
  bulk_wait<0>();
  if constexpr (kDet) count(pending);
  // This consumer's adds into (b, hkv)'s dQ are complete: counted for dq_finish_kernel, which
  // converts the head once every CTA's two counts are in (the proxy fence orders the reductions'
  // writes before the generic proxy's fence and release add). With a split tail (split_tail.h) a
  // whole block counts p.split_pieces, a piece 1, so that every head expects the same count.
  if (p.dq_done != nullptr) {
    fence_proxy_async_global();
    __threadfence();
    dq_unit_done(p.dq_done + (int64_t(b) * p.Hkv + hkv), blockIdx.x < unsigned(p.split_first) ? p.split_pieces : 1);
  }
}

// Warp 0: K, V once, then each step's row stats and Q, dO (kFoldScale: D_i times the scale, as the
// bf16 consumers use it).
template <typename Tile, int D, bool kFoldScale>
__device__ __forceinline__ void bwd_load(const BwdTmaMaps& maps, const BwdParams& p, unsigned char* sK,
                                         unsigned char* sV, unsigned char* sQ, unsigned char* sdO, float* sRowC,
                                         float* sDelta, uint64_t* bar_kv, uint64_t* bar_full, uint64_t* bar_empty,
                                         int lane, int n0, int hkv, int b, int n_iters, const BwdSteps& steps) {
  constexpr int kBN = Tile::kBN, kBM = Tile::kBM, kStages = Tile::kStages, kStatsPerLane = (kBM + 31) / 32;
  const int I = p.I, H = p.H;
  if (lane == 0) {
    tma_prefetch_map(&maps.q);
    tma_prefetch_map(&maps.dout);
    mbar_arrive_expect_tx(bar_kv, 2 * Tile::kKBytes);
#pragma unroll
    for (int blk = 0; blk < D / 64; ++blk) {
      tma_load_4d(sK + blk * kBN * kSw128Row, &maps.k, blk * 64, n0, hkv, b, bar_kv);
      tma_load_4d(sV + blk * kBN * kSw128Row, &maps.v, blk * 64, n0, hkv, b, bar_kv);
    }
  }
  const float* gRowC = static_cast<const float*>(p.row_offset);
  const float* gDelta = static_cast<const float*>(p.delta);
  const float delta_scale = kFoldScale ? p.scale : 1.f;  // D_i as the consumers use it
  for (int it = 0; it < n_iters; ++it) {
    const int s = it % kStages, h = steps.h(it), m0 = steps.m0(it);
    float rc[kStatsPerLane], rd[kStatsPerLane];
#pragma unroll
    for (int i = 0; i < kStatsPerLane; ++i) {
      const int r = m0 + lane + 32 * i;
      const int64_t row = (int64_t(b) * H + h) * I + r;
      rc[i] = r < I ? gRowC[row] : -INFINITY;
      rd[i] = r < I ? gDelta[row] * delta_scale : 0.f;
    }
    if (it >= kStages) mbar_wait(bar_empty + s, ((it / kStages) - 1) & 1);
#pragma unroll
    for (int i = 0; i < kStatsPerLane; ++i) {
      if (kBM % 32 != 0 && lane + 32 * i >= kBM) break;
      sRowC[s * Tile::kStatSlots + Tile::stat_slot(lane + 32 * i)] = rc[i];
      sDelta[s * Tile::kStatSlots + Tile::stat_slot(lane + 32 * i)] = rd[i];
    }
    if (lane == 0) {
      mbar_arrive_expect_tx(bar_full + s, 2 * Tile::kQBytes);
#pragma unroll
      for (int blk = 0; blk < D / 64; ++blk) {
        tma_load_4d(sQ + s * Tile::kQBytes + blk * kBM * kSw128Row, &maps.q, blk * 64, m0, h, b, bar_full + s);
        tma_load_4d(sdO + s * Tile::kQBytes + blk * kBM * kSw128Row, &maps.dout, blk * 64, m0, h, b, bar_full + s);
      }
    } else {
      mbar_arrive(bar_full + s);
    }
  }
}

}  // namespace flashcos::cuda::hopper
