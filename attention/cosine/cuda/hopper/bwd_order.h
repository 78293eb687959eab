// The Hopper backward's order of work, host and device code (tests/test_hopper_bwd_order.cpp
// simulates it on the CPU): which key block and (b, kv head) a CTA takes (bwd_cta), which query
// unit each of its steps covers (BwdSteps), and in the deterministic mode its turn in the fixed
// order of the adds into each dQ unit (DqTurns). The kernel: bwd_hopper_ws.cuh; the launcher's
// choice of order: bwd_hopper.cuh (launch_bwd_hopper_ws).
#pragma once

#include <cstdint>

#include "attention/cosine/cuda/params.h"

#if defined(__CUDACC__)
#define FLASHCOS_HD __host__ __device__ __forceinline__
#else
#define FLASHCOS_HD inline
#endif

namespace flashcos::cuda::hopper {

FLASHCOS_HD int order_min(int a, int b) { return a < b ? a : b; }

// Which key block and (b, kv head) the CTA takes, from its index in the linear grid (the launcher
// picks p.key_band and p.head_group). Bands of p.key_band key blocks: band slowest, then (b, kv
// head), then the key block inside the band. Band 1 (key block slowest) puts every (b, kv head)'s
// block 0, the one with the most query rows under a causal mask, first instead of the last (b,
// head)'s long CTAs trailing the others. A band of every key block (not causal: key block fastest)
// lets the CTAs running together share one (b, head)'s Q / dO in L2, and add into the same dQ
// units while those are in L2. Deterministic, not causal: bands of up to 64 key blocks in the
// rotated order (DqTurns). p.head_group > 0 (causal): groups of that many (b, kv head)s slowest,
// key block slowest inside a group: the long blocks still first, and the CTAs running together add
// into a few heads' dQ (with key block slowest over every head, the adds into one dQ unit came a
// wave of CTAs apart, past L2: 32 heads' dQ is 64 MiB at d 64); deterministic, each block's steps
// backwards (DqTurns).
struct BwdCta {
  int n_block, hb;
  int band_first, band_w;  // the key blocks before this one's band, and the band's width
};
FLASHCOS_HD BwdCta bwd_cta(const BwdParams& p, unsigned block, int n_blocks, int heads_batches) {
  if (p.head_group > 0) {
    const int g_ctas = p.head_group * n_blocks;
    const int g_idx = int(block / unsigned(g_ctas)), in_g = int(block % unsigned(g_ctas));
    const int g_w = order_min(p.head_group, heads_batches - g_idx * p.head_group);  // the last group may be narrower
    const int n_block = in_g / g_w;
    return {n_block, g_idx * p.head_group + in_g % g_w, n_block, 1};
  }
  const int band = p.key_band, band_ctas = band * heads_batches;
  const int band_idx = int(block / unsigned(band_ctas)), in_band = int(block % unsigned(band_ctas));
  const int band_w = order_min(band, n_blocks - band_idx * band);  // the last band may be narrower
  return {band_idx * band + in_band % band_w, in_band / band_w, band_idx * band, band_w};
}

// Which query head and rows step `it` of a CTA covers: unit (it + rot) % n of the kv head's n units,
// or unit n - 1 - it with rev, the kv head's query heads outer, row blocks of kBM inner, from row
// block m_start (causal: the first with a key of this block). rot and rev are 0 but in the
// deterministic orders (DqTurns).
struct BwdSteps {
  int head0, per_head, m_start, bm, rot, n, rev;
  FLASHCOS_HD int unit(int it) const {
    if (rev) return n - 1 - it;
    if (rot == 0) return it;
    const int x = it + rot;
    return x >= n ? x - n : x;
  }
  FLASHCOS_HD int h(int it) const { return head0 + unit(it) / per_head; }
  FLASHCOS_HD int m0(int it) const { return (m_start + unit(it) % per_head) * bm; }
};

// Deterministic mode: the turn of this CTA (key block) in the fixed order of the adds into each dQ
// unit (dq_semaphore.cuh), as the count of adds it waits for.
// * Key-block order (w 1): every lower key block first, the sm_80 kernel's order. A block waits for
//   lower blocks only, which were launched before it. With a causal mask the Hopper blocks run in
//   head groups (bwd_cta): at d 128 they go through their units backwards (BwdSteps::rev), from
//   the last row block to their diagonal, so that the blocks of a group that start together reach
//   each unit together and each trails the one below it by the time one add takes to be counted
//   (forwards, block n would reach its diagonal n steps before block 0 and wait for it); at d 64,
//   forwards in groups of 16 (the launcher, bwd_hopper.cuh, has the timings of both).
// * Rotated (w > 1; not causal): every key block of the earlier bands first (`first` of them).
//   Inside a band of w key blocks, block r starts at unit rot(r) = floor(r n / w) of the n units and
//   goes round (BwdSteps), and each unit takes the band's blocks in the order they reach it running
//   side by side: the block that started last at or before unit x (r0 = the largest r with rot(r)
//   <= x), then r0 - 1, .., 0, w - 1, .., r0 + 1. So no block waits for a turn while the band runs
//   at one pace; in key-block order block r of a band starting together waited r steps before its
//   first add. The order follows each block's own step order, so the waits have no cycle provided
//   a block counts its adds before it waits for a turn (bwd_dq_reduce) and the band's blocks are
//   resident together (the launcher keeps a band within the SMs).
struct DqTurns {
  int first, r, w, n;
  FLASHCOS_HD int rot() const { return w > 1 ? int(int64_t(r) * n / w) : 0; }
  FLASHCOS_HD int target(const BwdSteps& steps, int it) const {
    if (w <= 1) return first + r;
    const int x = steps.unit(it);
    const int r0 = order_min(w - 1, int((int64_t(x + 1) * w + n - 1) / n) - 1);
    return first + (r0 - r + w) % w;
  }
};

// The kernel's turns and steps for a CTA (cta) whose n_iters steps cover per_head row blocks of bm
// rows from m_start, for each query head from head0 (det: the kernel's deterministic instance).
struct BwdOrder {
  DqTurns turns;
  BwdSteps steps;
};
FLASHCOS_HD BwdOrder bwd_order(const BwdParams& p, const BwdCta& cta, int head0, int per_head, int m_start, int bm,
                               int n_iters, bool det) {
  const DqTurns turns{cta.band_first, cta.n_block - cta.band_first, det && p.det_rotate ? cta.band_w : 1, n_iters};
  return {turns, BwdSteps{head0, per_head, m_start, bm, det ? turns.rot() : 0, n_iters, det && p.det_reverse ? 1 : 0}};
}

}  // namespace flashcos::cuda::hopper
