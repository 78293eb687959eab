// GPU time per kernel over a few training steps (./train --profile-steps N): libtorch's Kineto
// profiler records every CUDA kernel, memset and copy; the report groups them by name and gives
// each one's time per step and the op that launched it (aten::..., an autograd Function), so two
// runs (say --use-cuda-kernel and --attention-impl sdpa) can be compared line by line. The full
// trace is saved as Chrome-trace JSON (chrome://tracing, Perfetto).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace flashcos::model {

// Starts recording CPU ops and CUDA activity; throws std::runtime_error if a profiler is already on.
void start_step_profile();

// Stops recording, saves the trace to `trace_path` (skipped when empty), and returns the report
// (profile_report below; `unit` names what was run `steps` times: "step" for the trainer, "iteration"
// for ./train bench). In a data-parallel run it also gives the communication kernels' (nccl*) time
// per step and how much of it is exposed: time when a communication kernel runs and no other kernel does.
std::string stop_step_profile(int64_t steps, const std::string& trace_path, int top = 30,
                              const std::string& unit = "step");

// One GPU activity of a recording (a kernel, memset or copy): its name, [start, end) in ns, and the
// op that launched it ("" if none is known).
struct KernelRecord {
  std::string name;
  uint64_t start_ns = 0, end_ns = 0;
  std::string op;
};

// stop_step_profile's report from its records: per kernel name (costliest first, the `top` ones shown,
// the rest summed) its time per step, its share, its time alone (while no kernel of another name
// ran: what it adds to the span) and its calls; above them the kernel time (summed, so kernels that
// overlap count twice), the span from the first start to the last end, and the time within the span
// when no kernel ran.
std::string profile_report(const std::vector<KernelRecord>& kernels, int64_t steps, int top = 30,
                           const std::string& unit = "step");

// Stops a recording that did not reach its end (the run stopped early): no trace, no report, no
// exceptions.
void abandon_step_profile() noexcept;

// [start, end) intervals: the total length of `a`'s union not covered by `b`'s union (ns).
using Interval = std::pair<uint64_t, uint64_t>;
uint64_t uncovered_ns(std::vector<Interval> a, std::vector<Interval> b);

}  // namespace flashcos::model
