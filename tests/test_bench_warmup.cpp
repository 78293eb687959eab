// ./train bench's warm-up loop (app/bench/warmup.h) on a simulated device and clock: a body call
// costs host time and queues GPU time, a wait runs what is queued. Checks the rules the bench's
// clock-settling depends on: the GPU is loaded for the floor after a slow first iteration, one wait
// per ~50 ms batch, the count alone without a floor, the early stop at half the budget counted from
// the first iteration, and the cost of one iteration taken from the second.
#include "app/bench/warmup.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace {

using flashcos::app::bench::warm_up;
using flashcos::app::bench::WarmupResult;

// One iteration: `host_s` on the clock when queued (plus `first_host_s` the first time), `gpu_s`
// queued; a wait moves the clock to when the GPU has run it all. Records the GPU seconds queued
// after the first iteration ended (the load the floor is about) and the largest batch waited for.
struct FakeDevice {
  double host_s = 1e-4, gpu_s = 5e-3, first_host_s = 0;
  double clock = 0, gpu_free_at = 0;  // the GPU runs queued work from gpu_free_at on
  int calls = 0;
  double first_end = -1, load_after_first = 0, queued_since_wait = 0, largest_batch = 0;

  void body() {
    clock += host_s + (calls == 0 ? first_host_s : 0);
    gpu_free_at = std::max(gpu_free_at, clock) + gpu_s;
    if (first_end >= 0) load_after_first += gpu_s;
    queued_since_wait += gpu_s;
    ++calls;
  }
  void wait() {
    clock = std::max(clock, gpu_free_at);
    if (first_end < 0) first_end = clock;
    largest_batch = std::max(largest_batch, queued_since_wait);
    queued_since_wait = 0;
  }
  WarmupResult run(int warmup, double floor_s, double budget_s) {
    return warm_up(warmup, floor_s, budget_s, [this] { body(); }, [this] { wait(); }, [this] { return clock; });
  }
};

// A first iteration of up to 1.5 s (host work, the GPU idle) and 1 s of floor: the GPU still gets
// about a second of work after it (counted from the start it got 0.2 s after a 0.8 s one). The GPU
// idles only for the host part of each batch's first call (0.1 ms, about 20 batches).
TEST(BenchWarmup, LoadsTheGpuForTheFloorAfterASlowFirstIteration) {
  for (double first : {0.0, 0.3, 0.8, 1.5}) {
    FakeDevice dev;
    dev.first_host_s = first;
    const WarmupResult r = dev.run(5, 1.0, 2.0);
    EXPECT_GE(dev.load_after_first, 0.99) << "first iteration " << first << " s";
    EXPECT_LT(dev.load_after_first, 1.0 + 0.05) << "first iteration " << first << " s: past the floor by a batch";
    EXPECT_EQ(r.iterations, dev.calls);
  }
}

// Iterations past the first two are waited for once a batch of at most 50 ms of GPU work (sized on
// the second iteration's host + GPU time): a second of 5 ms iterations takes about 20 waits, not
// 200; of 0.2 ms ones (0.3 ms with the host's part) about 30, not 5,000.
TEST(BenchWarmup, WaitsOncePerBatchOfAbout50ms) {
  for (double gpu : {2e-4, 5e-3, 0.02}) {
    FakeDevice dev;
    dev.gpu_s = gpu;
    const WarmupResult r = dev.run(5, 1.0, 2.0);
    EXPECT_GE(r.iterations, static_cast<int>(0.99 / gpu)) << "gpu " << gpu;
    EXPECT_LE(r.waits, 2 + static_cast<int>(1.0 / 0.03) + 2) << "gpu " << gpu;
    if (gpu <= 5e-3) {  // batches of 9 iterations or more
      EXPECT_GE(r.iterations, 5 * r.waits) << "gpu " << gpu;
    }
    EXPECT_LE(dev.largest_batch, std::max(0.05, gpu) + 1e-9) << "gpu " << gpu;
  }
}

// No floor (the CPU, or --warmup-s 0): exactly the count, each of the first two waited for alone;
// --warmup 0: nothing at all.
TEST(BenchWarmup, CountOnlyWithoutAFloor) {
  for (int warmup : {1, 2, 5, 40}) {
    FakeDevice dev;
    const WarmupResult r = dev.run(warmup, 0.0, 2.0);
    EXPECT_EQ(r.iterations, warmup);
    EXPECT_EQ(dev.calls, warmup);
    EXPECT_GE(r.waits, std::min(warmup, 2));
  }
  FakeDevice dev;
  const WarmupResult none = dev.run(0, 1.0, 2.0);
  EXPECT_EQ(none.iterations, 0);
  EXPECT_EQ(none.waits, 0);
  EXPECT_EQ(dev.calls, 0);
}

// The early stop at half the budget counts from the end of the first iteration too: with a 0.4 s
// budget and a 0.5 s first iteration the GPU still gets about 0.2 s (counted from the start it
// stopped after two iterations, 10 ms of load); never fewer than two iterations.
TEST(BenchWarmup, EarlyStopCountsFromTheFirstIteration) {
  FakeDevice dev;
  dev.first_host_s = 0.5;
  const WarmupResult r = dev.run(5, 1.0, 0.4);
  EXPECT_GE(dev.load_after_first, 0.19);
  EXPECT_LT(dev.load_after_first, 0.2 + 0.05);
  FakeDevice slow;
  slow.gpu_s = 3.0;  // every iteration past half the budget
  EXPECT_EQ(slow.run(5, 1.0, 2.0).iterations, 2);
  EXPECT_GE(r.iterations, 2);
}

// The cost of one iteration is the second's, without the first's one-time cost, on random costs.
TEST(BenchWarmup, CostOfAnIterationIsTheSecond) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    FakeDevice dev;
    dev.host_s = 1e-5 + 1e-3 * u(rng);
    dev.gpu_s = 1e-4 + 0.05 * u(rng);
    dev.first_host_s = 2.0 * u(rng);
    const WarmupResult r = dev.run(5, 1.0, 10.0);
    EXPECT_NEAR(r.per_iter_s, dev.host_s + dev.gpu_s, 1e-9) << "trial " << trial;
  }
}

}  // namespace
