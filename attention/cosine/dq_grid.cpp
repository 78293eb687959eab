// The deterministic mode's dQ grid: the rows' rounding constants (the math and the bound:
// dq_grid.h).
#include "attention/cosine/dq_grid.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace flashcos::detail {

at::Tensor dq_grid_constants(const at::Tensor& dout, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(dout.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(1) > 0 && dout.size(1) % k.size(1) == 0,
              "dq_grid_constants: dout (B, H, I, D), k and v (B, Hkv, J, D) with H a multiple of Hkv, got ",
              dout.sizes(), ", ", k.sizes(), ", ", v.sizes());
  const int64_t group = dout.size(1) / k.size(1);
  // Norms in float32 (float64 for float64 inputs, which the norm may not narrow).
  const at::ScalarType acc = dout.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor do_norm = at::linalg_vector_norm(dout, 2, {-1}, false, acc);  // (B, H, I)
  at::Tensor vk = at::linalg_vector_norm(v, 2, {-1}, false, acc).amax(-1) *
                  at::linalg_vector_norm(k, INFINITY, {2, 3}, false, acc);  // (B, Hkv)
  if (group > 1) vk = vk.repeat_interleave(group, 1);
  // A zero bound (a zero do_i: its dq is 0) gets the unit 2^-100, far inside float32's range.
  const at::Tensor bound = (do_norm * vk.unsqueeze(-1) * (2.5 * std::abs(scale))).clamp_min(std::ldexp(1.0, -78));
  return (1.5 * at::exp2(at::ceil(at::log2(bound)) + 1.0)).to(at::kFloat);  // 1.5 * 2^(u + 23), u = ceil - 22
}

}  // namespace flashcos::detail
