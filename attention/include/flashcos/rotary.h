// flashcos rotary positions (DESIGN.md, Positions): q and k are l2-normalised, then rotated.
//   R(t) rotates the pair of features (2m, 2m + 1) of each of the `groups` equal chunks of the last
//   dim (gs features each, m = 0 .. gs / 2 - 1) by the angle t * inv_freq[m],
//   inv_freq[m] = base^(-2m / gs) rounded to float, the angle formed in float32 as float(t) * inv_freq[m]
//   (cos / sin then in float32, float64 for double tensors). t = offset + the index along dim -2.
// A rotation keeps |x_g| = 1, and R(i) q . R(j) k depends on i - j only. Every path (the fused
// l2norm kernels, these libtorch ops) uses the same pairs and the same float angles.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace flashcos {

/// inv_freq[m] = float(base^(-2m / group_size)), m < group_size / 2.
std::vector<float> rotary_inv_freq(int64_t group_size, double base);
/// R(t) x for x (..., T, D), t = offset + index along dim -2; libtorch ops (autograd), any device.
at::Tensor rotary(const at::Tensor& x, int64_t groups, double base, int64_t offset = 0);
/// rotary(l2norm(x, groups), ...): one fused pass each way where the CUDA l2norm kernels apply.
at::Tensor l2norm_rotary(const at::Tensor& x, int64_t groups, double base, int64_t offset = 0);

}  // namespace flashcos
