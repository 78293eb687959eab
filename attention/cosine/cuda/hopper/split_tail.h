// The Hopper kernels' split tail, host and device code (tests/test_hopper_split_tail.cpp checks it
// on the CPU). Without a causal mask every CTA of the plain backward (one key block of one (b, kv
// head), bwd_order.h) and of the forward (one row block of one (b, head), fwd_hopper_ws.cuh) takes
// the same number of steps, so a grid of C CTAs on M SMs (one CTA each) runs ceil(C / M) waves, and
// its last wave leaves SMs idle (b4 h8 n 8192 d 128: 2,048 CTAs on 132 SMs, 15.5 waves, the 16th
// half empty; n 16384: 4,096, 31.03 waves). choose_tail_split splits the grid's last CTAs into
// pieces: piece k of P takes steps [k n / P, (k + 1) n / P) of the block's n (the backward's query
// steps, the forward's key blocks). Each piece's result is partial (the backward's dK / dV, the
// forward's unnormalised O and row sums; the backward's dQ adds as any CTA's): each piece stores it
// (fp32) to its slot of p.split_scratch and counts on p.split_count; the piece that counts last adds
// the slots in piece order (its own from registers), so that the sum does not depend on which piece
// finishes last, and stores the result. Few SMs wait for the last CTAs, at the cost of each piece's
// loads, pipeline fill and slot (kTailSplitCostSteps, an estimate).
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

// Which block of the unsplit grid (bwd_cta's, or the forward's, index) CTA `block` runs, and which of
// its pieces. Params: BwdParams or FwdParams, whose split_first / split_pieces the launcher sets.
struct SplitPiece {
  int block;  // the unsplit grid's index
  int piece, pieces;
  int slot;  // the split block's index (block - p.split_first), -1 if not split
};
template <typename Params>
FLASHCOS_HD SplitPiece split_piece(const Params& p, unsigned block) {
  if (block < unsigned(p.split_first)) return {int(block), 0, 1, -1};
  const int r = int(block - unsigned(p.split_first));
  return {p.split_first + r / p.split_pieces, r % p.split_pieces, p.split_pieces, r / p.split_pieces};
}
// The steps [first, end) of n that piece `piece` of `pieces` takes.
FLASHCOS_HD int split_piece_first(int n, int piece, int pieces) { return int(int64_t(n) * piece / pieces); }

struct TailSplit {
  int units = 0;   // the grid's last `units` blocks run as `pieces` CTAs each
  int pieces = 1;
};
constexpr int kTailSplitMaxPieces = 8;
constexpr int kTailSplitMinSteps = 2;    // steps per piece at least
constexpr int kTailSplitCostSteps = 4;   // what a CTA costs beyond its steps, in steps (an estimate)

// The time, in steps, of `ctas` blocks of `steps` steps, the last `units` of them in `pieces` pieces,
// on `sms` SMs that take the grid in order as they come free, one CTA each.
inline int64_t tail_split_makespan(int64_t ctas, int steps, int sms, int units, int pieces) {
  const int64_t whole = ctas - units, cost = steps + kTailSplitCostSteps;
  const int64_t piece_cost = (steps + pieces - 1) / pieces + kTailSplitCostSteps;
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

// The split that finishes `ctas` blocks of `steps` steps soonest on `sms` SMs (tail_split_makespan),
// if it saves at least 1 %; otherwise none. Tried: the last partial wave, or it and one or two
// waves before it (all blocks if they fit in two waves), in 2 .. kTailSplitMaxPieces pieces of at
// least kTailSplitMinSteps steps, with no more than max_slots pieces in all (each piece's dK / dV slot
// is 256 x D floats: 128 KiB at d 128). Cached per arguments.
inline TailSplit choose_tail_split(int64_t ctas, int steps, int sms, int64_t max_slots) {
  TailSplit best;
  if (ctas < 1 || steps < 2 * kTailSplitMinSteps || sms < 2) return best;
  using Key = std::tuple<int64_t, int, int, int64_t>;
  static std::mutex mutex;
  static std::vector<std::pair<Key, TailSplit>> cache;
  const Key key{ctas, steps, sms, max_slots};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    for (const auto& e : cache)
      if (e.first == key) return e.second;
  }
  const int64_t base = tail_split_makespan(ctas, steps, sms, 0, 1);
  int64_t best_time = base - (base + 99) / 100;  // at least 1 % sooner
  std::vector<int64_t> candidates;
  if (ctas <= 2 * int64_t(sms)) candidates.push_back(ctas);
  for (int w = 0; w < 3; ++w) {
    const int64_t u = ctas % sms + int64_t(w) * sms;
    if (u > 0 && u <= ctas) candidates.push_back(u);
  }
  for (const int64_t u : candidates) {
    for (int pieces = 2; pieces <= kTailSplitMaxPieces && pieces * kTailSplitMinSteps <= steps; ++pieces) {
      if (u * pieces > max_slots) break;
      const int64_t t = tail_split_makespan(ctas, steps, sms, int(u), pieces);
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
