// The Hopper backward's order of work, host and device code (tests/test_hopper_bwd_order.cpp
// simulates it on the CPU): which key block and (b, kv head) a CTA takes (bwd_cta), which query
// unit each of its steps covers (BwdSteps), and in the deterministic mode its turn in the fixed
// order of the adds into each dQ unit (DqTurns); and which order a launch takes (choose_bwd_order,
// host only). The kernel: bwd_hopper_ws.cuh; the launcher: bwd_hopper.cuh.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/cosine/cuda/hopper/head_groups.h"
#include "attention/cosine/cuda/hopper/split_tail.h"
#include "attention/cosine/cuda/params.h"

namespace flashcos::cuda::hopper {

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
    const GroupedCta g = grouped_cta(block, n_blocks, heads_batches, p.head_group);
    return {g.rank, g.hb, g.rank, 1};
  }
  const int band = p.key_band, band_ctas = band * heads_batches;
  const int band_idx = int(block / unsigned(band_ctas)), in_band = int(block % unsigned(band_ctas));
  const int band_w = order_min(band, n_blocks - band_idx * band);  // the last band may be narrower
  return {band_idx * band + in_band % band_w, in_band / band_w, band_idx * band, band_w};
}

// The first query row of a key block's steps (from key n0 on) and their count per query head: row 0,
// or with a causal mask the first row that sees key n0 (n0 - (J - I)); on_grid rounds it down to a
// multiple of bm, where the steps must keep to the row-block grid (every instance but the plain
// 80-row one: the deterministic mode's dQ units, and the 64 / 128-row steps, which the grid aligns
// with the key blocks when J = I). Off the grid, a causal 80-row step no longer covers rows that see
// none of the block's keys: the first step starts at the diagonal (at n 8192 1.1 % fewer steps).
struct BwdRows {
  int first, per_head;
};
FLASHCOS_HD BwdRows bwd_rows(const BwdParams& p, int n0, int bm, bool on_grid) {
  int first = 0;
  if (p.causal) {
    first = n0 - (p.J - p.I);
    if (first < 0) first = 0;
    if (on_grid) first = first / bm * bm;
  }
  return {first, first < p.I ? (p.I - first + bm - 1) / bm : 0};
}

// Which query head and rows step `it` of a CTA covers: unit (it + rot) % n of the kv head's n units,
// or unit n - 1 - it with rev, the kv head's query heads outer, blocks of bm rows inner, from row
// row0 (BwdRows::first). rot and rev are 0 but in the deterministic orders (DqTurns).
struct BwdSteps {
  int head0, per_head, row0, bm, rot, n, rev;
  FLASHCOS_HD int unit(int it) const {
    if (rev) return n - 1 - it;
    if (rot == 0) return it;
    const int x = it + rot;
    return x >= n ? x - n : x;
  }
  FLASHCOS_HD int h(int it) const { return head0 + unit(it) / per_head; }
  FLASHCOS_HD int m0(int it) const { return row0 + unit(it) % per_head * bm; }
};

// Deterministic mode: the turn of this CTA (key block) in the fixed order of the adds into each dQ
// unit (dq_semaphore.cuh), as the count of adds it waits for.
// * Key-block order (w 1): every lower key block first, the sm_80 kernel's order. A block waits for
//   lower blocks only, which were launched before it. With a causal mask the Hopper blocks run in
//   head groups (bwd_cta): at d 128 they go through their units backwards (BwdSteps::rev), from
//   the last row block to their diagonal, so that the blocks of a group that start together reach
//   each unit together and each trails the one below it by the time one add takes to be counted
//   (forwards, block n would reach its diagonal n steps before block 0 and wait for it); at d 64,
//   forwards in groups of 16 (choose_bwd_order, below, has the timings of both).
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

// The kernel's turns and steps for a CTA (cta) whose n_iters steps cover rows.per_head blocks of bm
// rows from rows.first, for each query head from head0 (det: the kernel's deterministic instance).
struct BwdOrder {
  DqTurns turns;
  BwdSteps steps;
};
FLASHCOS_HD BwdOrder bwd_order(const BwdParams& p, const BwdCta& cta, int head0, const BwdRows& rows, int bm,
                               int n_iters, bool det) {
  const DqTurns turns{cta.band_first, cta.n_block - cta.band_first, det && p.det_rotate ? cta.band_w : 1, n_iters};
  return {turns,
          BwdSteps{head0, rows.per_head, rows.first, bm, det ? turns.rot() : 0, n_iters, det && p.det_reverse ? 1 : 0}};
}

// One item of the backward's work: what a CTA of the grid takes, or on a persistent grid (the
// kernel's kPersist) each of a CTA's items in turn. Item w is a key block and (b, kv head) (bwd_cta), or
// with a split tail (split_tail.h; may_split: the plain instance) a piece of one, whose steps are its
// share of the block's, from its first (steps.rot). biased: the kBias instances, which take (b, kv
// head) batch fastest for an (H, I, J) bias, so that the CTAs of one (key block, head) run side by
// side and their bias loads and dbias reductions meet in L2 (with band 1, choose_bwd_order);
// rows_on_grid: as bwd_rows; det: the deterministic instances (bwd_order). The kernel computes its
// first item's the same way inline (bwd_hopper_ws.cuh).
struct BwdItem {
  SplitPiece piece;
  BwdCta cta;
  int hkv, b, n0;  // n0: the block's first key
  BwdRows rows;
  int n_steps;     // this item's steps (a piece: its share of the block's)
  BwdOrder order;
};
FLASHCOS_HD BwdItem bwd_item(const BwdParams& p, unsigned w, int bn, int bm, bool may_split, bool biased,
                             bool rows_on_grid, bool det) {
  BwdItem x;
  const int n_blocks = (p.J + bn - 1) / bn, heads_batches = p.Hkv * p.B, group = p.H / p.Hkv;
  x.piece = may_split ? split_piece(p, w) : SplitPiece{int(w), 0, 1, -1};
  x.cta = bwd_cta(p, unsigned(x.piece.block), n_blocks, heads_batches);
  const bool batch_fastest = biased && !p.bias_batch_dim;
  x.hkv = batch_fastest ? x.cta.hb / p.B : x.cta.hb % p.Hkv;
  x.b = batch_fastest ? x.cta.hb % p.B : x.cta.hb / p.Hkv;
  x.n0 = x.cta.n_block * bn;
  x.rows = bwd_rows(p, x.n0, bm, rows_on_grid);
  const int n_iters = group * x.rows.per_head;  // the block's steps
  const int step0 = split_piece_first(n_iters, x.piece.piece, x.piece.pieces);
  x.n_steps = split_piece_first(n_iters, x.piece.piece + 1, x.piece.pieces) - step0;
  x.order = bwd_order(p, x.cta, x.hkv * group, x.rows, bm, n_iters, det);
  if (may_split) x.order.steps.rot = step0;  // a piece starts at its first step (rot is 0 here otherwise)
  return x;
}
// The items of a grid of `blocks` key blocks x (b, kv head)s: one each, and split_pieces for each of
// the last blocks from p.split_first on (split_tail.h).
FLASHCOS_HD int64_t bwd_grid_items(const BwdParams& p, int64_t blocks) {
  return p.split_first >= blocks ? blocks : p.split_first + (blocks - p.split_first) * p.split_pieces;
}

// The knobs of choose_bwd_order; the launcher reads them from the environment (bwd_hopper.cuh).
struct BwdOrderKnobs {
  bool det_orders = true;     // deterministic: rotated / head-grouped, else key-block order over every head
  int det_band = 0;           // deterministic, not causal: key blocks per band; 0: the default
  int causal_group = 2;       // causal: (b, kv head)s per group; 0: key block slowest over every head
  bool causal_group_fixed = false;  // causal, not deterministic: exactly causal_group, else at least (below)
  int det_causal_group = -1;  // deterministic, causal: groups with the steps forwards; -1: the default
};

// Which order the launch of tiles of d_tile (64 / 128) columns and block_keys keys per CTA takes, on
// a GPU of sms SMs (read by the deterministic rotated order and the causal head groups): sets
// p.key_band, p.head_group, p.det_rotate and p.det_reverse (bwd_cta, bwd_order).
// * Not causal: every key block of a (b, kv head) side by side (one band), sharing its Q / dO in L2.
//   Deterministic: bands of 64 key blocks in the rotated order (DqTurns), kept within the SMs, as
//   it may wait for a block launched after it. H100 bf16 b4 h8 n 8192 (64 key blocks),
//   deterministic backward ms (run F2 of 2026-11-26 night): rotated, bands 8 / 16 / 32 / 64: d64 4.71
//   / 2.94-2.99 / 2.79-2.84 / 2.85-2.87, d128 8.11 (16) / 5.58 (32) / 5.48-5.50 (64); key-block order
//   with 8 / 16: 3.07-3.11 and 5.95-5.96; not deterministic 2.47-2.65 and 4.84-4.93. Narrow rotated
//   bands read many heads' Q / dO at once, spread over each head (16 heads' 2 or 4 MiB at band 8 /
//   16: past what L2 holds); in key-block order block r of a band waits r steps before its first
//   add. (Before 2026-11-26 night, and with det_orders off: key-block order in bands of 8 / 16.)
// * Causal (and with a bias): key block slowest, the longest blocks first. With a bias over every
//   (b, kv head), so that the CTAs running together share the bias rows they read and the dbias rows
//   they add to. Without one in head groups of causal_group (b, kv head)s, so that the adds into one
//   dQ unit come close together in L2. Run F3, causal backward TFLOP/s by group 0 / 1 / 2 / 4 / 8 (two
//   rounds), n 8192 d64: 479-478 / 493-491 / 509-508 / 508-502 / 510-508, d128: 490-491 / 531-552 /
//   544-542 / 538-542 / 516-535; n 16384 d64: 460-449 / 520-519 / 516-510 / 515-517 / 505-511, d128:
//   515-511 / 582-580 / 580-580 / 577-574 / 565-567. The group of 2 grows until it holds twice the
//   SMs in CTAs, up to 16 (filling_head_group, head_groups.h; b4 h8 on 132 SMs: 16 at n 1024, 4 at
//   n 8192, 2 from n 16384), as the last group's long blocks started late on short sequences;
//   FLASHCOS_HOPPER_CAUSAL_GROUP fixes it.
// * Causal, deterministic, no bias: at d 64 head groups of 16 with the steps forwards, in key-block
//   order (the blocks of a group that start together wait for the ones below them; past the first
//   wave a block mostly launches after the one below it has passed its diagonal); at d 128 groups of
//   causal_group with each block's steps backwards (DqTurns). Causal backward ms, n 8192 / 16384 (run
//   F10; not deterministic d64 1.35 / 5.25-5.35, d128 2.41-2.63 / 9.50-9.53): d64 forwards in groups
//   of 2 / 4 / 8 / 16: 2.60 / 2.03 / 1.65 / 1.54 and 7.69 / 6.40-6.52 / 5.88-6.01 / 5.92-6.03,
//   key-block order over every head 1.65 / 6.22, backwards in groups of 2 1.89 / 6.47 (F6); d128
//   forwards 4.39-4.48 / 3.59-3.61 / 3.21 / 3.10-3.11 and 13.44-13.57 / 11.90-12.18 / 11.59 /
//   11.45-11.52, backwards in groups of 2 2.90-2.91 / 11.03-11.04.
inline void choose_bwd_order(BwdParams& p, int d_tile, int block_keys, int sms, const BwdOrderKnobs& k) {
  const bool det = p.dq_semaphore != nullptr, biased = p.bias != nullptr;
  const int n_blocks = (p.J + block_keys - 1) / block_keys;
  p.key_band = p.causal || biased ? 1 : n_blocks;
  p.head_group = 0;
  p.det_rotate = p.det_reverse = false;
  if (det && !p.causal && !biased) {
    const int band = k.det_band > 0 ? k.det_band : k.det_orders ? 64 : d_tile == 128 ? 16 : 8;
    p.key_band = std::min(band, n_blocks);
    p.det_rotate = k.det_orders && p.key_band > 1;
    if (p.det_rotate) p.key_band = std::min(p.key_band, std::max(1, sms));
  }
  if (p.causal && !biased) {
    if (!det) {
      p.head_group = k.causal_group_fixed ? k.causal_group
                                          : filling_head_group(k.causal_group, n_blocks, int64_t(p.B) * p.Hkv, sms);
    } else if (k.det_orders) {
      const int group = k.det_causal_group >= 0 ? k.det_causal_group : d_tile == 64 ? 16 : -1;
      p.head_group = group >= 0 ? group : k.causal_group;
      p.det_reverse = group < 0 && p.head_group > 0;
    }
  }
}

}  // namespace flashcos::cuda::hopper
