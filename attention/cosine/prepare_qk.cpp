// q and k before the attention core: l2norm (cosine kind) and rotary positions (flashcos/rotary.h).
// With causal bottom-right alignment query i sits at key position i + J - I, so the rotation
// places it there: only q_pos - k_pos enters R(q_pos) q . R(k_pos) k.
#include <flashcos/attention.h>

#include "attention/cosine/canonical.h"

namespace flashcos::detail {

void prepare_qk(Canonical& c, const AttentionOptions& options) {
  const bool normalise = options.kind() == AttentionKind::kCosine && options.l2norm_qk();
  const int64_t groups = options.groups();
  if (!options.rotary()) {
    if (normalise) {
      c.q = l2norm(c.q, groups);
      c.k = l2norm(c.k, groups);
    }
    return;
  }
  TORCH_CHECK(options.position_offset() >= 0, "flashcos attention: position_offset must be >= 0, got ",
              options.position_offset());
  const int64_t k_pos = options.position_offset(), q_pos = k_pos + c.J - c.I;
  TORCH_CHECK(q_pos >= 0, "flashcos attention: with rotary, I (", c.I, ") queries need J >= I keys (got J = ", c.J,
              ") or a position_offset >= I - J");
  if (normalise) {
    c.q = l2norm_rotary(c.q, groups, options.rotary_base(), q_pos);
    c.k = l2norm_rotary(c.k, groups, options.rotary_base(), k_pos);
  } else {
    c.q = rotary(c.q, groups, options.rotary_base(), q_pos);
    c.k = rotary(c.k, groups, options.rotary_base(), k_pos);
  }
}

}  // namespace flashcos::detail
