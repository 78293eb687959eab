// The size of the Hopper kernels' persistent grids, host only: one CTA an SM, each walking the
// grid's items in a fixed stride (the forward's row blocks, fwd_launch_ws.cuh; the backward's key
// blocks and split pieces, bwd_hopper.cuh). tests/test_hopper_fwd_rows.cpp checks it on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace flashcos::cuda::hopper {

// The mode of a persistent grid: kPersistentDefault (without a causal mask only), kPersistentAll
// (causal too), 0 (never) or a count n >= 1 (at most n CTAs, causal or not: for tests, where each
// CTA then walks many items). A causal grid's items differ in length, and the persistent CTAs take
// theirs in a fixed stride, where the GPU hands a one-item-a-CTA grid's CTAs to the SMs as they free
// up.
inline constexpr int64_t kPersistentDefault = -1;
inline constexpr int64_t kPersistentAll = -2;

// The mode an environment variable gives: unset or empty the default, "all", or a count ("0": never).
inline int64_t persistent_mode(const char* env) {
  const std::string s = env != nullptr ? env : "";
  return s.empty() ? kPersistentDefault : s == "all" ? kPersistentAll : int64_t(std::max(0, std::atoi(s.c_str())));
}

// The CTAs of a persistent grid for `items` items on `sms` SMs, or 0 for a CTA an item.
inline int64_t persistent_ctas(int64_t mode, bool causal, int64_t items, int sms) {
  int64_t ctas = 0;
  if (mode > 0) {
    ctas = std::min<int64_t>(mode, sms);
  } else if (mode == kPersistentAll || (mode == kPersistentDefault && !causal)) {
    ctas = sms;
  }
  return ctas > 0 && items > ctas ? ctas : 0;
}

}  // namespace flashcos::cuda::hopper
