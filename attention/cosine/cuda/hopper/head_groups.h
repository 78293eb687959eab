// Causal grids of the Hopper kernels in head groups, host and device code (checked on the CPU by
// tests/test_hopper_head_groups.cpp): which CTA of a (b, head) a block index takes (grouped_cta),
// and how many (b, head)s a group holds (filling_head_group, host only). Users: the backward's order
// (bwd_order.h) and the forward's grid (fwd_hopper_ws.cuh).
//
// Under a causal mask the CTAs of one (b, head) differ in length: the backward's key block 0 sees
// every query row, the forward's last row block every key. The GPU starts CTAs in index order as
// SMs free up. In groups of g (b, head)s, groups slowest and the longest CTAs of the group first,
// the CTAs running together share a few heads' operands in L2. But the long CTAs of the last group
// start late: with g 2 on b4 h8 at n 1024 (backward: 8 key blocks of 16 .. 2 steps), the last
// group's two 16-step CTAs start once 15 groups have gone, and the grid takes about 30 steps where
// its work over 132 SMs is 17.5 (a list-scheduling simulation: 1.6x its bound, as long as without
// a mask). A group's short CTAs hide its long ones' start once the group's work over the SMs lasts
// as long as its longest CTA: with lengths from L down to about 0, g x (CTAs per head) x L / 2 / SMs
// >= L, i.e. g x (CTAs per head) >= 2 SMs (taken within a 16th). The simulation, longest first
// inside groups, makespan over max(work / SMs, longest CTA), b4 h8 on 132 SMs: backward (d 128, n /
// 128 key blocks) n 1024 g 2 1.60, g 16 1.03; n 2048 g 2 1.27, g 16 1.03; n 4096 g 2 1.12, g 8
// 1.00; n 8192 g 2 1.007, g 4 1.002; forward (d 64, 192-row blocks) n 1024 g 1 1.50, g 16 1.00; n
// 4096 g 1 1.21, g 16 1.03; n 8192 g 1 1.10, g 8 1.02; n 16384 g 1 1.04, g 4 1.01.
// At most kMaxHeadGroup (b, head)s: a wider group spreads the CTAs running together over more heads'
// operands and dQ than L2 keeps. H100, b32 h8 n 1024 d64 causal bf16 (2048 CTAs a direction, 15.5
// waves, where the simulation promised 3-4 % from groups of 16-32), kernel us under ncu (run V3),
// forward / backward by group size: 1 / 2 (the fixed orders) 139.5 / 296; 4 138.0 / 295; 8 137.7 /
// 289; 16 138.7 / 292; 32 140.6 / 301.5; 256 (every head) 152.8 / 444.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHCOS_HD __host__ __device__ __forceinline__
#else
#define FLASHCOS_HD inline
#endif

namespace flashcos::cuda::hopper {

FLASHCOS_HD int order_min(int a, int b) { return a < b ? a : b; }

// Block `block` of a grid of per_head CTAs for each of heads_batches (b, head)s, in groups of
// `group` (b, head)s (group >= 1; the last group may be narrower): groups slowest, then the CTA's
// rank inside its (b, head) (0 first), then the (b, head) inside the group.
struct GroupedCta {
  int rank, hb;
};
FLASHCOS_HD GroupedCta grouped_cta(unsigned block, int per_head, int heads_batches, int group) {
  const unsigned g_ctas = unsigned(group) * unsigned(per_head);
  const int g_idx = int(block / g_ctas), in_g = int(block % g_ctas);
  const int g_w = order_min(group, heads_batches - g_idx * group);
  return {in_g / g_w, g_idx * group + in_g % g_w};
}

inline constexpr int kMaxHeadGroup = 16;

// The group size for a causal grid of per_head CTAs per (b, head) on `sms` SMs: `base` doubled
// until the group holds 15/16 of twice the SMs in CTAs, every (b, head) or kMaxHeadGroup of them;
// base <= 0 stays (no groups). sms <= 0 (unknown) keeps base.
inline int filling_head_group(int base, int64_t per_head, int64_t heads_batches, int sms) {
  if (base <= 0 || sms <= 0) return base;
  int64_t g = base;
  while (g < heads_batches && 2 * g <= kMaxHeadGroup && g * per_head * 16 < int64_t(sms) * 30) g *= 2;
  return int(std::min<int64_t>(g, std::max<int64_t>(heads_batches, base)));
}

}  // namespace flashcos::cuda::hopper
