// The plain reference attention: libtorch ops with the whole (I, J) matrix, autograd for the
// backward. Used by the tests (in float64 it is the reference) and as the benchmark baseline.
#include <ATen/ATen.h>

#include "attention/attention.h"
#include "attention/canonical.h"

namespace flashcos {

at::Tensor l2norm(const at::Tensor& t, int64_t groups) {
  TORCH_CHECK(groups >= 1 && t.size(-1) % groups == 0, "flashcos l2norm: groups (", groups,
              ") must divide the last dim ", t.size(-1));
  auto sizes = t.sizes().vec();
  sizes.back() = t.size(-1) / groups;
  sizes.insert(sizes.end() - 1, groups);
  // Norms in at least float32 (bf16 sums of squares lose too much), result in t's dtype.
  const auto compute = t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto g = t.reshape(sizes).to(compute);
  auto norm = g.pow(2).sum(-1, /*keepdim=*/true).clamp_min(1e-24).rsqrt();
  return (g * norm).reshape(t.sizes()).to(t.scalar_type());
}

at::Tensor plain_cosine_sim_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      AttentionOptions options) {
  auto c = detail::canonicalize(q, k, v, options);
  if (options.kind() == AttentionKind::kCosine && options.l2norm_qk()) {
    c.q = l2norm(c.q, options.groups());
    c.k = l2norm(c.k, options.groups());
  }
  return c.restore(detail::plain_attention_core(c, options));
}

}  // namespace flashcos
