#include "attention/cosine/canonical.h"

#include <limits>

#include <ATen/ATen.h>

#include <cmath>

namespace flashcos::detail {
namespace {

std::string shape_str(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + ")";
}

}  // namespace

Canonical canonicalize(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const AttentionOptions& options) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "flashcos attention: q, k and v must be defined tensors");
  TORCH_CHECK(q.dim() == 3 || q.dim() == 4,
              "flashcos attention: q must be (B, H, I, D) or merged (BH, I, D), got ", shape_str(q));
  TORCH_CHECK(k.dim() == v.dim(), "flashcos attention: k and v must have the same rank, got k ",
              shape_str(k), " and v ", shape_str(v));
  TORCH_CHECK(at::isFloatingType(q.scalar_type()),
              "flashcos attention: q must be floating point (float64/float32/float16/bfloat16), got ",
              q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "flashcos attention: q, k, v must share one dtype, got q ", q.scalar_type(), ", k ",
              k.scalar_type(), ", v ", v.scalar_type(), " (cast them first, e.g. .to(q.dtype()))");
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(),
              "flashcos attention: q, k, v must be on one device, got q on ", q.device(), ", k on ",
              k.device(), ", v on ", v.device());

  Canonical c;
  if (q.dim() == 3) {
    TORCH_CHECK(k.dim() == 3, "flashcos attention: merged q (BH, I, D) needs merged k, v (BH, J, D), got k ",
                shape_str(k));
    c.merged = true;
    c.q = q.unsqueeze(1);
    c.k = k.unsqueeze(1);
    c.v = v.unsqueeze(1);
  } else {
    TORCH_CHECK(k.dim() == 4 || k.dim() == 3,
                "flashcos attention: k, v must be (B, Hkv, J, D) or single-headed (B, J, D), got k ",
                shape_str(k));
    c.q = q;
    c.k = k.dim() == 3 ? k.unsqueeze(1) : k;
    c.v = v.dim() == 3 ? v.unsqueeze(1) : v;
  }
  c.B = c.q.size(0);
  c.H = c.q.size(1);
  c.I = c.q.size(2);
  c.D = c.q.size(3);
  c.Hkv = c.k.size(1);
  c.J = c.k.size(2);
  TORCH_CHECK(c.k.size(0) == c.B && c.v.size(0) == c.B,
              "flashcos attention: batch size of k ", shape_str(k), " and v ", shape_str(v),
              " must match q's ", c.B);
  TORCH_CHECK(c.v.size(1) == c.Hkv && c.v.size(2) == c.J,
              "flashcos attention: k ", shape_str(k), " and v ", shape_str(v), " must have the same heads and length");
  TORCH_CHECK(c.k.size(3) == c.D && c.v.size(3) == c.D,
              "flashcos attention: head dim of k and v must equal q's ", c.D, ", got k ", shape_str(k),
              ", v ", shape_str(v));
  TORCH_CHECK(c.Hkv >= 1 && c.H % c.Hkv == 0, "flashcos attention: q heads (", c.H,
              ") must be a multiple of k/v heads (", c.Hkv, ")");
  TORCH_CHECK(c.I >= 1 && c.J >= 1 && c.D >= 1 && c.B >= 1,
              "flashcos attention: empty input, q ", shape_str(q), ", k ", shape_str(k));
  TORCH_CHECK(std::isfinite(options.scale()), "flashcos attention: scale must be finite, got ", options.scale());
  TORCH_CHECK(options.groups() >= 1 && c.D % options.groups() == 0,
              "flashcos attention: groups (", options.groups(), ") must divide the head dim ", c.D);
  TORCH_CHECK(options.tile_size() >= 1, "flashcos attention: tile_size must be >= 1, got ", options.tile_size());

  if (options.mask().defined()) {
    const auto& m = options.mask();
    TORCH_CHECK(m.scalar_type() == at::kBool, "flashcos attention: mask must be bool (true = attend), got ",
                m.scalar_type());
    TORCH_CHECK(m.dim() == 2 && m.size(0) == c.B && m.size(1) == c.J,
                "flashcos attention: mask must be (B, J) = (", c.B, ", ", c.J, "), got ", shape_str(m));
    TORCH_CHECK(m.device() == q.device(), "flashcos attention: mask must be on ", q.device(), ", got ", m.device());
    c.mask = m;
  }
  if (options.attn_bias().defined()) {
    const auto& b = options.attn_bias();
    const int64_t lead = options.attn_bias_batch_dim() ? c.B : c.H;
    const char* form = options.attn_bias_batch_dim() ? "(B, I, J)" : "(H, I, J)";
    TORCH_CHECK(at::isFloatingType(b.scalar_type()), "flashcos attention: attn_bias must be floating point, got ",
                b.scalar_type());
    TORCH_CHECK(b.dim() == 3 && b.size(0) == lead && b.size(1) == c.I && b.size(2) == c.J,
                "flashcos attention: attn_bias must be ", form, " = (", lead, ", ", c.I, ", ", c.J, "), got ",
                shape_str(b),
                options.attn_bias_batch_dim() ? "" : " (pass attn_bias_batch_dim(true) for a (B, I, J) bias)");
    TORCH_CHECK(b.device() == q.device(), "flashcos attention: attn_bias must be on ", q.device(), ", got ",
                b.device());
    c.bias = b;
  }
  return c;
}

at::Tensor keep_matrix(const at::Tensor& mask, bool causal, int64_t I, int64_t J, int64_t i0, int64_t i1,
                       int64_t j0, int64_t j1, const at::TensorOptions& device) {
  at::Tensor keep;
  if (causal) {
    // query r may see keys 0 .. r + J - I (bottom-right aligned)
    auto rows = at::arange(i0, i1, device.dtype(at::kLong)).unsqueeze(1) + (J - I);
    auto cols = at::arange(j0, j1, device.dtype(at::kLong)).unsqueeze(0);
    keep = (cols <= rows).view({1, 1, i1 - i0, j1 - j0});
  }
  if (mask.defined()) {
    auto m = mask.slice(1, j0, j1).view({mask.size(0), 1, 1, j1 - j0});
    keep = keep.defined() ? at::logical_and(keep, m) : m;
  }
  return keep;
}

at::Tensor plain_attention_core(const Canonical& c, const AttentionOptions& options) {
  const bool exp_kind = options.kind() == AttentionKind::kExp;
  const int64_t G = c.H / c.Hkv;
  auto k = G > 1 ? c.k.repeat_interleave(G, 1) : c.k;
  auto v = G > 1 ? c.v.repeat_interleave(G, 1) : c.v;
  auto sim = at::matmul(c.q, k.transpose(-1, -2)) * options.scale();  // (B, H, I, J)
  if (!exp_kind) sim = sim - options.scale();
  if (c.bias.defined()) {
    sim = sim + (options.attn_bias_batch_dim() ? c.bias.unsqueeze(1) : c.bias.unsqueeze(0));
  }
  auto keep = keep_matrix(c.mask, options.causal(), c.I, c.J, 0, c.I, 0, c.J, c.q.options());
  if (exp_kind) {
    if (keep.defined()) sim = sim.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
    return at::matmul(sim.exp(), v);
  }
  // Cosine kind through softmax (it subtracts the row max; the constant "- scale" cancels): exp(sim) / l
  // with autograd differentiates 1 / l^2, which overflows fp16 when a row sees few, dissimilar keys.
  // A row with nothing to attend gets zero logits before the softmax and zero weights after it.
  if (!keep.defined()) return at::matmul(sim.softmax(-1), v);
  auto row_any = keep.any(-1, /*keepdim=*/true);
  sim = sim.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity())
            .masked_fill(row_any.logical_not(), 0.0);
  auto attn = sim.softmax(-1).masked_fill(row_any.logical_not(), 0.0);
  return at::matmul(attn, v);
}

}  // namespace flashcos::detail
