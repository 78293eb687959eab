// ./train bench --clocks' note under a table (app/bench/gpu_clocks.h, power_cap_note): a row whose
// implementations' kept rounds ran at different power states, some below the power cap and some
// at it, is named with each one's capped share, power and clock; rows that agree, or with fewer than
// two sampled implementations, get none.
#include "app/bench/gpu_clocks.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace {

using flashcos::app::bench::ClockStats;
using flashcos::app::bench::power_cap_note;

ClockStats stats(double capped_share, double watts, double mhz, int samples = 12) {
  ClockStats c;
  c.samples = samples;
  c.capped_share = capped_share;
  c.watts = watts;
  c.sm_mhz = mhz;
  return c;
}

TEST(BenchPowerNote, NamesTheRoundsBelowAndAtTheCap) {
  const std::string note = power_cap_note({{"fused", stats(1.0, 688, 1695)}, {"sdpa-cudnn", stats(0.0, 127, 1980)}});
  EXPECT_EQ(note, "below the power cap in the round kept: sdpa-cudnn (0% of samples capped, 127 W, 1980 MHz); "
                  "at it: fused (100%, 688 W, 1695 MHz)");
  // Several on each side, in the table's order; the share's wording once.
  const std::string three = power_cap_note({{"a", stats(0.25, 300, 1900)}, {"b", stats(0.75, 650, 1700)},
                                            {"c", stats(0.4, 420, 1850)}, {"d", stats(0.5, 600, 1750)}});
  EXPECT_EQ(three, "below the power cap in the round kept: a (25% of samples capped, 300 W, 1900 MHz), "
                   "c (40%, 420 W, 1850 MHz); at it: b (75%, 650 W, 1700 MHz), d (50%, 600 W, 1750 MHz)");
}

TEST(BenchPowerNote, NoneWhereTheRoundsAgree) {
  EXPECT_EQ(power_cap_note({{"fused", stats(1.0, 690, 1680)}, {"sdpa-cudnn", stats(0.81, 223, 1816)}}), "");
  EXPECT_EQ(power_cap_note({{"fused", stats(0.0, 400, 1980)}, {"sdpa-flash", stats(0.49, 650, 1980)}}), "");
  EXPECT_EQ(power_cap_note({{"fused", stats(0.0, 400, 1980)}}), "");
  EXPECT_EQ(power_cap_note({}), "");
  // An implementation without samples (iterations shorter than the sampling period) is left out.
  EXPECT_EQ(power_cap_note({{"fused", stats(1.0, 690, 1680)}, {"tiled", stats(0.0, 0, 0, 0)}}), "");
}

}  // namespace
