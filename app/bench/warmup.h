// ./train bench's warm-up before the timed iterations (timing.cpp), on a clock and a device wait
// given by the caller, so that the loop is tested without a GPU (tests/test_bench_warmup.cpp).
//
// The first two iterations are waited for one at a time: the first carries one-time costs
// (library handles, lazy module loading, allocator growth, cuDNN's graph for a new shape), so the
// cost of one iteration is taken from the second; the timed iterations' count is cut from it for
// slow configs (with the first, the H100 once timed 9 of 20 iterations of a 0.4 ms config).
//
// On CUDA the warm-up also keeps the GPU loaded for floor_s (--warmup-s, 1 s) after the end of the
// first iteration: under sustained load a GPU at its power limit lowers its clocks, and with a few
// ms of warm-up a short config's figure moved by up to 8 % between repeats and stood above the
// steady one; with 0.3 s an implementation that draws less power still moved by 11 % between two
// identical calls, with 1 s by 1 % (docs/performance.md, section 1, "How the warm-up moves the
// figures"). Past the first two, the iterations are queued in batches of about 50 ms with one wait
// a batch, as the timed ones are queued, so that the host's part of each iteration leaves the GPU
// no idle gap. It stops early once half the budget has passed since the first iteration, but not
// before two iterations.
//
// Until 518bf59 / 3aa8741 the second and the early stop counted from the start and every
// iteration was waited for: a slow first iteration (the GPU idle) could eat the second, and the
// timing begin cooler, at higher clocks. bench --clocks (2026-11-29, an H200 at its 700 W limit)
// found cuDNN's kept round at 120-422 W and up to 1,980 MHz in 11 of 48 rows of a matrix, ours at
// 682-698 W in all. With this loop, in two matrices (runs AV2 / AV3) every round kept of ours and of
// cuDNN ran at the power cap in every sample (docs/performance.md, section 1).
#pragma once

#include <algorithm>
#include <functional>

namespace flashcos::app::bench {

struct WarmupResult {
  int iterations = 0;     // calls of body
  int waits = 0;          // calls of wait
  double per_iter_s = 0;  // the second iteration's seconds (the first's when only one ran; 0: none)
};

// At least `warmup` iterations (0: none, whatever floor_s), and with floor_s > 0 until floor_s
// seconds have passed since the first one ended (at most half of budget_s, at least two
// iterations). body queues one iteration; wait waits until the device has run what was queued;
// now_s reads a clock in seconds.
inline WarmupResult warm_up(int warmup, double floor_s, double budget_s, const std::function<void()>& body,
                            const std::function<void()>& wait, const std::function<double()>& now_s) {
  constexpr double kBatchS = 0.05;  // queued between two waits
  constexpr int kMaxBatch = 256;
  WarmupResult r;
  if (warmup <= 0) return r;
  double loaded_at = 0;  // when the first iteration ended
  while (true) {
    const double loaded_s = r.iterations == 0 ? 0.0 : now_s() - loaded_at;
    const bool floor_met = r.iterations > 0 && loaded_s >= floor_s;
    if (r.iterations >= warmup && floor_met) break;
    if (r.iterations >= 2 && loaded_s > 0.5 * budget_s) break;
    int batch = 1;
    if (r.iterations >= 2 && r.per_iter_s > 0) {
      batch = std::clamp(static_cast<int>(kBatchS / r.per_iter_s), 1, kMaxBatch);
    }
    if (floor_met) batch = std::min(batch, warmup - r.iterations);  // only the count is left
    const double start = now_s();
    for (int i = 0; i < batch; ++i) body();
    r.iterations += batch;
    wait();
    ++r.waits;
    const double end = now_s();
    if (r.iterations == 1) loaded_at = end;
    if (r.iterations <= 2) r.per_iter_s = end - start;
  }
  return r;
}

}  // namespace flashcos::app::bench
