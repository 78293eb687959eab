// ./train bench: timing one implementation x pass x configuration (warm-up, CUDA events or
// std::chrono, the median), its peak memory, failures (oom, n/a) and a CUDA context that broke.
#pragma once

#include "app/bench/gpu_clocks.h"
#include "app/bench/impls.h"
#include "app/bench/options.h"

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace flashcos::app::bench {

struct Measurement {
  std::string status = "ok";  // ok | oom | n/a | skip
  std::string reason;
  double ms = 0, ms_min = 0, ms_mean = 0;
  int iters = 0;
  // With --rounds: the median of each round that ran, in round order (ms is the least of them).
  std::vector<double> round_ms;
  int64_t peak_bytes = -1;  // peak allocated by the caching allocator during the pass (CUDA)
  int64_t base_bytes = -1;  // allocated when the pass started (the inputs, mostly)
  std::string profile;      // with profile: model/profile.h's report of cfg.profile more iterations
  ClockStats clocks;        // with a ClockSampler: over the timed iterations (samples 0: not sampled)
  std::vector<ClockStats> round_clocks;  // with --rounds and a sampler: each round's, as round_ms
};

// A CUDA error that left the context unusable (illegal address, device-side assert): every later
// measurement would fail too, so the run stops (what was measured is in the JSON already).
struct DeviceLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What a failure to run or to set up a measurement was: "oom" for an allocation that failed (CUDA's
// out-of-memory error, std::bad_alloc, the CPU allocator's "can't allocate memory"), else "n/a";
// with the message without libtorch's backtrace.
struct Failure {
  std::string status, what;
};
Failure classify_failure(const std::exception& e);

// Times `impl` on `in` for `pass` (see the top of bench.cpp). A failure is a Measurement with
// status oom or n/a and the reason; DeviceLost when it left the CUDA device unusable. profile (and
// cfg.profile > 0): then cfg.profile iterations more under libtorch's profiler, into m.profile. clocks
// (--clocks): sampled over the timed iterations, into m.clocks.
Measurement measure(const BenchConfig& cfg, const Impl& impl, Pass pass, const Inputs& in, bool profile = false,
                    ClockSampler* clocks = nullptr);

// Whether timing `impl` at length n can be skipped given its last result at a shorter length in
// this table: after an oom, or when its time per iteration (at least 5% of --budget), scaled by
// (n / n_last)^2 (linear for fastmax's factorised paths), would pass 10x --budget. status "ok"
// means: measure it.
Measurement predicted_skip(const BenchConfig& cfg, const std::string& impl, int64_t n,
                           const std::map<std::string, std::pair<int64_t, Measurement>>& last);

}  // namespace flashcos::app::bench
