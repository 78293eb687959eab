// The plain reference attention: libtorch ops with the whole (I, J) matrix, autograd for the
// backward. Used by the tests (in float64 it is the reference) and as the benchmark baseline.
#include <ATen/ATen.h>

#include <flashcos/attention.h>
#include "attention/cosine/canonical.h"

namespace flashcos {

at::Tensor plain_cosine_sim_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      AttentionOptions options) {
  auto c = detail::canonicalize(q, k, v, options);
  detail::prepare_qk(c, options);
  return c.restore(detail::plain_attention_core(c, options));
}

}  // namespace flashcos
