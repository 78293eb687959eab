// The d 64 Hopper forward's choice of 128- or 192-row CTAs (attention/cosine/cuda/hopper/fwd_rows.h),
// on the CPU, no GPU needed: the estimate against a CTA-by-CTA count of the work, its limits (one
// SM: all the work; many SMs: one CTA), and the launcher's choices for the shapes run S4 timed
// both ways (docs/history/kernels-tried-2026-11-27.md, item 16).
#include <gtest/gtest.h>

#ifdef FLASHCOS_WITH_CUDA
#include "attention/cosine/cuda/hopper/fwd_rows.h"
#include "attention/cosine/cuda/hopper/persistent_grid.h"
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

#ifdef FLASHCOS_WITH_CUDA
using namespace flashcos::cuda::hopper;

FwdGridShape shape(int64_t heads_batches, int64_t I, int64_t J, bool causal, int sms = 132) {
  FwdGridShape s;
  s.heads_batches = heads_batches;
  s.I = I;
  s.J = J;
  s.causal = causal;
  s.sms = sms;
  return s;
}

// Every CTA's work, counted CTA by CTA: all rows of its block times the keys its last row sees (the
// kernel walks a block's key blocks up to its last row's diagonal for every row of it, rows past I
// included: they are computed and not stored).
std::vector<double> cta_work(const FwdGridShape& s, int rows) {
  std::vector<double> work;
  const int64_t m_blocks = (s.I + rows - 1) / rows;
  for (int64_t hb = 0; hb < s.heads_batches; ++hb) {
    for (int64_t m = 0; m < m_blocks; ++m) {
      int64_t keys = s.J;
      if (s.causal) {
        const int64_t last_row = (m + 1) * rows - 1;
        keys = std::min<int64_t>(s.J, std::max<int64_t>(0, last_row + 1 + s.J - s.I));
      }
      work.push_back(double(rows) * double(keys));
    }
  }
  return work;
}

double cost(int rows) { return rows == 128 ? kFwdRowCost128 : 1.0; }

TEST(HopperFwdRows, OneSmRunsAllTheWork) {
  for (const bool causal : {false, true}) {
    for (const int64_t n : {1, 63, 127, 1000, 4096}) {
      for (const int rows : {128, 192}) {
        const FwdGridShape s = shape(3, n, n + (causal ? 17 : 0), causal, 1);
        double total = 0;
        for (const double w : cta_work(s, rows)) total += w;
        EXPECT_NEAR(fwd_grid_estimate(s, rows), cost(rows) * total, 1e-9 * total)
            << "n " << n << " rows " << rows << " causal " << causal;
      }
    }
  }
}

TEST(HopperFwdRows, ManySmsRunTheLongestCta) {
  for (const bool causal : {false, true}) {
    for (const int64_t n : {1, 100, 1000, 3000}) {
      for (const int rows : {128, 192}) {
        const FwdGridShape s = shape(2, n, n, causal, 1 << 20);
        const std::vector<double> work = cta_work(s, rows);
        const double longest = *std::max_element(work.begin(), work.end());
        EXPECT_DOUBLE_EQ(fwd_grid_estimate(s, rows), cost(rows) * longest) << "n " << n << " rows " << rows;
      }
    }
  }
}

TEST(HopperFwdRows, NonCausalCountsWholeWaves) {
  // 6 heads x 1000 rows: 48 CTAs of 128 rows, 36 of 192; on 40 SMs 2 waves and 1.
  const FwdGridShape s = shape(6, 1000, 1000, false, 40);
  EXPECT_DOUBLE_EQ(fwd_grid_estimate(s, 128), kFwdRowCost128 * 2 * 128 * 1000);
  EXPECT_DOUBLE_EQ(fwd_grid_estimate(s, 192), 1.0 * 1 * 192 * 1000);
  EXPECT_FALSE(fwd_prefer_128_rows(s));
}

TEST(HopperFwdRows, CausalRowsWithoutKeysCostNothing) {
  // J < I: rows below I - J see no key. The first 128-row block of 300 rows over 10 keys sees none,
  // the last does; with no keys at all nothing costs anything.
  EXPECT_EQ(cta_work(shape(1, 300, 10, true), 128).front(), 0.0);
  EXPECT_GT(fwd_grid_estimate(shape(4, 300, 10, true), 128), 0.0);
  EXPECT_EQ(fwd_grid_estimate(shape(4, 300, 0, true), 128), 0.0);
  EXPECT_EQ(fwd_grid_estimate(shape(4, 300, 0, false), 192), 0.0);
  // No SM count (0) is taken as one SM, not a division by zero.
  EXPECT_DOUBLE_EQ(fwd_grid_estimate(shape(1, 5, 5, false, 0), 192), 192.0 * 5);
}

// The shapes run S4 timed both ways (H100, 132 SMs, b x h = 32 unless said): the launcher must pick
// the faster of the two there, or one within 4 % of it (causal n 2048 and 4096).
TEST(HopperFwdRows, PicksTheFasterGridWhereMeasured) {
  struct Case {
    int64_t hb, n;
    bool causal, rows128;
  };
  const Case cases[] = {
      {32, 1024, false, true},  {32, 2048, false, false}, {32, 4096, false, false}, {32, 8192, false, false},
      {32, 16384, false, false}, {256, 1024, false, false}, {8, 8192, false, false},  {8, 32768, false, false},
      {32, 1024, true, true},    {32, 8192, true, false},   {32, 16384, true, false}, {256, 1024, true, true},
      {8, 8192, true, false},    {8, 32768, true, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(fwd_prefer_128_rows(shape(c.hb, c.n, c.n, c.causal)), c.rows128)
        << "b x h " << c.hb << " n " << c.n << " causal " << c.causal;
  }
}

TEST(HopperFwdRows, LongSequencesKeep192Rows) {
  for (const bool causal : {false, true}) {
    for (const int64_t hb : {1, 8, 32, 256}) {
      EXPECT_FALSE(fwd_prefer_128_rows(shape(hb, 65536, 65536, causal))) << "b x h " << hb;
    }
  }
}

// The backward's default grid: persistent under a causal mask but for fp16 in the 128 instance (where
// run AP6 measured one CTA an item ahead), never without one (fp16 in the 64 instance, persistent
// from runs AL3 / AL4, measured behind in run AP5 once fp16 formed dS by pairs).
TEST(HopperPersistentGrid, BackwardDefault) {
  for (const bool fp16 : {false, true}) {
    for (const int dim : {64, 128}) {
      EXPECT_EQ(bwd_persistent_by_default(fp16, dim, true), !(fp16 && dim == 128)) << fp16 << " " << dim;
      EXPECT_FALSE(bwd_persistent_by_default(fp16, dim, false)) << fp16 << " " << dim;
    }
  }
}

// A persistent grid (the forward's and the backward's): one CTA an SM where it has fewer CTAs than
// items, none otherwise; the default where the launch says so (the forward without a causal mask, the
// backward as in BackwardDefault), "all" always, a count caps the CTAs (whatever the default).
TEST(HopperPersistentGrid, Size) {
  for (const int sms : {1, 7, 132}) {
    for (const int64_t items : {int64_t(1), int64_t(sms), int64_t(sms) + 1, int64_t(1000), int64_t(1) << 31}) {
      const int64_t want = items > sms ? sms : 0;
      EXPECT_EQ(persistent_ctas(kPersistentDefault, true, items, sms), want) << sms << " " << items;
      EXPECT_EQ(persistent_ctas(kPersistentDefault, false, items, sms), 0) << sms << " " << items;
      EXPECT_EQ(persistent_ctas(kPersistentAll, true, items, sms), want) << sms << " " << items;
      EXPECT_EQ(persistent_ctas(kPersistentAll, false, items, sms), want) << sms << " " << items;
      EXPECT_EQ(persistent_ctas(0, true, items, sms), 0) << sms << " " << items;
      for (const int64_t cap : {1, 3, 500}) {
        const int64_t ctas = std::min<int64_t>(cap, sms);
        for (const bool by_default : {false, true}) {
          EXPECT_EQ(persistent_ctas(cap, by_default, items, sms), items > ctas ? ctas : 0) << cap << " " << items;
        }
      }
    }
  }
}

// The environment's spelling of the mode: unset or empty the default, "all", a count, "0" never
// (as are words that are no count: atoi gives 0).
TEST(HopperPersistentGrid, ModeFromEnvironment) {
  EXPECT_EQ(persistent_mode(nullptr), kPersistentDefault);
  EXPECT_EQ(persistent_mode(""), kPersistentDefault);
  EXPECT_EQ(persistent_mode("all"), kPersistentAll);
  EXPECT_EQ(persistent_mode("0"), 0);
  EXPECT_EQ(persistent_mode("3"), 3);
  EXPECT_EQ(persistent_mode("-5"), 0);
  EXPECT_EQ(persistent_mode("off"), 0);
}

#else
TEST(HopperFwdRows, NeedsTheCudaBuild) { GTEST_SKIP() << "built without CUDA"; }
#endif

}  // namespace
