// The Hopper backward's order of work (attention/cosine/cuda/hopper/bwd_order.h), simulated on the
// CPU, no GPU needed. choose_bwd_order picks the order as the launcher does (bwd_hopper.cuh); every
// CTA of the grid then takes its key block and (b, kv head) from bwd_cta, walks its steps
// (BwdSteps) and, in the deterministic orders, waits at each dQ unit until the unit's count
// reaches its turn (DqTurns), then adds and counts at once (as bwd_dq_reduce counts before it
// waits again). A random scheduler runs the CTAs on a given number of SMs, one CTA each, launching
// them in index order as SMs free up, and advances one of the resident CTAs that may proceed.
// For each order: the grid covers every (key block, kv head) once, each CTA's steps cover each of
// its units once and each row that sees its keys once (the 80-row steps no row that sees none), the run finishes, every unit receives one add from every key block that reaches
// it, and the order of the adds into a unit is the same under two different schedules. A band of
// the rotated order wider than the SMs must deadlock: the reason the launcher keeps a band within
// them. The launcher's choices for the cases it distinguishes are pinned down too.
#include <gtest/gtest.h>

#ifdef FLASHCOS_WITH_CUDA
#include "attention/cosine/cuda/hopper/bwd_order.h"
#endif

#include <algorithm>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

#ifdef FLASHCOS_WITH_CUDA
using flashcos::cuda::BwdParams;
using namespace flashcos::cuda::hopper;

struct OrderCase {
  std::string name;
  int B, H, Hkv, I, J, d_tile;  // d_tile 64: 128 query rows per step; 128: 64 rows
  bool causal, det;
  int sms;
  BwdOrderKnobs knobs = {};  // the launcher's defaults unless a case says otherwise
  int bm = 0;  // 80: the plain d 128 instance's 80-row steps, off the row-block grid; 0: hopper_bwd_rows
};

void PrintTo(const OrderCase& c, std::ostream* os) { *os << c.name; }

struct CtaWork {
  BwdCta cta;
  int b, hkv, n_iters;
  BwdOrder order;
};

constexpr int kBN = 128;  // keys per CTA

int rows_per_step(const OrderCase& c) { return c.bm > 0 ? c.bm : c.d_tile == 64 ? 128 : 64; }  // hopper_bwd_rows, variant 0
bool on_grid(const OrderCase& c) { return c.bm != 80; }  // as the kernel: bwd_rows' on_grid

BwdParams params_of(const OrderCase& c) {
  static int counters = 0;  // any non-null pointer: the deterministic mode
  BwdParams p;
  p.B = c.B, p.H = c.H, p.Hkv = c.Hkv, p.I = c.I, p.J = c.J, p.causal = c.causal;
  p.dq_semaphore = c.det ? &counters : nullptr;
  choose_bwd_order(p, c.d_tile, kBN, c.sms, c.knobs);
  return p;
}

std::vector<CtaWork> grid_of(const OrderCase& c) {
  const BwdParams p = params_of(c);
  const int bm = rows_per_step(c);
  const int n_blocks = (c.J + kBN - 1) / kBN, heads_batches = c.B * c.Hkv, group = c.H / c.Hkv;
  std::vector<CtaWork> grid;
  for (int idx = 0; idx < n_blocks * heads_batches; ++idx) {
    CtaWork w;
    w.cta = bwd_cta(p, unsigned(idx), n_blocks, heads_batches);
    w.hkv = w.cta.hb % c.Hkv, w.b = w.cta.hb / c.Hkv;  // as the kernel without a bias
    const BwdRows rows = bwd_rows(p, w.cta.n_block * kBN, bm, on_grid(c));
    w.n_iters = group * rows.per_head;
    w.order = bwd_order(p, w.cta, w.hkv * group, rows, bm, w.n_iters, c.det);
    grid.push_back(w);
  }
  return grid;
}

using Unit = std::tuple<int, int, int>;  // b, query head, first row

// Runs the grid under one random schedule; false on a deadlock. adds: each unit's CTAs in the order
// they added.
bool simulate(const OrderCase& c, const std::vector<CtaWork>& grid, unsigned seed,
              std::map<Unit, std::vector<int>>* adds) {
  std::mt19937 rng(seed);
  std::map<Unit, int> count;
  std::vector<int> it(grid.size(), 0), resident;
  size_t next = 0, done = 0;
  auto unit_of = [&](int k) {
    const BwdSteps& s = grid[k].order.steps;
    return Unit{grid[k].b, s.h(it[k]), s.m0(it[k])};
  };
  while (done < grid.size()) {
    while (int(resident.size()) < c.sms && next < grid.size()) {
      if (grid[next].n_iters == 0) {
        ++next, ++done;
        continue;
      }
      resident.push_back(int(next++));
    }
    std::vector<int> runnable;
    for (int k : resident)
      if (!c.det || count[unit_of(k)] >= grid[k].order.turns.target(grid[k].order.steps, it[k])) runnable.push_back(k);
    if (runnable.empty()) return false;
    const int k = runnable[rng() % runnable.size()];
    const Unit u = unit_of(k);
    ++count[u];
    (*adds)[u].push_back(k);
    if (++it[k] == grid[k].n_iters) {
      resident.erase(std::find(resident.begin(), resident.end(), k));
      ++done;
    }
  }
  return true;
}

class HopperBwdOrder : public ::testing::TestWithParam<OrderCase> {};

TEST_P(HopperBwdOrder, CoversEveryUnitOnceAndAddsInOneOrder) {
  const OrderCase& c = GetParam();
  const std::vector<CtaWork> grid = grid_of(c);
  const int n_blocks = (c.J + kBN - 1) / kBN, bm = rows_per_step(c), m_blocks = (c.I + bm - 1) / bm;

  std::set<std::pair<int, int>> taken;
  for (const CtaWork& w : grid) {
    ASSERT_TRUE(w.cta.n_block >= 0 && w.cta.n_block < n_blocks && w.cta.hb >= 0 && w.cta.hb < c.B * c.Hkv) << c.name;
    EXPECT_TRUE(taken.insert({w.cta.n_block, w.cta.hb}).second) << c.name << ": key block " << w.cta.n_block
                                                                 << " of (b, kv head) " << w.cta.hb << " twice";
    std::vector<int> units;
    for (int s = 0; s < w.n_iters; ++s) units.push_back(w.order.steps.unit(s));
    std::sort(units.begin(), units.end());
    for (int s = 0; s < w.n_iters; ++s) ASSERT_EQ(units[s], s) << c.name << ": a CTA's steps miss or repeat a unit";
  }
  EXPECT_EQ(int(taken.size()), n_blocks * c.B * c.Hkv) << c.name;

  // Rows: every CTA's steps cover each row of its query heads that sees one of its keys (row i sees
  // key j where j <= i + J - I) exactly once, and start inside I; on the grid a step may also cover
  // rows that see none of them, off it (80-row steps) none.
  const int group = c.H / c.Hkv;
  for (const CtaWork& w : grid) {
    std::vector<int> covered(size_t(group) * c.I, 0);
    for (int s = 0; s < w.n_iters; ++s) {
      const int h = w.order.steps.h(s), m0 = w.order.steps.m0(s);
      ASSERT_TRUE(h >= w.hkv * group && h < (w.hkv + 1) * group && m0 >= 0 && m0 < c.I) << c.name << ": step " << s;
      for (int r = m0; r < std::min(m0 + bm, c.I); ++r) ++covered[size_t(h - w.hkv * group) * c.I + r];
    }
    for (int hh = 0; hh < group; ++hh)
      for (int r = 0; r < c.I; ++r) {
        const bool sees = !c.causal || w.cta.n_block * kBN <= r + (c.J - c.I);
        const int n = covered[size_t(hh) * c.I + r];
        if (sees || !on_grid(c)) {
          ASSERT_EQ(n, sees ? 1 : 0) << c.name << ": key block " << w.cta.n_block << ", row " << r;
        } else {
          ASSERT_LE(n, 1) << c.name << ": key block " << w.cta.n_block << ", row " << r;
        }
      }
  }

  std::map<Unit, std::vector<int>> first, second;
  ASSERT_TRUE(simulate(c, grid, 1, &first)) << c.name << ": deadlock";
  ASSERT_TRUE(simulate(c, grid, 2, &second)) << c.name << ": deadlock";
  if (!on_grid(c)) return;  // the units below are row blocks of the grid
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int m = 0; m < m_blocks; ++m) {
        // Key blocks whose first key the row block's last row sees (diagonal J - I), counted
        // without bwd_rows, so that a wrong first row block there shows here.
        int reaching = 0;
        for (int n = 0; n < n_blocks; ++n) reaching += !c.causal || n * kBN <= (m + 1) * bm - 1 + (c.J - c.I);
        const Unit u{b, h, m * bm};
        EXPECT_EQ(int(first[u].size()), reaching)
            << c.name << ": unit (" << b << ", " << h / group << "/" << h << ", " << m << ")";
        if (c.det) {
          EXPECT_EQ(first[u], second[u]) << c.name << ": the adds into a unit changed order";
        }
      }
}

BwdOrderKnobs key_block_order() {  // FLASHCOS_HOPPER_DET_ROTATE=0
  BwdOrderKnobs k;
  k.det_orders = false;
  return k;
}

BwdOrderKnobs det_causal_groups(int g) {  // FLASHCOS_HOPPER_DET_CAUSAL_GROUP=g
  BwdOrderKnobs k;
  k.det_causal_group = g;
  return k;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Cpu, HopperBwdOrder, ::testing::Values(
  // name                          B  H Hkv     I     J  d_tile causal det  sms
  // Not causal, deterministic: the rotated order, one band of every key block or bands within the SMs.
  OrderCase{"rotated_d64",           2, 2, 2, 8192, 8192,  64, false, true, 132},
  OrderCase{"rotated_d64_sms20",     1, 2, 2, 8192, 8192,  64, false, true,  20},
  OrderCase{"rotated_d128_gqa",      1, 4, 2, 3000, 3000, 128, false, true, 132},
  OrderCase{"rotated_d128_gqa_sms8", 1, 4, 2, 3000, 3000, 128, false, true,   8},
  OrderCase{"rotated_ties_63x2049",  2, 2, 2,   63, 2049, 128, false, true, 132},
  OrderCase{"keyblock_band8",        1, 2, 2, 2048, 2048,  64, false, true, 132, key_block_order()},
  // Causal, deterministic: d128 head groups of 2 backwards (also on fewer SMs than a group has
  // CTAs, and with GQA and J > I), d64 groups of 16 forwards (I > J too), and groups of 2 forwards,
  // key-block order over every head.
  OrderCase{"causal_d128",           1, 8, 8, 4096, 4096, 128, true,  true, 132},
  OrderCase{"causal_d128_sms10",     1, 8, 8, 4096, 4096, 128, true,  true,  10},
  OrderCase{"causal_d128_gqa",       1, 4, 2, 1000, 2300, 128, true,  true, 132},
  OrderCase{"causal_d64",            2, 8, 8, 4096, 4096,  64, true,  true, 132},
  OrderCase{"causal_d64_sms12",      1, 8, 4, 2048, 2048,  64, true,  true,  12},
  OrderCase{"causal_d64_i_gt_j",     2, 2, 2, 1000,  700,  64, true,  true, 132},
  OrderCase{"causal_d64_groups2",    2, 4, 4, 2048, 2048,  64, true,  true, 132, det_causal_groups(2)},
  OrderCase{"causal_keyblock_all",   1, 4, 4, 2049, 2049,  64, true,  true, 132, key_block_order()},
  // Not deterministic: coverage only.
  OrderCase{"plain_causal",          2, 3, 3, 1000, 1000, 128, true,  false, 132},
  OrderCase{"plain_full",            2, 4, 2, 1000, 2300,  64, false, false, 132},
  // The plain d 128 instance's 80-row steps: causal from each block's diagonal (J = I, J > I, I > J).
  OrderCase{"plain_causal_80",       2, 4, 2, 1000, 1000, 128, true,  false, 132, {}, 80},
  OrderCase{"plain_causal_80_j_gt_i", 1, 2, 2,  700, 2300, 128, true,  false, 132, {}, 80},
  OrderCase{"plain_causal_80_i_gt_j", 1, 2, 1, 2300,  700, 128, true,  false, 132, {}, 80},
  OrderCase{"plain_full_80",         1, 2, 2, 1000, 1000, 128, false, false, 132, {}, 80}),
  [](const ::testing::TestParamInfo<OrderCase>& info) { return info.param.name; });
// clang-format on

TEST(HopperBwdOrderChoice, TheLauncherPicksTheTimedOrders) {
  auto chosen = [](int d_tile, bool causal, bool det, int sms, BwdOrderKnobs knobs = {}) {  // 64 key blocks
    const BwdParams p = params_of({"", 4, 8, 8, 8192, 8192, d_tile, causal, det, sms, knobs});
    return std::make_tuple(p.key_band, p.head_group, p.det_rotate, p.det_reverse);
  };
  using T = std::tuple<int, int, bool, bool>;  // key_band, head_group, det_rotate, det_reverse
  EXPECT_EQ(chosen(64, false, false, 132), T(64, 0, false, false));
  EXPECT_EQ(chosen(64, false, true, 132), T(64, 0, true, false));
  EXPECT_EQ(chosen(128, false, true, 20), T(20, 0, true, false));
  EXPECT_EQ(chosen(64, false, true, 132, key_block_order()), T(8, 0, false, false));
  EXPECT_EQ(chosen(128, false, true, 132, key_block_order()), T(16, 0, false, false));
  EXPECT_EQ(chosen(64, true, false, 132), T(1, 4, false, false));  // grown from 2 (head_groups.h)
  EXPECT_EQ(chosen(64, true, true, 132), T(1, 16, false, false));
  EXPECT_EQ(chosen(128, true, true, 132), T(1, 2, false, true));
  EXPECT_EQ(chosen(128, true, true, 132, key_block_order()), T(1, 0, false, false));
  EXPECT_EQ(chosen(128, true, true, 132, det_causal_groups(0)), T(1, 0, false, false));
  // Causal, not deterministic, short sequences: the groups grow until their CTAs fill the SMs
  // (head_groups.h); FLASHCOS_HOPPER_CAUSAL_GROUP fixes them.
  auto causal_group = [](int n, BwdOrderKnobs knobs = {}) {
    return params_of({"", 4, 8, 8, n, n, 128, true, false, 132, knobs}).head_group;
  };
  EXPECT_EQ(causal_group(1024), 16);
  EXPECT_EQ(causal_group(2048), 16);
  EXPECT_EQ(causal_group(4096), 8);
  EXPECT_EQ(causal_group(16384), 2);
  BwdOrderKnobs fixed;
  fixed.causal_group_fixed = true;
  EXPECT_EQ(causal_group(1024, fixed), 2);
  // One key block: nothing to order.
  const BwdParams one = params_of({"", 4, 8, 8, 100, 100, 64, false, true, 132});
  EXPECT_EQ(T(one.key_band, one.head_group, one.det_rotate, one.det_reverse), T(1, 0, false, false));
}

TEST(HopperBwdOrderNegative, RotatedBandWiderThanTheSmsDeadlocks) {
  // Band 64 on 16 SMs (the launcher would keep it to 16): block 15's second unit is block 16's
  // first, and block 16 never gets an SM.
  const OrderCase c{"band64_sms16", 1, 1, 1, 8192, 8192, 64, false, true, 132};
  const std::vector<CtaWork> grid = grid_of(c);
  ASSERT_EQ(grid.front().cta.band_w, 64);
  OrderCase on16 = c;
  on16.sms = 16;
  std::map<Unit, std::vector<int>> adds;
  EXPECT_FALSE(simulate(on16, grid, 1, &adds));
}
// The plain kernel's items (bwd_item), with and without a split tail, taken in any order (a
// persistent grid hands them out as its CTAs come free; here a random permutation): the steps of each
// key block's items (whole, or its pieces) cover the block's units once, and bwd_grid_items counts
// the split blocks' pieces.
TEST(HopperBwdItems, ItemsCoverEveryBlocksStepsOnce) {
  std::mt19937 rng(7);
  for (const bool causal : {false, true}) {
    for (const int n : {1000, 8192}) {
      for (const int bm : {64, 80}) {
        for (const int split_units : {0, 5}) {
          const OrderCase c{"", 2, 4, 2, n, n, 128, causal, false, 132};
          BwdParams p = params_of(c);
          const int n_blocks = (n + kBN - 1) / kBN, heads_batches = c.B * c.Hkv, group = c.H / c.Hkv;
          const int64_t blocks = int64_t(n_blocks) * heads_batches;
          if (split_units > 0) {
            p.split_first = int(blocks - split_units);
            p.split_pieces = 3;
          }
          const int64_t items = bwd_grid_items(p, blocks);
          EXPECT_EQ(items, blocks + (split_units > 0 ? 2 * split_units : 0));
          std::vector<unsigned> order(static_cast<size_t>(items));
          for (size_t w = 0; w < order.size(); ++w) order[w] = unsigned(w);
          std::shuffle(order.begin(), order.end(), rng);
          std::map<std::pair<int, int>, std::vector<int>> units;  // (key block, b x kv head): units seen
          for (const unsigned w : order) {
            const BwdItem x = bwd_item(p, w, kBN, bm, true, false, bm != 80, false);
            ASSERT_EQ(x.n0, x.cta.n_block * kBN);
            ASSERT_EQ(x.hkv, x.cta.hb % c.Hkv);
            ASSERT_EQ(x.b, x.cta.hb / c.Hkv);
            std::vector<int>& seen = units[{x.cta.n_block, x.cta.hb}];
            seen.resize(size_t(group * x.rows.per_head), 0);
            for (int s = 0; s < x.n_steps; ++s) {
              const int u = x.order.steps.unit(s);
              ASSERT_TRUE(u >= 0 && u < int(seen.size())) << "unit " << u;
              ++seen[size_t(u)];
            }
          }
          ASSERT_EQ(int64_t(units.size()), blocks);
          for (const auto& [block, seen] : units)
            for (size_t u = 0; u < seen.size(); ++u)
              ASSERT_EQ(seen[u], 1) << "block " << block.first << " unit " << u << " causal " << causal << " n " << n;
        }
      }
    }
  }
}

#else
TEST(HopperBwdOrder, NeedsTheCudaBuild) { GTEST_SKIP() << "bwd_order.h is part of the CUDA build"; }
#endif

}  // namespace
