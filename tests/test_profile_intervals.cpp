// uncovered_ns (model/profile.h): the part of one set of kernel intervals that no interval of
// another set covers, the "exposed communication" of --profile-steps. Checked against a
// brute-force count over every nanosecond on random interval sets, plus the edge cases.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "model/profile.h"

namespace {

using flashcos::model::Interval;
using flashcos::model::uncovered_ns;

uint64_t brute_force(const std::vector<Interval>& a, const std::vector<Interval>& b, uint64_t horizon) {
  uint64_t out = 0;
  for (uint64_t t = 0; t < horizon; ++t) {
    bool in_a = false, in_b = false;
    for (const auto& [s, e] : a) in_a = in_a || (s <= t && t < e);
    for (const auto& [s, e] : b) in_b = in_b || (s <= t && t < e);
    out += in_a && !in_b;
  }
  return out;
}

TEST(ProfileIntervals, EdgeCases) {
  EXPECT_EQ(uncovered_ns({}, {}), 0u);
  EXPECT_EQ(uncovered_ns({{10, 20}}, {}), 10u);
  EXPECT_EQ(uncovered_ns({}, {{10, 20}}), 0u);
  EXPECT_EQ(uncovered_ns({{10, 20}}, {{0, 30}}), 0u) << "covered entirely";
  EXPECT_EQ(uncovered_ns({{10, 20}}, {{12, 15}}), 7u) << "a hole in the middle";
  EXPECT_EQ(uncovered_ns({{10, 20}}, {{20, 30}}), 10u) << "touching is not covering";
  EXPECT_EQ(uncovered_ns({{10, 20}, {15, 25}}, {}), 15u) << "overlapping a's counted once";
  EXPECT_EQ(uncovered_ns({{10, 20}, {30, 40}}, {{15, 35}}), 10u) << "one b across two a's";
  EXPECT_EQ(uncovered_ns({{5, 5}, {7, 3}}, {}), 0u) << "empty and reversed intervals count nothing";
}

TEST(ProfileIntervals, MatchesABruteForceCountOnRandomSets) {
  std::mt19937 gen(20261127);
  for (int trial = 0; trial < 300; ++trial) {
    const uint64_t horizon = 1 + gen() % 200;
    auto random_set = [&](int n) {
      std::vector<Interval> v;
      for (int i = 0; i < n; ++i) {
        const uint64_t s = gen() % horizon, len = gen() % 40;
        v.emplace_back(s, std::min(horizon, s + len));
      }
      return v;
    };
    const auto a = random_set(int(gen() % 12)), b = random_set(int(gen() % 12));
    ASSERT_EQ(uncovered_ns(a, b), brute_force(a, b, horizon)) << "trial " << trial;
  }
}

}  // namespace
