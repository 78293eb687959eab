// The Hopper backward's CTA (bwd_hopper_ws.cuh's kernel, whose header has the consumers' math):
// its tiles (BwdWsTile), tensor maps, producer warpgroup and barriers, and the modes of its grid.
//
// Warpgroup 0 is the producer (setmaxnreg leaves it 24 registers; its warp 0 loads, warps 1 and 2 add
// the two consumers' dQ, warp 3 exits), warpgroups 1 and 2 the consumers (240 registers each).
//   bwd_load      warp 0: K, V of each item by TMA on bar_kv; per step `it` (stage it % kStages) the
//                 row stats c_i, D_i, plain loads into registers before it waits for the stage (rows
//                 past I get c_i = -inf, so P = 0), stored to shared memory at Tile::stat_slot, then
//                 every lane arrives on full[s]; Q, dO by TMA (rows past I come back as zeros),
//                 counted by lane 0's expect_tx.
//   bwd_dq_reduce warp 1 + c, one lane (kTmaDq, the default): each consumer stores its part of dQ(it)
//                 (64 x 64 fp32, scale folded in) to a staging tile in shared memory and hands it over
//                 at the start of its next step (when the proxy fence finds the stores done); this
//                 lane adds it to the zeroed fp32 accumulator by a TMA reduction
//                 (cp.reduce.async.bulk.tensor .add), in key-block order in the deterministic mode
//                 (dq_semaphore.cuh); once all are complete, the CTA's count in p.dq_done
//                 (dq_finish.cuh). At d 64 the two staging tiles take the place of a third Q / dO
//                 stage (d 128 has room for both: BwdWsTile::kStages); with no atomics left in the
//                 consumers dQ(it - 1) is issued right behind dK(it). Without kTmaDq
//                 (FLASHCOS_HOPPER_BWD=ws-atomic) the consumers add dQ with vector atomics after dV / dK.
// mbarriers:
//   bar_kv       K, V landed (transaction count)
//   full[s]      Q, dO of stage s landed and the producer's 32 lanes stored the row stats
//   empty[s]     the 256 consumer threads are done with stage s (its MMAs completed, stats read)
//   ds_full[b]   the 256 consumer threads stored step it's dS^T into buffer b = it % 2
//   ds_empty[b]  the 8 consumer warps whose dQ(it) MMA read it (it is rewritten in step it + 2; bf16
//                80-row steps: also waited for by store_dk_dv_rows, which stages dK / dV there)
//   dq_full[c] / dq_empty[c]   kTmaDq: consumer c stored its dQ part / the reduction has read it
//   kv_empty     persistent grid: the 256 consumer threads are done with the item's K, V
//   the item queue's full / empty (BwdItemQueue), persistent grid.
// Modes:
//   deterministic  kFixed (the cosine kind, where the launcher gets p.dq_grid) rounds each consumer's
//                  dQ part of row i to the row's grid, (x + c_i) - c_i, so that the TMA reductions
//                  give the same sum in any order (attention/cosine/dq_grid.h); kDet (the exp kind,
//                  FLASHCOS_DQ_GRID=0) adds into each dQ unit in a fixed order (DqTurns, bwd_order.h).
//   split tail     (split_tail.h; the plain instance, not causal) the grid's last blocks run as pieces
//                  over shares of their steps, whose dK / dV meet in p.split_scratch (split_gather).
//                  With p.dq_done each dQ warp counts its adds per (b, kv head), so that
//                  dq_finish_kernel, launched as the CTAs start, converts each head's dQ to 16 bits on
//                  the SMs the last wave leaves idle.
//   persistent     (kPersist: the plain instance, by default under a causal mask, bwd_hopper.cuh) one
//                  CTA an SM takes item after item (a key block of a (b, kv head), or a split piece:
//                  bwd_item), the next from p.item_counter as it comes free (BwdItemQueue;
//                  bwd_load_items, bwd_dq_reduce_items). The barriers' phases and the dS buffers count
//                  the CTA's steps over its items; a later item's K / V wait for kv_empty, while its
//                  first Q / dO stages already load.
#pragma once

#include <cuda.h>

#include "attention/cosine/cuda/dq_semaphore.cuh"
#include "attention/cosine/cuda/hopper/bwd_ds.cuh"
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
  // A persistent grid's barriers and item queue have no room beside the 3 stages of d 128's 64-row
  // steps (8 bytes to spare): those instances run a CTA an item.
  static constexpr bool kMayPersist = kStages == 2;
  // The stages' full / empty, dS full / empty, K / V, dQ full / empty and, kMayPersist, K / V empty,
  // the split flag and the item queue's two full / empty barriers and two slots (bwd_hopper_ws_kernel).
  static constexpr int kBarriers = 2 * kStages + 9 + (kMayPersist ? 7 : 0);
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

// A persistent grid's item queue: after its first item (blockIdx.x) each CTA takes the next from
// p.item_counter (zeroed by the caller) as it comes free, so that the SMs that run ahead take more
// (with a fixed stride the work spread unevenly: ncu, run AG2, d 64 the busiest SM 10 % above the
// mean). The producer's warp 0 fetches the next item once it has issued the last one's loads and
// hands it to the consumers and the dQ warps through two slots of shared memory: item j past the
// first in slot j % 2, its (j / 2)-th use.
//   full[s]   the slot holds its item (1 arrival: the producer's lane 0)
//   empty[s]  the 256 consumer threads and the 2 dQ warps' lanes have read it (258 arrivals)
// An item past the grid's ends every role's loop.
struct BwdItemQueue {
  int* slot;  // 2 ints
  uint64_t* full;
  uint64_t* empty;
  static constexpr int kReaders = 256 + 2;
  __device__ __forceinline__ void init() const {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, kReaders);
    }
  }
  // The producer's lane 0: the next item, published as item j past the first.
  __device__ __forceinline__ unsigned publish(int* counter, int j) const {
    const unsigned w = gridDim.x + unsigned(atomicAdd(counter, 1));
    const int s = j & 1, use = j >> 1;
    if (use > 0) mbar_wait(empty + s, (use - 1) & 1);
    slot[s] = int(w);
    mbar_arrive(full + s);
    return w;
  }
  // A consumer thread or a dQ warp's lane: item j past the first.
  __device__ __forceinline__ unsigned read(int j) const {
    const int s = j & 1;
    mbar_wait(full + s, (j >> 1) & 1);
    const unsigned w = unsigned(*reinterpret_cast<volatile int*>(slot + s));
    mbar_arrive(empty + s);
    return w;
  }
};

// Warp 1 + cc's lane 0 (kTmaDq): consumer cc's dQ part of each step of item w (bwd_item) into the
// accumulator; `done`: the CTA's steps in its earlier items (the barriers' phases count on).
template <typename Tile, bool kDet, bool kDetAhead>
__device__ __forceinline__ void bwd_dq_reduce(const BwdTmaMaps& maps, const BwdParams& p, unsigned char* sdQ,
                                              uint64_t* bar_dq_full, uint64_t* bar_dq_empty, int cc, int b,
                                              int hkv, const DqTurns& turns, int n_iters, const BwdSteps& steps,
                                              int done, unsigned w) {
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
    mbar_wait(bar_dq_full + cc, (done + k) & 1);
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
    dq_unit_done(p.dq_done + (int64_t(b) * p.Hkv + hkv), w < unsigned(p.split_first) ? p.split_pieces : 1);
  }
}

// One thread: the key block's K, V (kBN keys from n0 of kv head hkv of batch b) by TMA on bar_kv.
template <typename Tile, int D>
__device__ __forceinline__ void bwd_load_kv(const BwdTmaMaps& maps, unsigned char* sK, unsigned char* sV,
                                            uint64_t* bar_kv, int n0, int hkv, int b) {
  mbar_arrive_expect_tx(bar_kv, 2 * Tile::kKBytes);
#pragma unroll
  for (int blk = 0; blk < D / 64; ++blk) {
    tma_load_4d(sK + blk * Tile::kBN * kSw128Row, &maps.k, blk * 64, n0, hkv, b, bar_kv);
    tma_load_4d(sV + blk * Tile::kBN * kSw128Row, &maps.v, blk * 64, n0, hkv, b, bar_kv);
  }
}

// Warp 0, for one item (bwd_item) of the CTA's: its K, V, then each step's row stats and Q, dO
// (kFoldScale: D_i times the scale, as the bf16 consumers use it; kPShift: fp16's paired dS, c_i + kPShift and
// D_i 2^-kPShift, bwd_ds.cuh). `done`: the CTA's steps in its
// earlier items (the stages and their phases count on); `item`: their count. A later item's K, V
// wait for the consumers to be done with the last (bar_kv_empty), after the item's first stages,
// which go in while the last item's steps finish.
// kEarly and p.bwd_early_loads (a grid of a CTA an item): the item's K, V already requested by the
// kernel's prologue, and each stage's Q, dO requested before its row stats are stored (whose loads
// the producer then stalls on), lane 0 expecting their bytes without arriving; otherwise after.
template <typename Tile, int D, bool kFoldScale, int kPShift, bool kEarly = false>
__device__ __forceinline__ void bwd_load(const BwdTmaMaps& maps, const BwdParams& p, unsigned char* sK,
                                         unsigned char* sV, unsigned char* sQ, unsigned char* sdO, float* sRowC,
                                         float* sDelta, uint64_t* bar_kv, uint64_t* bar_kv_empty,
                                         uint64_t* bar_full, uint64_t* bar_empty, int lane, int n0, int hkv, int b,
                                         int n_iters, const BwdSteps& steps, int done, int item) {
  constexpr int kBM = Tile::kBM, kStages = Tile::kStages, kStatsPerLane = (kBM + 31) / 32;
  const int I = p.I, H = p.H;
  if (lane == 0 && item == 0) {
    tma_prefetch_map(&maps.q);
    tma_prefetch_map(&maps.dout);
  }
  auto load_kv = [&] {
    if (lane != 0) return;
    if (item > 0) mbar_wait(bar_kv_empty, (item - 1) & 1);
    bwd_load_kv<Tile, D>(maps, sK, sV, bar_kv, n0, hkv, b);
  };
  // K, V go in before step kv_at's stage (at the start in the first item, whose code is that of the
  // instances with a CTA an item: with the load in the loop their consumers spilled more, run AG3's
  // biased backward 5 % slower).
  const int kv_at = item == 0 ? 0 : min(kStages, n_iters);
  const bool early = kEarly && p.bwd_early_loads;
  if (kv_at == 0 && !early) load_kv();
  auto load_stage = [&](int s, int h, int m0) {
#pragma unroll
    for (int blk = 0; blk < D / 64; ++blk) {
      tma_load_4d(sQ + s * Tile::kQBytes + blk * kBM * kSw128Row, &maps.q, blk * 64, m0, h, b, bar_full + s);
      tma_load_4d(sdO + s * Tile::kQBytes + blk * kBM * kSw128Row, &maps.dout, blk * 64, m0, h, b, bar_full + s);
    }
  };
  const float* gRowC = static_cast<const float*>(p.row_offset);
  const float* gDelta = static_cast<const float*>(p.delta);
  const float delta_scale = bwd_ds_scale(kFoldScale, kPShift, p.scale);  // D_i as the consumers use it
  for (int it = 0; it < n_iters; ++it) {
    if (kv_at > 0 && it == kv_at) load_kv();
    const int gi = done + it, s = gi % kStages, h = steps.h(it), m0 = steps.m0(it);
    float rc[kStatsPerLane], rd[kStatsPerLane];
#pragma unroll
    for (int i = 0; i < kStatsPerLane; ++i) {
      const int r = m0 + lane + 32 * i;
      const int64_t row = (int64_t(b) * H + h) * I + r;
      rc[i] = r < I ? (kPShift != 0 ? gRowC[row] + float(kPShift) : gRowC[row]) : -INFINITY;
      rd[i] = r < I ? gDelta[row] * delta_scale : 0.f;
    }
    if (gi >= kStages) mbar_wait(bar_empty + s, ((gi / kStages) - 1) & 1);
    if (early && lane == 0) {  // full[s] cannot complete before the 32 arrivals below
      mbar_expect_tx(bar_full + s, 2 * Tile::kQBytes);
      load_stage(s, h, m0);
    }
#pragma unroll
    for (int i = 0; i < kStatsPerLane; ++i) {
      if (kBM % 32 != 0 && lane + 32 * i >= kBM) break;
      sRowC[s * Tile::kStatSlots + Tile::stat_slot(lane + 32 * i)] = rc[i];
      sDelta[s * Tile::kStatSlots + Tile::stat_slot(lane + 32 * i)] = rd[i];
    }
    if (!early && lane == 0) {
      mbar_arrive_expect_tx(bar_full + s, 2 * Tile::kQBytes);
      load_stage(s, h, m0);
    } else {
      mbar_arrive(bar_full + s);
    }
  }
  if (kv_at > 0 && kv_at >= n_iters) load_kv();  // a later item of no more steps than kStages
}

// A persistent grid (the kernel's kPersist): the producer's roles over the CTA's items, the first
// blockIdx.x and the next from the item queue (item_at: an item's index to its BwdItem, bwd_order.h),
// until one past the grid's `items`. `done` counts the steps of the items before, for the barriers'
// phases. (These two loops and the consumers' in bwd_hopper_ws.cuh differ only in their body and how
// they get the next item; one helper taking both as lambdas changed the bf16 kPersist instances' code,
// cuobjdump: spill instructions 122 -> 149 at d 64, 149 -> 166 at d 128, outside the step loop; not
// measured on a GPU, so the loops stay written out.)
template <typename Tile, typename ItemAt>
__device__ __forceinline__ void bwd_dq_reduce_items(const BwdTmaMaps& maps, const BwdParams& p, unsigned char* sdQ,
                                                    uint64_t* bar_dq_full, uint64_t* bar_dq_empty, int cc,
                                                    const BwdItemQueue& queue, int64_t items, ItemAt item_at) {
  int done = 0;
  unsigned w = blockIdx.x;
  for (int item = 0;; ++item) {
    const BwdItem x = item_at(w);
    bwd_dq_reduce<Tile, false, false>(maps, p, sdQ, bar_dq_full, bar_dq_empty, cc, x.b, x.hkv, x.order.turns,
                                      x.n_steps, x.order.steps, done, w);
    done += x.n_steps;
    w = queue.read(item);
    if (int64_t(w) >= items) break;
  }
}
template <typename Tile, int D, bool kFoldScale, int kPShift, typename ItemAt>
__device__ __forceinline__ void bwd_load_items(const BwdTmaMaps& maps, const BwdParams& p, unsigned char* sK,
                                               unsigned char* sV, unsigned char* sQ, unsigned char* sdO,
                                               float* sRowC, float* sDelta, uint64_t* bar_kv, uint64_t* bar_kv_empty,
                                               uint64_t* bar_full, uint64_t* bar_empty, int lane,
                                               const BwdItemQueue& queue, int64_t items, ItemAt item_at) {
  int done = 0;
  unsigned w = blockIdx.x;
  for (int item = 0;; ++item) {
    const BwdItem x = item_at(w);
    bwd_load<Tile, D, kFoldScale, kPShift>(maps, p, sK, sV, sQ, sdO, sRowC, sDelta, bar_kv, bar_kv_empty, bar_full,
                                           bar_empty, lane, x.n0, x.hkv, x.b, x.n_steps, x.order.steps, done, item);
    done += x.n_steps;
    w = __shfl_sync(0xffffffffu, lane == 0 ? queue.publish(p.item_counter, item) : 0u, 0);
    if (int64_t(w) >= items) break;
  }
}

}  // namespace flashcos::cuda::hopper
