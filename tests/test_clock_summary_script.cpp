// scripts/clock_summary.sh, the per-run SM clock / power summary of `scripts/gpu_check.sh clocks`, on
// random nvidia-smi samples whose means over each run's window (the last 1.2 s to 0.2 s before its END
// mark, or --window) are computed here; a sequence that passes midnight; a run with no sample in its
// window; bad arguments.
#include <gtest/gtest.h>

#include "train_process_util.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The script on `args`, through the shell (train_process_util.h).
train_test::RunResult run_script(const std::string& args) {
  return train_test::run_shell("bash " + train_test::quote(std::string(FLASHCOS_SOURCE_DIR) + "/scripts/clock_summary.sh") +
                               " " + args);
}

// "HH:MM:SS.mmm" of a time in ms since midnight (wrapped into the day).
std::string hms(long long ms) {
  ms = ((ms % 86400000) + 86400000) % 86400000;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld.%03lld", ms / 3600000, ms / 60000 % 60, ms / 1000 % 60, ms % 1000);
  return buf;
}

struct Sample {
  long long ms;  // since midnight, may pass 24 h
  int mhz;
  double watts;
  bool capped;
};

std::string sample_line(const Sample& s) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "2026/11/29 %s, %d MHz, %.2f W, 0x000000000000000%c\n", hms(s.ms).c_str(), s.mhz,
                s.watts, s.capped ? '4' : '1');
  return buf;
}

std::string write(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

// The summary's row for `tag`: samples, MHz, W, capped %; false if absent.
bool row_of(const std::string& out, const std::string& tag, int* n, double* mhz, double* w, double* capped) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string t;
    if (!(l >> t) || t != tag) continue;
    std::string pct;
    if (!(l >> *n)) return false;
    if (*n == 0) return true;
    if (!(l >> *mhz >> *w >> pct) || pct.empty() || pct.back() != '%') return false;
    *capped = std::stod(pct.substr(0, pct.size() - 1));
    return true;
  }
  return false;
}

// Four runs of random lengths, 2 s apart, with random samples every 25 ms from a start time on (the
// first run's END at first_end_ms where given).
void check_random_runs(long long start_ms, unsigned seed, long long first_end_ms = -1) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ", start " + hms(start_ms));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> mhz(1300, 1980);
  std::uniform_real_distribution<double> watts(80.0, 700.0);
  std::bernoulli_distribution capped(0.7);
  std::vector<Sample> samples;
  std::ostringstream marks;
  struct Expect {
    std::string tag;
    int n = 0;
    double mhz = 0, w = 0, capped = 0;
  };
  std::vector<Expect> expect;
  long long t = start_ms;
  for (int r = 0; r < 4; ++r) {
    const std::string tag = "bwd_bf16_run_" + std::to_string(r);
    long long begin = t + 2000, end = begin + 2000 + 25 * std::uniform_int_distribution<int>(0, 80)(rng);
    if (r == 0 && first_end_ms >= 0) end = first_end_ms, begin = end - 2000;
    marks << "START " << tag << " " << hms(begin) << "000000\n";
    marks << "END " << tag << " " << hms(end) << "000000\n";
    Expect e{tag};
    for (long long s = t + 10; s < end + 2000; s += 25) {  // 10 ms off the window's edges (no ties)
      const Sample x{s, mhz(rng), std::round(watts(rng) * 100) / 100, capped(rng)};
      samples.push_back(x);
      if (s >= end - 1200 && s <= end - 200) {
        ++e.n;
        e.mhz += x.mhz;
        e.w += x.watts;
        e.capped += x.capped;
      }
    }
    e.mhz /= e.n;
    e.w /= e.n;
    e.capped = 100.0 * e.capped / e.n;
    expect.push_back(e);
    t = end + 2000;
  }
  std::string text;
  for (const auto& s : samples) text += sample_line(s);
  const std::string m = write("clock_marks.txt", marks.str()), f = write("clock_samples.csv", text);
  const auto r = run_script(train_test::quote(m) + " " + train_test::quote(f));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& e : expect) {
    int n = -1;
    double got_mhz = 0, got_w = 0, got_capped = 0;
    ASSERT_TRUE(row_of(r.output, e.tag, &n, &got_mhz, &got_w, &got_capped)) << e.tag << "\n" << r.output;
    EXPECT_EQ(n, e.n) << e.tag;
    EXPECT_NEAR(got_mhz, e.mhz, 0.5) << e.tag;
    EXPECT_NEAR(got_w, e.w, 0.05) << e.tag;
    EXPECT_NEAR(got_capped, e.capped, 0.5) << e.tag;
  }
}

}  // namespace

TEST(ClockSummaryScript, MeansOverEachRunsWindow) { check_random_runs(10LL * 3600000, std::random_device{}()); }

// Samples and marks from before and after midnight; the first run's window spans it.
TEST(ClockSummaryScript, ASequencePassingMidnight) {
  check_random_runs(86400000LL - 5000, std::random_device{}(), 86400000LL + 700);
}

// --window moves the window; a run with no sample in it says so.
TEST(ClockSummaryScript, WindowOptionAndRunsWithoutSamples) {
  std::string text;
  for (int i = 0; i <= 40; ++i) text += sample_line({1000LL * 3600 + 100 * i, 1000 + i, 500.0 + i, i % 2 == 0});
  // Samples from 01:00:00.0 to 01:00:04.0, one every 100 ms, and lines that are not samples (skipped).
  text += "2026/11/29 01:00:01.55, [N/A], [N/A], [N/A]\nUnable to determine the device handle for GPU0\n";
  const std::string f = write("clock_samples_w.csv", text);
  const std::string m = write("clock_marks_w.txt",
                              "START a 01:00:00.000\nEND a 01:00:03.000\nSTART b 01:00:05.000\nEND b 01:00:09.000\n");
  const auto r = run_script("--window 2,1 " + train_test::quote(m) + " " + train_test::quote(f));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int n = -1;
  double mhz = 0, w = 0, capped = 0;
  // a: [1.0 s, 2.0 s], samples 10..20: MHz 1010..1020, 6 of 11 capped.
  ASSERT_TRUE(row_of(r.output, "a", &n, &mhz, &w, &capped)) << r.output;
  EXPECT_EQ(n, 11);
  EXPECT_NEAR(mhz, 1015, 0.5);
  EXPECT_NEAR(w, 515, 0.05);
  EXPECT_NEAR(capped, 100.0 * 6 / 11, 0.5);
  // b: [7 s, 8 s], after the last sample.
  ASSERT_TRUE(row_of(r.output, "b", &n, &mhz, &w, &capped)) << r.output;
  EXPECT_EQ(n, 0);
  EXPECT_NE(r.output.find("no samples in its window"), std::string::npos) << r.output;

  for (const char* bad : {"--window 1", "--window 0.2,1.2", "--window a,b"}) {
    const auto e = run_script(std::string(bad) + " " + train_test::quote(m) + " " + train_test::quote(f));
    EXPECT_NE(e.exit_code, 0) << bad;
    EXPECT_NE(e.output.find("--window"), std::string::npos) << bad << ": " << e.output;
  }
  const auto missing = run_script(train_test::quote(m) + " " + train_test::quote(m + ".absent"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("cannot read"), std::string::npos) << missing.output;
  const auto one = run_script(train_test::quote(m));
  EXPECT_NE(one.exit_code, 0);
  EXPECT_NE(one.output.find("usage"), std::string::npos) << one.output;
}
