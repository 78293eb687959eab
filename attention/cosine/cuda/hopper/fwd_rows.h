// How many query rows a CTA of the Hopper forward takes at d 64: 192 (3 consumer warpgroups, the
// faster per row) or 128 (2 warpgroups), host only; tests/test_hopper_fwd_rows.cpp checks it on the
// CPU. The launcher: hopper/fwd_hopper.cuh.
//
// Per row and key, a 128-row CTA costs kFwdRowCost128 times a 192-row one (H100, bf16 / fp16, run
// S4 of 2026-11-27: 1.18-1.20 wherever whole waves hide the difference in grid size). On a short
// sequence the 192-row grid wastes more: fewer CTAs leave SMs idle in the last wave, the last block
// of rows is mostly past I, and under a causal mask a taller block computes more of the masked
// triangle. The estimate, in row-keys of a 192-row CTA:
//   not causal: waves x the cost of one CTA, waves = ceil(CTAs / SMs) (every CTA does the same work);
//   causal: max(the grid's work / SMs, its longest CTA), the CTAs being of many lengths (launched
//           longest first in each head group, head_groups.h, so the short ones fill the last wave).
// The 128-row grid runs where its estimate is below the 192-row grid's.
#pragma once

#include <algorithm>
#include <cstdint>

namespace flashcos::cuda::hopper {

inline constexpr double kFwdRowCost128 = 1.19;

struct FwdGridShape {
  int64_t heads_batches = 1;  // B x H: the CTAs of one row block
  int64_t I = 1, J = 1;       // query rows, keys
  bool causal = false;        // keys past row i + J - I are masked
  int sms = 132;              // multiprocessors of the device
};

// The estimated time of the forward with `rows`-row CTAs, in row-keys of a 192-row CTA.
inline double fwd_grid_estimate(const FwdGridShape& s, int rows) {
  const double cost = rows == 128 ? kFwdRowCost128 : 1.0;
  const int64_t m_blocks = (s.I + rows - 1) / rows;
  const int64_t ctas = m_blocks * s.heads_batches;
  const int64_t sms = std::max(1, s.sms);
  if (!s.causal) {
    const int64_t waves = (ctas + sms - 1) / sms;
    return cost * double(waves) * double(rows) * double(s.J);
  }
  // Row block m sees the keys up to its last row's diagonal, (m + 1) rows + J - I of them.
  double work = 0, longest = 0;
  for (int64_t m = 0; m < m_blocks; ++m) {
    const int64_t keys = std::clamp<int64_t>((m + 1) * rows + s.J - s.I, 0, s.J);
    work += double(rows) * double(keys);
    longest = std::max(longest, double(rows) * double(keys));
  }
  return cost * std::max(work * double(s.heads_batches) / double(sms), longest);
}

// d 64: 128-row CTAs (2 consumer warpgroups) instead of 192-row ones (3).
inline bool fwd_prefer_128_rows(const FwdGridShape& s) {
  return fwd_grid_estimate(s, 128) < fwd_grid_estimate(s, 192);
}

}  // namespace flashcos::cuda::hopper
