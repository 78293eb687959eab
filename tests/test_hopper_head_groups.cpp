// The causal grids' head groups (attention/cosine/cuda/hopper/head_groups.h), on the CPU, no GPU
// needed: grouped_cta covers every (CTA, (b, head)) once, longest CTAs first inside each group;
// filling_head_group's sizes; and, by a list-scheduling simulation of the GPU starting CTAs in
// index order as SMs free up, that the grown groups finish causal grids within 3 % of the best group
// size, where on short sequences the fixed ones (the backward's 2, the forward's 1) take 1.2x
// their bound or more.
#include <gtest/gtest.h>

#ifdef FLASHCOS_WITH_CUDA
#include "attention/cosine/cuda/hopper/head_groups.h"
#endif

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace {

#ifdef FLASHCOS_WITH_CUDA
using namespace flashcos::cuda::hopper;

TEST(HopperHeadGroups, GroupedCtaCoversEveryCtaOnceLongestFirstInEachGroup) {
  for (int per_head : {1, 2, 7, 64}) {
    for (int heads_batches : {1, 3, 32, 33}) {
      for (int group : {1, 2, 4, 5, 32, 64}) {
        SCOPED_TRACE(::testing::Message() << "per_head " << per_head << " heads_batches " << heads_batches
                                          << " group " << group);
        std::vector<int> seen(size_t(per_head) * heads_batches, 0);
        int last_group = -1, last_rank = -1;
        const unsigned blocks = unsigned(per_head) * unsigned(heads_batches);
        for (unsigned block = 0; block < blocks; ++block) {
          const GroupedCta g = grouped_cta(block, per_head, heads_batches, group);
          ASSERT_GE(g.rank, 0);
          ASSERT_LT(g.rank, per_head);
          ASSERT_GE(g.hb, 0);
          ASSERT_LT(g.hb, heads_batches);
          ++seen[size_t(g.hb) * per_head + g.rank];
          // Groups in turn; inside one, the ranks never go back (every (b, head)'s rank r before r + 1).
          const int g_idx = g.hb / group;
          ASSERT_GE(g_idx, last_group);
          if (g_idx == last_group) {
            ASSERT_GE(g.rank, last_rank);
          }
          last_group = g_idx;
          last_rank = g.rank;
        }
        for (int n : seen) ASSERT_EQ(n, 1);
      }
    }
  }
}

TEST(HopperHeadGroups, GroupOneIsEachHeadInTurn) {  // the forward's order before head groups
  for (unsigned block = 0; block < 6 * 5; ++block) {
    const GroupedCta g = grouped_cta(block, 6, 5, 1);
    EXPECT_EQ(g.rank, int(block % 6));
    EXPECT_EQ(g.hb, int(block / 6));
  }
}

TEST(HopperHeadGroups, FillingGroupSizes) {
  struct Case {
    int base;
    int64_t per_head, heads_batches;
    int sms, group;
  };
  const Case cases[] = {
      // Backward, b4 h8 (32 (b, kv head)s), key blocks of 128 on 132 SMs: n 1024 .. 32768 (at n
      // 1024 kMaxHeadGroup; 32 would hold twice the SMs' worth).
      {2, 8, 32, 132, kMaxHeadGroup}, {2, 16, 32, 132, 16}, {2, 32, 32, 132, 8}, {2, 64, 32, 132, 4},
      {2, 128, 32, 132, 2}, {2, 256, 32, 132, 2},
      // Fewer (b, head)s than the group would take: all of them, never below the base.
      {2, 8, 8, 132, 8}, {2, 8, 1, 132, 2},
      // b32 h8 n 1024 (256 (b, head)s): kMaxHeadGroup, not every head.
      {2, 8, 256, 132, kMaxHeadGroup}, {1, 8, 256, 132, kMaxHeadGroup},
      // Forward, from 1: d 64 n 8192 / 16384 (43 / 86 blocks of 192 rows), d 128 n 16384 / 32768
      // (128 / 256 blocks of 128).
      {1, 43, 32, 132, 8}, {1, 86, 32, 132, 4}, {1, 128, 32, 132, 2}, {1, 256, 32, 132, 1},
      // No groups, an unknown SM count, one SM: unchanged.
      {0, 8, 32, 132, 0}, {2, 8, 32, 0, 2}, {1, 8, 32, 1, 1},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(filling_head_group(c.base, c.per_head, c.heads_batches, c.sms), c.group)
        << "base " << c.base << " per_head " << c.per_head << " heads_batches " << c.heads_batches << " sms "
        << c.sms;
  }
}

// The time the GPU takes for CTAs of the given lengths, started in index order, each on the first
// SM to free up.
double makespan(const std::vector<double>& lengths, int sms) {
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int s = 0; s < sms; ++s) free_at.push(0.0);
  double end = 0.0;
  for (double len : lengths) {
    const double start = free_at.top();
    free_at.pop();
    end = std::max(end, start + len);
    free_at.push(start + len);
  }
  return end;
}

// A causal grid of per_head CTAs per (b, head) whose rank r CTA takes length(r), in the group order.
std::vector<double> grid_lengths(int per_head, int heads_batches, int group, const std::function<double(int)>& length) {
  std::vector<double> lengths;
  for (unsigned block = 0; block < unsigned(per_head) * unsigned(heads_batches); ++block)
    lengths.push_back(length(grouped_cta(block, per_head, heads_batches, group).rank));
  return lengths;
}

// Makespan over its bound, max(work / SMs, longest CTA).
double over_bound(const std::vector<double>& lengths, int sms) {
  double work = 0.0, longest = 0.0;
  for (double len : lengths) work += len, longest = std::max(longest, len);
  return makespan(lengths, sms) / std::max(work / sms, longest);
}

// The best of every power-of-two group size (and all (b, head)s in one group): no order of whole
// CTAs reaches the bound where the lengths do not divide evenly over the SMs.
double best_over_groups(int per_head, int heads_batches, const std::function<double(int)>& length, int sms) {
  double best = over_bound(grid_lengths(per_head, heads_batches, heads_batches, length), sms);
  for (int g = 1; g < heads_batches; g *= 2)
    best = std::min(best, over_bound(grid_lengths(per_head, heads_batches, g, length), sms));
  return best;
}

// A causal grid of per_head CTAs per (b, head), rank r taking length(r): the grown group (from
// `base`) within 3 % of the best group size and no worse than `base` itself; on short sequences
// `base` costs 1.2x the bound or more.
void expect_grown_group_near_best(int base, int per_head, int heads_batches, int sms, bool short_sequence,
                                  const std::function<double(int)>& length) {
  const int grown = filling_head_group(base, per_head, heads_batches, sms);
  const double grown_over = over_bound(grid_lengths(per_head, heads_batches, grown, length), sms);
  const double fixed_over = over_bound(grid_lengths(per_head, heads_batches, base, length), sms);
  EXPECT_LT(grown_over, best_over_groups(per_head, heads_batches, length, sms) + 0.03);
  EXPECT_LE(grown_over, fixed_over + 1e-9);
  if (short_sequence) {
    EXPECT_GT(fixed_over, 1.2);  // what the fixed groups cost there
  }
}

TEST(HopperHeadGroups, GrownGroupsFinishShortCausalGridsNearTheBest) {
  const int sms = 132, heads_batches = 32;  // b4 h8
  for (int n : {1024, 2048, 4096, 8192, 16384}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    // Backward, d 128, from groups of 2: key block r of n / 128 sees the 64-row steps from its
    // diagonal on.
    expect_grown_group_near_best(2, n / 128, heads_batches, sms, n <= 2048,
                                 [&](int r) { return double(n / 64 - 2 * r); });
    // Forward, d 64, from groups of 1: row block m of n / 192 (rank r = the last block first) sees
    // (m + 1) 192 keys.
    const int row_blocks = (n + 191) / 192;
    expect_grown_group_near_best(1, row_blocks, heads_batches, sms, n <= 2048,
                                 [&](int r) { return double(row_blocks - r); });
  }
}
#else
TEST(HopperHeadGroups, NeedsTheCudaBuild) { GTEST_SKIP() << "head_groups.h is part of the CUDA build"; }
#endif

}  // namespace
