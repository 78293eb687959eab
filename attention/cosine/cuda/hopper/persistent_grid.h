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
// faster: the forward without a causal mask, the backward with one but fp16's 128-dim backward,
// bwd_persistent_by_default), kPersistentAll (always), 0
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

// Whether the backward's plain instance (bwd_hopper.cuh) has a persistent grid by default, for its
// 16-bit type (fp16 or not) and instance head dim (64 or 128; head dims up to 64 run the 64 one):
// under a causal mask, but for fp16 in the 128 instance; never without one. Measured on an H200 at
// b4 h8 n 8192 / 16384 against one CTA an item, backward TFLOP/s means of interleaved processes
// (docs/kernels-tried.md items 27, 35, 36 and 38). Causal: +0.0 to +6.2 % in all sixteen cases (run
// AG5, before fp16 formed dS by pairs); since then (runs AP6 / AP7, 3ed7081) bf16 d 64 +3.0 / -0.1 %,
// bf16 d 128 -0.4 / -0.2 %, fp16 d 64 +0.4 / +0.9 %, fp16 d 128 -1.5 / -0.4 % (its CTA-an-item process
// ahead in all six pairs). Without a causal mask: -1.0 to +2.8 %, means per case -0.3 to +2.3 % (run
// AH5), fp16 d 128 -0.8 / +0.5 % (AK4); fp16 d 64, ahead by 1.3-1.9 % before fp16's paired dS (AL3 /
// AL4), -3.7 / -3.3 % after it (AP5, one CTA an item ahead in all ten pairs).
inline bool bwd_persistent_by_default(bool fp16, int instance_dim, bool causal) {
  return causal && !(fp16 && instance_dim == 128);
}

}  // namespace flashcos::cuda::hopper
