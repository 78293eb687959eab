// The tiled path: the fused kernels' algorithm in chunked libtorch ops, on any device.
// Memory beyond inputs and outputs is O(B * H * tile^2) per step, never (I, J) whole, so CPU
// inference and training run long sequences; it also serves as the CPU backward in CI.
//
// Shapes: q (B, H, I, D) viewed as (B, Hkv, G, I, D) with G = H / Hkv query heads per k/v head,
// k / v (B, Hkv, 1, J, D), so grouped and multi-query attention broadcast in the matmuls.
// Accumulation in float32 (float64 for double inputs).
#include <ATen/ATen.h>

#include <limits>

#include "attention/cosine/canonical.h"
#include "attention/cosine/core.h"

namespace flashcos::detail {
namespace {

at::ScalarType compute_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Shared geometry of one call.
struct Tiling {
  int64_t B, H, Hkv, G, I, J, D, tile;
  bool causal;
  // First key index a query row r may not see under causal masking: r + J - I + 1.
  bool block_empty(int64_t i1, int64_t j0) const { return causal && j0 > (i1 - 1) + J - I; }
};

Tiling make_tiling(const at::Tensor& q, const at::Tensor& k, const CoreArgs& args) {
  Tiling t{q.size(0), q.size(1), k.size(1), q.size(1) / k.size(1), q.size(2), k.size(2), q.size(3),
           args.tile_size, args.causal};
  return t;
}

// exp(logits) for the block [i0, i1) x [j0, j1), zero where masked: (B, Hkv, G, Ic, Jc).
at::Tensor block_probs(const at::Tensor& q5, const at::Tensor& k5, const at::Tensor& mask, const at::Tensor& bias,
                       const CoreArgs& args, const Tiling& t, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t ic = i1 - i0, jc = j1 - j0;
  auto qb = q5.slice(3, i0, i1);
  auto kb = k5.slice(3, j0, j1);
  auto s = at::matmul(qb, kb.transpose(-1, -2)).mul_(args.scale);
  if (!args.exp_kind) s.sub_(args.scale);
  if (bias.defined()) {
    auto bb = bias.slice(1, i0, i1).slice(2, j0, j1).to(s.scalar_type());
    s.add_(args.bias_batch_dim ? bb.view({t.B, 1, 1, ic, jc}) : bb.view({1, t.Hkv, t.G, ic, jc}));
  }
  auto keep = keep_matrix(mask, args.causal, t.I, t.J, i0, i1, j0, j1, s.options());
  if (keep.defined()) {
    keep = keep.view({keep.size(0), 1, 1, keep.size(-2), jc});  // (B or 1, 1, 1, ic or 1, jc)
    s.masked_fill_(keep.logical_not(), -std::numeric_limits<double>::infinity());
  }
  return s.exp_();
}

}  // namespace

ForwardResult tiled_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            const at::Tensor& bias, const CoreArgs& args) {
  const Tiling t = make_tiling(q, k, args);
  const auto ct = compute_type(q);
  auto q5 = q.to(ct).view({t.B, t.Hkv, t.G, t.I, t.D});
  auto k5 = k.to(ct).unsqueeze(2);  // (B, Hkv, 1, J, D)
  auto v5 = v.to(ct).unsqueeze(2);
  auto acc = at::zeros({t.B, t.Hkv, t.G, t.I, t.D}, q5.options());
  auto l = at::zeros({t.B, t.Hkv, t.G, t.I}, q5.options());
  for (int64_t i0 = 0; i0 < t.I; i0 += t.tile) {
    const int64_t i1 = std::min(t.I, i0 + t.tile);
    auto acc_b = acc.slice(3, i0, i1);
    auto l_b = l.slice(3, i0, i1);
    for (int64_t j0 = 0; j0 < t.J; j0 += t.tile) {
      const int64_t j1 = std::min(t.J, j0 + t.tile);
      if (t.block_empty(i1, j0)) break;
      auto p = block_probs(q5, k5, mask, bias, args, t, i0, i1, j0, j1);
      l_b.add_(p.sum(-1));
      acc_b.add_(at::matmul(p, v5.slice(3, j0, j1)));
    }
  }
  ForwardResult r;
  if (args.exp_kind) {
    r.o = acc.view({t.B, t.H, t.I, t.D}).to(q.scalar_type());
  } else {
    auto inv_l = at::where(l > 0, l.reciprocal(), at::zeros_like(l));
    r.o = (acc * inv_l.unsqueeze(-1)).view({t.B, t.H, t.I, t.D}).to(q.scalar_type());
    r.l = l.view({t.B, t.H, t.I});
  }
  return r;
}

BackwardResult tiled_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& o, const at::Tensor& l, const at::Tensor& mask, const at::Tensor& bias,
                              const CoreArgs& args) {
  const Tiling t = make_tiling(q, k, args);
  const auto ct = compute_type(q);
  auto q5 = q.to(ct).view({t.B, t.Hkv, t.G, t.I, t.D});
  auto k5 = k.to(ct).unsqueeze(2);
  auto v5 = v.to(ct).unsqueeze(2);
  auto do5 = dout.to(ct).reshape({t.B, t.Hkv, t.G, t.I, t.D});
  at::Tensor inv_l, delta;  // (B, Hkv, G, I)
  if (!args.exp_kind) {
    auto l4 = l.to(ct).view({t.B, t.Hkv, t.G, t.I});
    inv_l = at::where(l4 > 0, l4.reciprocal(), at::zeros_like(l4));
    delta = (do5 * o.to(ct).reshape({t.B, t.Hkv, t.G, t.I, t.D})).sum(-1);
  }
  auto dq = at::zeros_like(q5);
  auto dk = at::zeros({t.B, t.Hkv, t.J, t.D}, q5.options());
  auto dv = at::zeros({t.B, t.Hkv, t.J, t.D}, q5.options());
  at::Tensor dbias;
  if (bias.defined()) dbias = at::zeros(bias.sizes(), q5.options());

  for (int64_t i0 = 0; i0 < t.I; i0 += t.tile) {
    const int64_t i1 = std::min(t.I, i0 + t.tile), ic = i1 - i0;
    auto qb = q5.slice(3, i0, i1);
    auto dob = do5.slice(3, i0, i1);
    auto dqb = dq.slice(3, i0, i1);
    for (int64_t j0 = 0; j0 < t.J; j0 += t.tile) {
      const int64_t j1 = std::min(t.J, j0 + t.tile), jc = j1 - j0;
      if (t.block_empty(i1, j0)) break;
      auto p = block_probs(q5, k5, mask, bias, args, t, i0, i1, j0, j1);  // (B, Hkv, G, ic, jc)
      auto vb = v5.slice(3, j0, j1);
      auto dp = at::matmul(dob, vb.transpose(-1, -2));
      at::Tensor ds;
      if (args.exp_kind) {
        ds = p * dp;
      } else {
        p.mul_(inv_l.slice(3, i0, i1).unsqueeze(-1));  // P / l
        ds = p * (dp - delta.slice(3, i0, i1).unsqueeze(-1));
      }
      // dv_j = sum_i (P/l)_ij do_i, summed over the G query heads of each k/v head.
      dv.slice(2, j0, j1).add_(at::matmul(p.transpose(-1, -2), dob).sum(2));
      dqb.add_(at::matmul(ds, k5.slice(3, j0, j1)), args.scale);
      dk.slice(2, j0, j1).add_(at::matmul(ds.transpose(-1, -2), qb).sum(2), args.scale);
      if (dbias.defined()) {
        auto db = args.bias_batch_dim ? ds.sum({1, 2}) : ds.sum(0).reshape({t.H, ic, jc});
        dbias.slice(1, i0, i1).slice(2, j0, j1).add_(db);
      }
    }
  }
  BackwardResult g;
  g.dq = dq.view({t.B, t.H, t.I, t.D}).to(q.scalar_type());
  g.dk = dk.to(k.scalar_type());
  g.dv = dv.to(v.scalar_type());
  if (dbias.defined()) g.dbias = dbias.to(bias.scalar_type());
  return g;
}

}  // namespace flashcos::detail
