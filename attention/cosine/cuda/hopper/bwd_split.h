// The Hopper backward's split tail, host and device code (tests/test_hopper_bwd_order.cpp checks it
// on the CPU). Without a causal mask every CTA of the plain backward (one key block of one (b, kv
// head), bwd_order.h) takes the same number of steps, so a grid of C CTAs on M SMs (one CTA each)
// runs ceil(C / M) waves, and its last wave leaves SMs idle (b4 h8 n 8192: 2,048 CTAs on 132 SMs,
// 15.5 waves, the 16th half empty; n 16384: 4,096, 31.03 waves). choose_bwd_split splits the grid's
// last CTAs into pieces: piece k of P takes steps [k n / P, (k + 1) n / P) of the block's n, and adds
// its dQ as any CTA does. Its dK / dV are partial: each piece stores them (fp32) to its slot of
// p.split_scratch and counts on p.split_count; the piece that counts last adds the slots in piece
// order (its own from registers), so that dK / dV do not depend on which piece finishes last, and
// stores them. Few SMs wait for the last CTAs, at the cost of each piece's K / V load, pipeline fill
// and dK / dV slot (kBwdSplitCostSteps, an estimate).
#pragma once

#include <cstdint>

#include <functional>
#include <mutex>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/cosine/cuda/hopper/head_groups.h"  // FLASHCOS_HD
#include "attention/cosine/cuda/params.h"

namespace flashcos::cuda::hopper {

// Which block of the unsplit grid (bwd_cta's index) CTA `block` runs, and which of its pieces.
struct BwdPiece {
  int block;  // the unsplit grid's index
  int piece, pieces;
  int slot;  // the split block's index (block - p.split_first), -1 if not split
};
FLASHCOS_HD BwdPiece bwd_piece(const BwdParams& p, unsigned block) {
  if (block < unsigned(p.split_first)) return {int(block), 0, 1, -1};
  const int r = int(block - unsigned(p.split_first));
  return {p.split_first + r / p.split_pieces, r % p.split_pieces, p.split_pieces, r / p.split_pieces};
}
// The steps [first, end) of n that piece `piece` of `pieces` takes.
FLASHCOS_HD int bwd_piece_first(int n, int piece, int pieces) { return int(int64_t(n) * piece / pieces); }

struct BwdSplit {
  int units = 0;   // the grid's last `units` blocks run as `pieces` CTAs each
  int pieces = 1;
};
constexpr int kBwdSplitMaxPieces = 8;
constexpr int kBwdSplitMinSteps = 2;    // steps per piece at least
constexpr int kBwdSplitCostSteps = 4;   // what a CTA costs beyond its steps, in steps (an estimate)

// The time, in steps, of `ctas` blocks of `steps` steps, the last `units` of them in `pieces` pieces,
// on `sms` SMs that take the grid in order as they come free, one CTA each.
inline int64_t bwd_split_makespan(int64_t ctas, int steps, int sms, int units, int pieces) {
  const int64_t whole = ctas - units, cost = steps + kBwdSplitCostSteps;
  const int64_t piece_cost = (steps + pieces - 1) / pieces + kBwdSplitCostSteps;
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> free_at;
  int64_t end = 0;
  for (int i = 0; i < sms; ++i) {
    const int64_t t = (whole / sms + (i < whole % sms ? 1 : 0)) * cost;
    free_at.push(t);
    end = t > end ? t : end;
  }
  for (int64_t k = 0; k < int64_t(units) * pieces; ++k) {
    const int64_t t = free_at.top() + piece_cost;
    free_at.pop();
    free_at.push(t);
    end = t > end ? t : end;
  }
  return end;
}

// The split that finishes `ctas` blocks of `steps` steps soonest on `sms` SMs (bwd_split_makespan),
// if it saves at least 1 %; otherwise none. Tried: the last partial wave, or it and one or two
// waves before it (all blocks if they fit in two waves), in 2 .. kBwdSplitMaxPieces pieces of at
// least kBwdSplitMinSteps steps, with no more than max_slots pieces in all (each piece's dK / dV slot
// is 256 x D floats: 128 KiB at d 128). Cached per arguments.
inline BwdSplit choose_bwd_split(int64_t ctas, int steps, int sms, int64_t max_slots) {
  BwdSplit best;
  if (ctas < 1 || steps < 2 * kBwdSplitMinSteps || sms < 2) return best;
  using Key = std::tuple<int64_t, int, int, int64_t>;
  static std::mutex mutex;
  static std::vector<std::pair<Key, BwdSplit>> cache;
  const Key key{ctas, steps, sms, max_slots};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    for (const auto& e : cache)
      if (e.first == key) return e.second;
  }
  const int64_t base = bwd_split_makespan(ctas, steps, sms, 0, 1);
  int64_t best_time = base - (base + 99) / 100;  // at least 1 % sooner
  std::vector<int64_t> candidates;
  if (ctas <= 2 * int64_t(sms)) candidates.push_back(ctas);
  for (int w = 0; w < 3; ++w) {
    const int64_t u = ctas % sms + int64_t(w) * sms;
    if (u > 0 && u <= ctas) candidates.push_back(u);
  }
  for (const int64_t u : candidates) {
    for (int pieces = 2; pieces <= kBwdSplitMaxPieces && pieces * kBwdSplitMinSteps <= steps; ++pieces) {
      if (u * pieces > max_slots) break;
      const int64_t t = bwd_split_makespan(ctas, steps, sms, int(u), pieces);
      if (t < best_time) {
        best_time = t;
        best = {int(u), pieces};
      }
    }
  }
  const std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() > 64) cache.clear();
  cache.emplace_back(key, best);
  return best;
}

}  // namespace flashcos::cuda::hopper
