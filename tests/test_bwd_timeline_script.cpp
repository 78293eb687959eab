// scripts/bwd_timeline.sh, the summary of the Hopper backward's diagnostic timeline
// (attention/cosine/cuda/hopper/bwd_timeline.cuh's file format), on a random timeline whose medians
// are computed here: per consumer the phases of an item, the CTAs' start-to-enter time, the gap
// between one CTA's last store and the next CTA's start on the same SM, the clock it infers, and the
// launch's span and the share of it its SMs were busy.
#include <gtest/gtest.h>

#include "train_process_util.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The script on `args`, through the shell (train_process_util.h).
train_test::RunResult run_script(const std::string& args) {
  return train_test::run_shell("bash " + train_test::quote(std::string(FLASHCOS_SOURCE_DIR) + "/scripts/bwd_timeline.sh") +
                               " " + args);
}

// The "key value (count)" lines of the summary.
std::map<std::string, double> parse(const std::string& out) {
  std::map<std::string, double> m;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string key;
    double v;
    std::string count;
    if (l >> key >> v >> count && count.front() == '(') m[key] = v;
  }
  return m;
}

}  // namespace

TEST(BwdTimelineScript, MediansOfARandomTimeline) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto ns = [&](int lo, int hi) { return 5 * std::uniform_int_distribution<int>(lo / 5, hi / 5)(rng); };
  // Times in ns (multiples of 5) and cycles at 1.8 GHz (9 cycles per 5 ns, exact).
  auto cyc = [](long long t) { return t * 9 / 5; };
  const int n_steps = 103;
  std::ostringstream file;
  // The header's grid (20) is more than the 13 CTAs recorded: the summary says so.
  file << "# launch 10 grid 20 blocks 12 I 8192 J 8192 D 128 causal 0\n";
  std::map<std::string, std::vector<double>> want;
  int cta = 0;
  long long first_start = -1, last_end = 0, busy = 0;  // ns, over all CTAs
  for (int sm = 0; sm < 3; ++sm) {
    long long t = ns(0, 2000);  // this SM's clock: the first CTA's start
    const int ctas = 3 + sm;    // 3, 4, 5 CTAs one after another
    long long prev_end = -1;
    for (int k = 0; k < ctas; ++k, ++cta) {
      const long long start = t;
      if (prev_end >= 0) want["cta_gap(stored->next_cta_start)"].push_back((start - prev_end) / 1000.0);
      const long long enter = start + ns(500, 2000);
      const long long kv = enter + ns(1000, 3000);
      const int step = ns(2300, 2400);
      long long end = 0;
      for (int c = 0; c < 2; ++c) {
        const long long first = kv + step + ns(0, 1500);
        const long long loop_end = first + (n_steps - 1) * static_cast<long long>(step);
        const long long dq_mma = loop_end + ns(300, 500);
        const long long dq_out = dq_mma + ns(800, 3500);
        const long long stored = dq_out + ns(3000, 4500);
        end = std::max(end, stored);
        file << cta << " 0 " << c << " " << cta << " " << n_steps << " " << cyc(enter) << " " << cyc(kv) << " "
             << cyc(first) << " " << cyc(loop_end) << " " << cyc(dq_mma) << " " << cyc(dq_out) << " " << cyc(stored)
             << " " << enter << " " << sm << " " << cyc(start) << "\n";
        const std::string p = "c" + std::to_string(c) + "_";
        want[p + "kv(enter->kv)"].push_back((kv - enter) / 1000.0);
        want[p + "first_step"].push_back((first - kv) / 1000.0);
        want[p + "step(mean_of_the_rest)"].push_back(step / 1000.0);
        want[p + "dq_mma(loop_end->dq_mma)"].push_back((dq_mma - loop_end) / 1000.0);
        want[p + "dq_out(dq_mma->dq_out)"].push_back((dq_out - dq_mma) / 1000.0);
        want[p + "stores(dq_out->stored)"].push_back((stored - dq_out) / 1000.0);
        want[p + "outside_steps"].push_back(((kv - enter) + (stored - loop_end) + (first - kv - step)) / 1000.0);
        want[p + "cta_start->enter"].push_back((enter - start) / 1000.0);
      }
      prev_end = end;
      first_start = first_start < 0 ? start : std::min(first_start, start);
      last_end = std::max(last_end, end);
      busy += end - start;
      t = end + ns(500, 4000);
    }
  }
  // A line of an item without steps (no dQ marks): left out of the phases.
  // Its CTA starts at 0 ns and ends with its K, V at 200 ns, on a fourth SM.
  file << cta << " 0 0 " << cta << " 0 " << cyc(100) << " " << cyc(200) << " 0 0 0 0 0 100 9 0\n";
  first_start = 0;
  busy += 200;
  const double span = (last_end - first_start) / 1000.0;
  want["launch_span_us"] = {span};
  want["sm_busy_percent"] = {100.0 * busy / 1000.0 / (4 * span)};
  const std::string path = ::testing::TempDir() + "bwd_timeline_test.txt";
  {
    std::ofstream out(path);
    out << file.str();
  }
  const train_test::RunResult run = run_script(train_test::quote(path));
  std::remove(path.c_str());
  const std::string& out = run.output;
  EXPECT_EQ(run.exit_code, 0) << out;
  EXPECT_NE(out.find("clock 1.800 GHz"), std::string::npos) << out;
  EXPECT_NE(out.find("the first 13 CTAs of a grid of 20 only"), std::string::npos) << out;
  const std::map<std::string, double> got = parse(out);
  for (const auto& [key, values] : want) {
    const auto it = got.find(key);
    ASSERT_NE(it, got.end()) << key << " missing from:\n" << out;
    EXPECT_NEAR(it->second, median(values), 0.006) << key << "\n" << out;
  }
  EXPECT_EQ(got.size(), want.size()) << out;
}

TEST(BwdTimelineScript, RefusesWhatIsNotATimeline) {
  const std::string path = ::testing::TempDir() + "bwd_timeline_not.txt";
  {
    std::ofstream out(path);
    out << "seq_len impl ms\n";
  }
  const train_test::RunResult run = run_script(train_test::quote(path));
  std::remove(path.c_str());
  EXPECT_NE(run.output.find("not a timeline file"), std::string::npos) << run.output;
  EXPECT_NE(run.exit_code, 0) << run.output;
  const train_test::RunResult missing = run_script("/nonexistent/bwd_timeline.txt");
  EXPECT_NE(missing.output.find("cannot read"), std::string::npos) << missing.output;
  EXPECT_NE(missing.exit_code, 0) << missing.output;
}
