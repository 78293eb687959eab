// Shared helpers of the packed-QKV suites (tests/test_qkv.cpp on the CPU, tests/test_qkv_cuda.cpp on
// CUDA): the (B, T, 3 H D) layout written from the API contract, one way of running the packed
// attention (run_qkv) and the per-part errors of o and the q / k / v thirds of the qkv gradient.
#pragma once

#include <flashcos/attention.h>
#include "tests/attention_test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace flashcos::test {

inline std::string bool_name(bool b, const char* yes, const char* no) { return b ? yes : no; }

// ---- packed layout helpers (written from the API contract, not from attention/cosine/qkv.cpp) ---

// Part `which` (0 q, 1 k, 2 v) of a (B, T, 3 H D) tensor as its (B, H, T, D) view.
inline at::Tensor qkv_part(const at::Tensor& qkv, int64_t heads, int64_t which) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (3 * heads);
  return qkv.view({B, T, 3, heads, D}).select(2, which).permute({0, 2, 1, 3});
}

// (B, H, T, D) -> (B, T, H D): the heads merged.
inline at::Tensor merge_heads(const at::Tensor& o) {
  return o.transpose(1, 2).reshape({o.size(0), o.size(2), o.size(1) * o.size(3)});
}

// (B, T, H D) -> (B, H, T, D).
inline at::Tensor split_heads(const at::Tensor& o, int64_t heads) {
  return o.reshape({o.size(0), o.size(1), heads, o.size(2) / heads}).permute({0, 2, 1, 3});
}

// Three (B, H, T, D) gradients packed as one (B, T, 3 H D) tensor.
inline at::Tensor pack(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  return at::stack({q, k, v}, 1).permute({0, 3, 1, 2, 4}).reshape({B, T, 3 * H * D});
}

// t rounded to `dtype` and back to float64, strides kept.
inline at::Tensor rounded_to(const at::Tensor& t, at::ScalarType dtype) {
  at::Tensor r = at::empty_strided(t.sizes(), t.strides(), t.options());
  r.copy_(t.to(dtype).to(at::kDouble));
  return r;
}

inline std::string grad_fn_name(const at::Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : std::string("<none>"); }

enum class Via { kQkv, kViewsApi, kViewsPlain };

struct RunResult {
  at::Tensor o, dqkv;  // (B, T, H D), (B, T, 3 H D)
  std::string fn;      // o's grad_fn
};

// One way of computing the packed attention, in `dtype`, from a leaf copy of qkv64 (float64 values,
// strides kept) and the backward of `dout` (undefined: of o.sum(), an expanded upstream gradient).
// offset > 0: qkv sits `offset` elements into each row of a wider leaf (pointer and row stride then
// not 16-byte aligned for 16-bit dtypes); its gradient is the matching slice of the leaf's.
// A bias in opts is converted to `dtype`.
inline RunResult run_qkv(Via via, const at::Tensor& qkv64, int64_t heads, AttentionOptions opts, const at::Tensor& dout,
            at::ScalarType dtype, int64_t offset = 0) {
  at::Tensor leaf_t, qkv;
  if (offset == 0) {
    leaf_t = leaf(qkv64, dtype);
    qkv = leaf_t;
  } else {
    auto sizes = qkv64.sizes().vec();
    sizes.back() += offset;
    at::Tensor base = at::zeros(sizes, qkv64.options().dtype(dtype));
    base.narrow(-1, offset, qkv64.size(-1)).copy_(qkv64);
    leaf_t = base.requires_grad_(true);
    qkv = leaf_t.narrow(-1, offset, qkv64.size(-1));
  }
  if (opts.attn_bias().defined()) opts.attn_bias(opts.attn_bias().to(dtype));
  at::Tensor o;
  if (via == Via::kQkv) {
    o = flashcos::cosine_sim_attention_qkv(qkv, heads, opts);
  } else {
    const at::Tensor q = qkv_part(qkv, heads, 0), k = qkv_part(qkv, heads, 1), v = qkv_part(qkv, heads, 2);
    o = merge_heads(via == Via::kViewsApi ? flashcos::cosine_sim_attention(q, k, v, opts)
                                          : flashcos::plain_cosine_sim_attention(q, k, v, opts));
  }
  RunResult r;
  r.fn = grad_fn_name(o);
  const int64_t D = qkv64.size(2) / (3 * heads);
  EXPECT_EQ(o.scalar_type(), dtype);
  const std::vector<int64_t> o_sizes = {qkv64.size(0), qkv64.size(1), heads * D};
  EXPECT_EQ(o.sizes(), at::IntArrayRef(o_sizes));
  if (dout.defined()) {
    o.backward(dout.to(dtype));
  } else {
    o.sum().backward();
  }
  r.o = o.detach();
  const at::Tensor g = leaf_t.grad();
  r.dqkv = (offset == 0 || !g.defined()) ? g : g.narrow(-1, offset, qkv64.size(-1));
  return r;
}

// Relative error of a gradient whose true value can vanish (one visible key: dq = dk = 0 exactly,
// so |ref| is rounding noise): the denominator is floored (as tests/test_attention_cuda.cpp).
inline double grad_err(const at::Tensor& a, const at::Tensor& ref, double floor) {
  const double num = (a.detach().to(at::kDouble) - ref.detach().to(at::kDouble)).norm().item<double>();
  if (!std::isfinite(num)) return INFINITY;
  const double den = std::max(ref.detach().to(at::kDouble).norm().item<double>(), floor);
  return den == 0 ? (num == 0 ? 0.0 : INFINITY) : num / den;
}

struct PartErr {
  double o = 0, dq = 0, dk = 0, dv = 0;
};

// o and the q / k / v thirds of the qkv gradient, each against the reference's.
inline PartErr errors_vs(const RunResult& run, const RunResult& ref, int64_t heads, double scale) {
  PartErr e;
  e.o = rel_err(run.o, ref.o);
  if (!run.dqkv.defined()) {
    e.dq = e.dk = e.dv = INFINITY;
    return e;
  }
  const at::Tensor g = run.dqkv.contiguous(), rg = ref.dqkv.contiguous();
  const double floor = 1e-3 * scale * qkv_part(rg, heads, 2).to(at::kDouble).norm().item<double>();
  e.dq = grad_err(qkv_part(g, heads, 0), qkv_part(rg, heads, 0), floor);
  e.dk = grad_err(qkv_part(g, heads, 1), qkv_part(rg, heads, 1), floor);
  e.dv = rel_err(qkv_part(g, heads, 2), qkv_part(rg, heads, 2));
  return e;
}

// With one key (T = 1) dq and dk vanish exactly and both runs hold rounding noise only; grad_err
// measures it against its floor 1e-3 scale |dv|. Accept noise up to 16 eps scale |dv|: a wrong
// gradient is O(scale |dv| / sqrt(D)), orders of magnitude above.
inline double vanishing_grad_tol(at::ScalarType dtype) { return 16e3 * dtype_eps(dtype); }

inline std::ostream& operator<<(std::ostream& os, const PartErr& e) {
  return os << "o " << e.o << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv;
}

}  // namespace flashcos::test
