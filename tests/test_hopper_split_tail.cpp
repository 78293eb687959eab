// The Hopper kernels' split tail (attention/cosine/cuda/hopper/split_tail.h), on the CPU, no GPU
// needed: the plan against the greedy schedule it models (checked here by a second, independent
// simulation), and the pieces of a split grid covering every block's steps once, as the backward
// (BwdParams) and the forward (FwdParams) decode them. The kernels' results with a split tail: the
// attention grid's small cases, which the plan splits, and FusedAttentionMisc.ForwardSplitTail* (GPU).
#include <gtest/gtest.h>

#ifdef FLASHCOS_WITH_CUDA
#include "attention/cosine/cuda/hopper/split_tail.h"
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

#ifdef FLASHCOS_WITH_CUDA
using flashcos::cuda::BwdParams;
using flashcos::cuda::FwdParams;
using namespace flashcos::cuda::hopper;

// The schedule written again: CTA by CTA in grid order, each to the SM that comes free first.
int64_t schedule(int64_t ctas, int steps, int sms, const TailSplit& split) {
  std::vector<int64_t> free_at(sms, 0);
  const int64_t whole = ctas - split.units;
  const int64_t n = whole + int64_t(split.units) * split.pieces;
  for (int64_t c = 0; c < n; ++c) {
    const bool is_piece = c >= whole;
    const int64_t cost = (is_piece ? (steps + split.pieces - 1) / split.pieces : steps) + kTailSplitCostSteps;
    auto it = std::min_element(free_at.begin(), free_at.end());
    *it += cost;
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

TEST(HopperSplitTail, PlanIsSoonerThanNoSplitAndWithinItsLimits) {
  struct Case {
    int64_t ctas;
    int steps, sms;
  };
  // b4 h8 n 8192 / 16384 d 128 (80-row steps), the same at d 64 (128-row steps), exact waves,
  // small grids, a 1-step block and odd SM counts.
  const Case cases[] = {{2048, 103, 132}, {4096, 206, 132}, {2048, 64, 132}, {4096, 128, 132}, {2112, 103, 132},
                        {32, 4, 132},     {16, 13, 132},    {3, 1, 132},     {1, 1000, 132},  {1000, 7, 114},
                        {777, 63, 78},    {256, 13, 132}};
  int split_some = 0;
  for (const Case& c : cases) {
    const int64_t max_slots = 2 * int64_t(c.sms);
    const TailSplit s = choose_tail_split(c.ctas, c.steps, c.sms, max_slots);
    const int64_t none = schedule(c.ctas, c.steps, c.sms, TailSplit{});
    EXPECT_EQ(tail_split_makespan(c.ctas, c.steps, c.sms, 0, 1), none) << c.ctas << " x " << c.steps;
    if (s.units == 0) {
      EXPECT_EQ(s.pieces, 1);
      continue;
    }
    ++split_some;
    EXPECT_GE(s.pieces, 2);
    EXPECT_LE(s.pieces, kTailSplitMaxPieces);
    EXPECT_LE(int64_t(s.units) * s.pieces, max_slots);
    EXPECT_LE(s.units, c.ctas);
    EXPECT_GE(c.steps / s.pieces, kTailSplitMinSteps) << c.ctas << " x " << c.steps;
    const int64_t with = schedule(c.ctas, c.steps, c.sms, s);
    EXPECT_EQ(tail_split_makespan(c.ctas, c.steps, c.sms, s.units, s.pieces), with);
    EXPECT_LE(with * 100, none * 99) << c.ctas << " x " << c.steps << ": a split that saves under 1 %";
  }
  EXPECT_GE(split_some, 4);
  // A grid of whole waves gains nothing from a split; a few blocks on many SMs gain most.
  EXPECT_EQ(choose_tail_split(2112, 103, 132, 264).units, 0);
  EXPECT_EQ(choose_tail_split(16, 13, 132, 264).units, 16);
  // The same answer from the cache.
  const TailSplit a = choose_tail_split(2048, 103, 132, 264), b = choose_tail_split(2048, 103, 132, 264);
  EXPECT_EQ(a.units, b.units);
  EXPECT_EQ(a.pieces, b.pieces);
}

// Every block's steps covered once by the CTAs of a split grid, each split block's slot by `pieces`
// pieces; Params: the launcher's split_first / split_pieces in BwdParams or FwdParams.
template <typename Params>
void expect_pieces_cover_every_step() {
  for (const int64_t ctas : {1, 5, 68, 200}) {
    for (const int pieces : {2, 3, 8}) {
      for (const int steps : {16, 17, 103}) {
        Params p;
        const int units = int(std::min<int64_t>(ctas, 7));
        p.split_first = int(ctas - units);
        p.split_pieces = pieces;
        const int64_t grid = ctas - units + int64_t(units) * pieces;
        std::vector<std::vector<int>> covered(ctas, std::vector<int>(steps, 0));
        std::vector<int> slot_pieces(units, 0);
        for (int64_t x = 0; x < grid; ++x) {
          const SplitPiece pc = split_piece(p, unsigned(x));
          ASSERT_TRUE(pc.block >= 0 && pc.block < ctas);
          if (x < p.split_first) {
            ASSERT_EQ(pc.pieces, 1);
            ASSERT_EQ(pc.slot, -1);
          } else {
            ASSERT_EQ(pc.pieces, pieces);
            ASSERT_EQ(pc.slot, pc.block - p.split_first);
            ++slot_pieces[pc.slot];
          }
          const int first = split_piece_first(steps, pc.piece, pc.pieces);
          const int end = split_piece_first(steps, pc.piece + 1, pc.pieces);
          ASSERT_LT(first, end) << "a piece without steps";
          for (int s = first; s < end; ++s) ++covered[pc.block][s];
        }
        for (int64_t c = 0; c < ctas; ++c)
          for (int s = 0; s < steps; ++s) ASSERT_EQ(covered[c][s], 1) << "block " << c << " step " << s;
        for (int u = 0; u < units; ++u) EXPECT_EQ(slot_pieces[u], pieces);
      }
    }
  }
}

TEST(HopperSplitTail, PiecesCoverEveryBlocksStepsOnce) {
  expect_pieces_cover_every_step<BwdParams>();
  expect_pieces_cover_every_step<FwdParams>();
}
#else
TEST(HopperSplitTail, NeedsTheCudaBuild) { GTEST_SKIP() << "built without CUDA"; }
#endif

}  // namespace
