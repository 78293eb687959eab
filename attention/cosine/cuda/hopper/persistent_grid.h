// The size of the Hopper kernels' persistent grids, host only: one CTA an SM, each taking item after
// item (the forward's row blocks in a fixed stride, fwd_launch_ws.cuh; the backward's key blocks and
// split pieces from a counter as it comes free, bwd_hopper.cuh). tests/test_hopper_fwd_rows.cpp checks
// it on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace flashcos::cuda::hopper {

// The mode of a persistent grid: kPersistentDefault (where the kernel's launcher has measured it
// faster: the forward without a causal mask, the backward with one), kPersistentAll (always), 0
// (never) or a count n >= 1 (at most n CTAs, for tests, where each CTA then walks many items).
inline constexpr int64_t kPersistentDefault = -1;
inline constexpr int64_t kPersistentAll = -2;

// The mode an environment variable gives: unset or empty the default, "all", or a count ("0": never).
inline int64_t persistent_mode(const char* env) {
  const std::string s = env != nullptr ? env : "";
  return s.empty() ? kPersistentDefault : s == "all" ? kPersistentAll : int64_t(std::max(0, std::atoi(s.c_str())));
}

// The CTAs of a persistent grid for `items` items on `sms` SMs, or 0 for a CTA an item; by_default:
// whether kPersistentDefault is persistent for this launch.
inline int64_t persistent_ctas(int64_t mode, bool by_default, int64_t items, int sms) {
  int64_t ctas = 0;
  if (mode > 0) {
    ctas = std::min<int64_t>(mode, sms);
  } else if (mode == kPersistentAll || (mode == kPersistentDefault && by_default)) {
    ctas = sms;
  }
  return ctas > 0 && items > ctas ? ctas : 0;
}

}  // namespace flashcos::cuda::hopper
