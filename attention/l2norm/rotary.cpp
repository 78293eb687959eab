// Rotary positions in libtorch ops (flashcos/rotary.h): the path of every attention implementation
// but the fused packed one, and the reference the fused l2norm kernels are tested against.
//   x viewed as (..., T, groups, gs / 2, 2): (a, b) -> (a cos - b sin, a sin + b cos),
//   angle[t, m] = float(offset + t) * inv_freq[m] in float32 (cos / sin in float64 for double x).
#include <flashcos/rotary.h>

#include <ATen/ATen.h>

#include <cmath>

namespace flashcos {

std::vector<float> rotary_inv_freq(int64_t group_size, double base) {
  TORCH_CHECK(group_size >= 2 && group_size % 2 == 0, "flashcos rotary: the group size (head dim / groups) must be ",
              "even, got ", group_size);
  TORCH_CHECK(base > 0 && std::isfinite(base), "flashcos rotary: the base must be a finite number > 0, got ", base);
  std::vector<float> inv(static_cast<size_t>(group_size / 2));
  for (size_t m = 0; m < inv.size(); ++m) {
    inv[m] = static_cast<float>(std::pow(base, -2.0 * static_cast<double>(m) / static_cast<double>(group_size)));
  }
  return inv;
}

at::Tensor rotary(const at::Tensor& x, int64_t groups, double base, int64_t offset) {
  TORCH_CHECK(x.defined() && x.dim() >= 2, "flashcos rotary: x must be (..., T, D), got ",
              x.defined() ? c10::str(x.sizes()) : std::string("an undefined tensor"));
  const int64_t D = x.size(-1), T = x.size(-2);
  TORCH_CHECK(groups >= 1 && D % groups == 0, "flashcos rotary: groups (", groups, ") must divide the last dim ", D);
  TORCH_CHECK(offset >= 0 && offset + T <= (int64_t(1) << 24), "flashcos rotary: positions ", offset, " .. ",
              offset + T, " must lie in [0, 2^24] (exact in float32)");
  const int64_t gs = D / groups, P = gs / 2;
  const auto inv_host = rotary_inv_freq(gs, base);
  const auto f32 = x.options().dtype(at::kFloat);
  const at::Tensor inv = at::tensor(inv_host, at::TensorOptions().dtype(at::kFloat)).to(x.device());
  const at::Tensor pos = at::arange(offset, offset + T, x.options().dtype(at::kLong)).to(f32);
  const at::ScalarType ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor angle = (pos.unsqueeze(1) * inv.unsqueeze(0)).to(ct).unsqueeze(1);  // (T, 1, P)
  const at::Tensor cs = angle.cos(), sn = angle.sin();
  auto sizes = x.sizes().vec();
  sizes.back() = groups;
  sizes.push_back(P);
  sizes.push_back(2);
  const at::Tensor xg = x.to(ct).reshape(sizes);  // (..., T, groups, P, 2)
  const at::Tensor a = xg.select(-1, 0), b = xg.select(-1, 1);
  return at::stack({a * cs - b * sn, a * sn + b * cs}, -1).reshape(x.sizes()).to(x.scalar_type());
}

}  // namespace flashcos
