// uncovered_ns (model/profile.h): the part of one set of kernel intervals that no interval of
// another set covers, the "exposed communication" of --profile-steps. Checked against a
// brute-force count over every nanosecond on random interval sets, plus the edge cases.
// profile_report: the report --profile-steps and ./train bench --profile print, from hand-made
// kernel records whose busy time, span, idle time and time alone are worked out below.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "model/profile.h"

namespace {

using flashcos::model::Interval;
using flashcos::model::KernelRecord;
using flashcos::model::profile_report;
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

constexpr uint64_t kMs = 1000000;  // ns

// The numbers of the report's row for `name`: ms per step, %, ms alone per step, calls; false if absent.
bool row_of(const std::string& report, const std::string& name, double* ms, double* pct, double* alone, long* calls) {
  const size_t at = report.find("  " + name);
  if (at == std::string::npos) return false;
  const size_t line = report.rfind('\n', at) + 1;
  return std::sscanf(report.c_str() + line, " %lf %lf %lf %ld", ms, pct, alone, calls) == 4;
}

// Two steps of: a main kernel, a finisher launched early that overlaps its end, then a fill; a gap
// between the steps. In ms: main [0, 4) and [5, 9), fin [3.8, 4.2), fill [4.2, 4.3).
TEST(ProfileReport, BusySpanIdleAndTimeAlone) {
  const std::vector<KernelRecord> kernels = {
      {"main", 0, 4 * kMs, "aten::op_a"},         {"main", 5 * kMs, 9 * kMs, "aten::op_a"},
      {"fin", 38 * kMs / 10, 42 * kMs / 10, ""},  {"fill", 42 * kMs / 10, 43 * kMs / 10, "aten::fill_"}};
  const std::string r = profile_report(kernels, 2, 30, "iteration");
  // busy 8 + 0.4 + 0.1 = 8.5 ms, span 9 ms, covered [0, 4.3) and [5, 9): 8.3 ms, so 0.7 ms idle.
  EXPECT_EQ(r.rfind("profile over 2 iterations: kernel time 4.250 ms/iteration (summed: overlapping kernels "
                    "each count) in a 4.500 ms/iteration span, no kernel running 0.350 ms/iteration "
                    "(3 kernel names)\n", 0), 0u) << r;
  double ms = 0, pct = 0, alone = 0;
  long calls = 0;
  // main: 8 ms, 0.2 ms of it under fin; fin: 0.4 ms, half under main; fill: alone all along.
  ASSERT_TRUE(row_of(r, "main  [aten::op_a]", &ms, &pct, &alone, &calls)) << r;
  EXPECT_DOUBLE_EQ(ms, 4.0);
  EXPECT_NEAR(pct, 100.0 * 8 / 8.5, 0.006);
  EXPECT_DOUBLE_EQ(alone, 3.9);
  EXPECT_EQ(calls, 2);
  ASSERT_TRUE(row_of(r, "fin\n", &ms, &pct, &alone, &calls)) << r;
  EXPECT_DOUBLE_EQ(ms, 0.2);
  EXPECT_DOUBLE_EQ(alone, 0.1);
  EXPECT_EQ(calls, 1);
  ASSERT_TRUE(row_of(r, "fill  [aten::fill_]", &ms, &pct, &alone, &calls)) << r;
  EXPECT_DOUBLE_EQ(ms, 0.05);
  EXPECT_DOUBLE_EQ(alone, 0.05);
  // Costliest first.
  EXPECT_LT(r.find("  main"), r.find("  fin")) << r;
  EXPECT_LT(r.find("  fin"), r.find("  fill")) << r;
  EXPECT_NE(r.find("alone    calls  kernel"), std::string::npos) << r;
}

// Past `top` names the rest is one summed line; nothing recorded says so.
TEST(ProfileReport, SumsTheRestAndSaysWhenNothingWasRecorded) {
  const std::vector<KernelRecord> kernels = {
      {"a", 0, 3 * kMs, ""}, {"b", 3 * kMs, 5 * kMs, ""}, {"c", 5 * kMs, 6 * kMs, ""}};
  const std::string r = profile_report(kernels, 1, 1, "step");
  EXPECT_NE(r.find("no kernel running 0.000 ms/step (3 kernel names)"), std::string::npos) << r;
  double ms = 0, pct = 0, alone = 0;
  long calls = 0;
  ASSERT_TRUE(row_of(r, "a\n", &ms, &pct, &alone, &calls)) << r;
  EXPECT_DOUBLE_EQ(ms, 3.0);
  const size_t rest = r.find("(2 other names)");
  ASSERT_NE(rest, std::string::npos) << r;
  const size_t line = r.rfind('\n', rest) + 1;
  double rest_ms = 0, rest_pct = 0;
  long rest_calls = 0;
  ASSERT_EQ(std::sscanf(r.c_str() + line, " %lf %lf %ld", &rest_ms, &rest_pct, &rest_calls), 3) << r;
  EXPECT_DOUBLE_EQ(rest_ms, 3.0);
  EXPECT_NEAR(rest_pct, 50.0, 1e-9);
  EXPECT_EQ(rest_calls, 2);
  EXPECT_EQ(r.find("  b"), std::string::npos) << "b is summed, not listed:\n" << r;
  EXPECT_EQ(profile_report({}, 3).rfind("profile: no CUDA activity was recorded", 0), 0u);
}

}  // namespace
