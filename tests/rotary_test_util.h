// Float64 references for rotary positions (flashcos/rotary.h), written as plain loops: pairs
// (2m, 2m + 1) of each group of gs features, angle = float(t) * float(base^(-2m / gs)) formed in
// float32 as the spec says, cos / sin in float64; the l2norm and its backward in float64.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

namespace flashcos::test {

// R(t) x (transpose: R(t)^T x) for x (..., T, D), t = offset + index along dim -2; float64 result.
inline at::Tensor rotary_loop(const at::Tensor& x, int64_t groups, double base, int64_t offset, bool transpose = false) {
  const at::Tensor xd = x.detach().to(at::kDouble).contiguous();
  at::Tensor y = at::empty_like(xd);
  const int64_t D = xd.size(-1), T = xd.size(-2), rows = xd.numel() / (T * D), gs = D / groups;
  const double* X = xd.data_ptr<double>();
  double* Y = y.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t m = 0; m < gs / 2; ++m) {
          const float inv = static_cast<float>(std::pow(base, -2.0 * double(m) / double(gs)));
          const float angle = static_cast<float>(offset + t) * inv;
          const double c = std::cos(double(angle)), s = (transpose ? -1.0 : 1.0) * std::sin(double(angle));
          const int64_t i = (r * T + t) * D + g * gs + 2 * m;
          Y[i] = X[i] * c - X[i + 1] * s;
          Y[i + 1] = X[i] * s + X[i + 1] * c;
        }
      }
    }
  }
  return y;
}

// x / max(|x_g|, 1e-12) per group of the last dim, float64.
inline at::Tensor l2norm64(const at::Tensor& x, int64_t groups) {
  const at::Tensor xd = x.detach().to(at::kDouble);
  auto sizes = xd.sizes().vec();
  sizes.back() = groups;
  sizes.push_back(xd.size(-1) / groups);
  const at::Tensor g = xd.reshape(sizes);
  return (g / g.norm(2, -1, true).clamp_min(1e-12)).reshape(xd.sizes());
}

// d/dx of l2norm64 for the incoming gradient dy (of the normalised, unrotated y): r (dy - y sum_g(dy y)).
inline at::Tensor l2norm64_backward(const at::Tensor& x, const at::Tensor& dy, int64_t groups) {
  const at::Tensor xd = x.detach().to(at::kDouble);
  auto sizes = xd.sizes().vec();
  sizes.back() = groups;
  sizes.push_back(xd.size(-1) / groups);
  const at::Tensor g = xd.reshape(sizes), dg = dy.detach().to(at::kDouble).reshape(sizes);
  const at::Tensor r = 1.0 / g.norm(2, -1, true).clamp_min(1e-12);
  const at::Tensor y = g * r;
  return (r * (dg - y * (dg * y).sum(-1, true))).reshape(xd.sizes());
}

}  // namespace flashcos::test
