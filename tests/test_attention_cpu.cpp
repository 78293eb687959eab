// CPU tests of flashcos attention semantics (run in CI).
//
// Every case compares the plain reference (flashcos::plain_cosine_sim_attention) and the tiled
// memory-efficient path (cosine_sim_attention with Backend::kTiled, small tiles so several full
// and partial tiles are exercised) against a float64 loop implementation written from the math
// of DESIGN.md (tests/attention_test_util.h): forward output and the gradients of q, k, v and
// attn_bias obtained through libtorch autograd on the public API.
//
// Tolerances (relative Frobenius error vs the float64 loops, on the dtype-rounded inputs):
//   f64: 1e-10.  f32: 1e-5.  bf16 / f16: the tiled path may be at most 2x the error of the plain
//   path run in the same dtype plus one dtype epsilon, capped at 8 eps; the plain path itself must
//   stay within 8 eps (a sanity bound: semantic bugs give O(1) errors). f16 runs the plain path
//   only as the tiled test's baseline. Set FLASHCOS_TEST_VERBOSE=1 to print every error.
// Rows with nothing to attend (fully masked, or causal rows before the first key when I > J)
// must give exactly zero output and zero dq, and nothing may be NaN / inf.
#include <flashcos/attention.h>
#include "tests/attention_test_util.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace {

using flashcos::AttentionKind;
using flashcos::AttentionOptions;
using flashcos::Backend;
using namespace flashcos::test;


// clang-format off
std::vector<Case> all_cases() {
  return {
    C("basic",                 2, 3, 3, 17, 17, 16),
    C("cross_63x127",          2, 2, 2, 63, 127, 32),
    C("causal_square",         2, 2, 2, 33, 33, 16).causal(),
    C("causal_i_lt_j",         1, 2, 2, 20, 45, 16).causal(),
    C("causal_i_gt_j",         1, 2, 2, 45, 20, 16).causal(),   // first 25 rows see nothing
    C("mask",                  3, 2, 2, 40, 37, 16).mask(),     // batch 2 fully masked
    C("mask_causal",           2, 2, 2, 37, 37, 16).mask().causal(),
    C("bias_head",             2, 3, 3, 19, 23, 16).bias_head(),
    C("bias_batch",            3, 2, 2, 19, 23, 16).bias_batch(),
    C("bias_head_mask_causal", 2, 2, 2, 30, 30, 16).bias_head().mask().causal(),
    C("bias_batch_mask_causal_i_gt_j", 2, 3, 3, 35, 18, 16).bias_batch().mask().causal(),
    C("multi_query",           2, 4, 1, 21, 29, 16).mq(),
    C("multi_query_all",       2, 4, 1, 29, 21, 16).mq().causal().mask().bias_head(),
    C("grouped",               2, 6, 2, 18, 27, 16).mask().bias_batch(),
    C("grouped_causal_i_gt_j", 1, 4, 2, 40, 25, 16).causal().bias_head(),
    C("grouped_4_per_kv",      1, 8, 2, 17, 19, 16).causal().mask(),
    C("merged",                6, 1, 1, 25, 31, 16).merged(),
    C("merged_all",            4, 1, 1, 30, 30, 16).merged().causal().mask().bias_batch(),
    C("groups2",               2, 2, 2, 20, 20, 32).groups(2),
    C("groups4_causal_bias",   1, 2, 2, 24, 24, 64).groups(4).causal().bias_head(),
    C("groups2_grouped_mask",  2, 4, 2, 19, 26, 32).groups(2).mask().bias_batch(),
    C("no_l2norm",             2, 2, 2, 25, 25, 16).no_l2norm().scale(2.0),
    C("no_l2norm_causal_mask_bias", 2, 2, 2, 26, 22, 16).no_l2norm().scale(3.0).causal().mask().bias_head(),
    C("exp",                   2, 2, 2, 25, 31, 16).exp_kind().scale(1.0),
    C("exp_causal_mask_bias",  2, 2, 2, 31, 31, 16).exp_kind().scale(1.5).causal().mask().bias_head(),
    C("exp_multi_query",       2, 3, 1, 17, 40, 16).exp_kind().scale(0.7).mq().causal(),
    C("scale_1",               2, 2, 2, 21, 21, 16).scale(1.0).mask(),
    C("scale_25",              2, 2, 2, 21, 21, 16).scale(25.0).causal(),
    C("scale_3_7",             1, 2, 2, 21, 33, 16).scale(3.7).bias_head(),
    C("len_1",                 2, 2, 2, 1, 1, 16),
    C("len_1_causal_mask",     2, 2, 2, 1, 1, 16).causal().mask(),
    C("i1_j63_causal",         2, 2, 2, 1, 63, 16).causal().mask().bias_head(),
    C("i63_j1_causal",         2, 2, 2, 63, 1, 16).causal().bias_batch(),
    C("len_127_tile_16",       1, 2, 2, 127, 127, 16).causal().mask().bias_head(),
    C("len_127_tile_1",        1, 1, 1, 13, 11, 16).causal().mask().tile(1),
    C("len_1000_causal_mask",  1, 2, 2, 1000, 1000, 32).causal().mask().bias_head().tile(128),
    C("head_dim_80",           1, 2, 2, 23, 29, 80).causal(),
    C("head_dim_128",          1, 2, 2, 19, 21, 128).mask(),
    C("head_dim_8_odd_24",     2, 2, 2, 17, 15, 24).groups(3),
    C("noncontig",             2, 3, 3, 31, 31, 16).noncontig().mask().causal().bias_head(),
    C("noncontig_mq",          2, 3, 1, 31, 22, 16).mq().noncontig().bias_batch(),
    C("noncontig_merged",      3, 1, 1, 24, 24, 16).merged().noncontig().causal(),
  };
}
// clang-format on

enum class Impl { kPlainFn, kTiled };

struct Param {
  Case c;
  Impl impl;
  at::ScalarType dtype;
};

std::string impl_name(Impl i) { return i == Impl::kPlainFn ? "plain" : "tiled"; }

// gtest prints this instead of a byte dump.
void PrintTo(const Param& p, std::ostream* os) {
  *os << p.c.name << " " << impl_name(p.impl) << " " << dtype_name(p.dtype);
}

// The problem's tensors in float64, in the public API's shapes.
struct Inputs {
  at::Tensor q, k, v, mask, bias, dout;
};

// A tensor of `shape` whose last dim is contiguous but which is a transposed view when asked.
at::Tensor randn_maybe_noncontig(at::IntArrayRef shape, bool noncontig) {
  if (!noncontig) return at::randn(shape, at::kDouble);
  // (..., A, L, D) is made as (..., L, A, D) and transposed back.
  std::vector<int64_t> t(shape.begin(), shape.end());
  const size_t n = t.size();
  std::swap(t[n - 3], t[n - 2]);
  return at::randn(t, at::kDouble).transpose(static_cast<int64_t>(n) - 3, static_cast<int64_t>(n) - 2);
}

Inputs make_inputs(const Case& c) {
  Inputs in;
  const bool unit = c.l2norm;  // l2norm inputs: any scale; otherwise keep |q.k| ~ 1
  const double qk_scale = unit ? 1.0 : 1.0 / std::sqrt(static_cast<double>(c.D));
  std::vector<int64_t> qs = c.merged ? std::vector<int64_t>{c.B, c.I, c.D}
                                     : std::vector<int64_t>{c.B, c.H, c.I, c.D};
  std::vector<int64_t> ks = (c.merged || c.multi_query) ? std::vector<int64_t>{c.B, c.J, c.D}
                                                        : std::vector<int64_t>{c.B, c.Hkv, c.J, c.D};
  in.q = randn_maybe_noncontig(qs, c.noncontig) * qk_scale;
  in.k = randn_maybe_noncontig(ks, c.noncontig) * qk_scale;
  in.v = randn_maybe_noncontig(ks, c.noncontig);
  in.dout = at::randn(qs, at::kDouble);
  if (c.mask == MaskMode::kRandom) {
    in.mask = at::rand({c.B, c.J}, at::kDouble) < 0.75;
    // A masked prefix in batch 0 (with causal: its first rows see nothing), and the last batch
    // fully masked when there are several.
    in.mask.index_put_({0, at::indexing::Slice(0, std::min<int64_t>(3, c.J))}, false);
    if (c.B >= 2) in.mask.index_put_({c.B - 1}, false);
  }
  if (c.bias == BiasMode::kHead) in.bias = at::randn({c.H, c.I, c.J}, at::kDouble) * 0.5;
  if (c.bias == BiasMode::kBatch) in.bias = at::randn({c.B, c.I, c.J}, at::kDouble) * 0.5;
  return in;
}

AttentionOptions make_options(const Case& c, Backend backend) {
  auto o = AttentionOptions()
               .causal(c.causal)
               .scale(c.scale)
               .groups(c.groups)
               .l2norm_qk(c.l2norm)
               .kind(c.exp_kind ? AttentionKind::kExp : AttentionKind::kCosine)
               .backend(backend)
               .tile_size(c.tile);
  return o;
}

RefProblem make_problem(const Case& c, const Inputs& in) {
  RefProblem p;
  p.q = canonical(in.q);
  p.k = canonical(in.k);
  p.v = canonical(in.v);
  p.mask = in.mask;
  p.bias = in.bias;
  p.bias_batch_dim = c.bias == BiasMode::kBatch;
  p.causal = c.causal;
  p.exp_kind = c.exp_kind;
  p.l2norm = c.l2norm;
  p.groups = c.groups;
  p.scale = c.scale;
  return p;
}

ApiRun run_api(const Case& c, const Inputs& in, Impl impl, at::ScalarType dtype) {
  at::Tensor q = leaf(in.q, dtype), k = leaf(in.k, dtype), v = leaf(in.v, dtype);
  at::Tensor bias;
  if (in.bias.defined()) bias = leaf(in.bias, dtype);
  AttentionOptions opts = make_options(c, impl == Impl::kTiled ? Backend::kTiled : Backend::kPlain);
  if (in.mask.defined()) opts.mask(in.mask);
  if (bias.defined()) opts.attn_bias(bias).attn_bias_batch_dim(c.bias == BiasMode::kBatch);
  at::Tensor o = impl == Impl::kTiled ? flashcos::cosine_sim_attention(q, k, v, opts)
                                      : flashcos::plain_cosine_sim_attention(q, k, v, opts);
  EXPECT_EQ(o.scalar_type(), dtype);
  EXPECT_EQ(o.sizes(), in.q.sizes());
  o.backward(in.dout.to(dtype));
  ApiRun r;
  r.o = o.detach();
  r.dq = q.grad();
  r.dk = k.grad();
  r.dv = v.grad();
  if (bias.defined()) r.dbias = bias.grad();
  return r;
}

// The inputs as the dtype sees them (rounded), back in float64: the reference's inputs.
Inputs rounded(const Inputs& in, at::ScalarType dtype) {
  auto rt = [&](const at::Tensor& t) {
    return t.defined() ? t.to(dtype).to(at::kDouble) : t;
  };
  Inputs r = in;
  r.q = rt(in.q);
  r.k = rt(in.k);
  r.v = rt(in.v);
  r.bias = rt(in.bias);
  r.dout = rt(in.dout);
  return r;
}

struct Errors {
  double o = 0, dq = 0, dk = 0, dv = 0, dbias = 0;
};

Errors errors_vs(const Case& c, const ApiRun& run, const RefResult& ref) {
  Errors e;
  e.o = rel_err(canonical(run.o), ref.o);
  e.dq = rel_err(canonical(run.dq), ref.dq);
  e.dk = rel_err(canonical(run.dk), ref.dk);
  e.dv = rel_err(canonical(run.dv), ref.dv);
  if (ref.dbias.defined()) e.dbias = rel_err(run.dbias, ref.dbias);
  // One key per row (J == 1, cosine kind): softmax over a single key does not depend on q, k or
  // the bias, so dq, dk, dbias vanish mathematically and only rounding noise is left; measure
  // those as RMS relative to the scale of the problem instead of relative to a zero reference.
  if (c.J == 1 && !c.exp_kind) {
    auto rms = [&](const at::Tensor& t) {
      return t.defined() ? t.to(at::kDouble).pow(2).mean().sqrt().item<double>() / c.scale : 0.0;
    };
    e.dq = rms(run.dq);
    e.dk = rms(run.dk);
    e.dbias = rms(run.dbias);
  }
  return e;
}

std::string str(const Errors& e) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "o %.2e dq %.2e dk %.2e dv %.2e dbias %.2e", e.o, e.dq, e.dk, e.dv, e.dbias);
  return buf;
}

class AttentionVsLoops : public ::testing::TestWithParam<Param>, OneThread {};

TEST_P(AttentionVsLoops, ForwardAndGradients) {
  const Param& prm = GetParam();
  const Case& c = prm.c;
  at::manual_seed(name_seed(c.name));  // same inputs for every impl / dtype of a case
  const Inputs in64 = make_inputs(c);
  const Inputs in = rounded(in64, prm.dtype);
  const RefResult ref = reference_attention(make_problem(c, in), canonical(in.dout));

  const ApiRun run = run_api(c, in, prm.impl, prm.dtype);
  ASSERT_TRUE(run.dq.defined() && run.dk.defined() && run.dv.defined()) << "no gradient reached q/k/v";
  if (in.bias.defined()) {
    ASSERT_TRUE(run.dbias.defined()) << "no gradient reached attn_bias";
  }
  EXPECT_EQ(run.dq.sizes(), in.q.sizes());
  EXPECT_EQ(run.dk.sizes(), in.k.sizes());
  EXPECT_EQ(run.dv.sizes(), in.v.sizes());
  const Errors err = errors_vs(c, run, ref);

  // Tolerances.
  Errors tol;
  const double eps = dtype_eps(prm.dtype);
  const double sanity = 8 * eps;  // low precision: semantic bugs give O(1) errors, rounding ~eps
  if (prm.dtype == at::kDouble) {
    tol = {1e-10, 1e-10, 1e-10, 1e-10, 1e-10};
  } else if (prm.dtype == at::kFloat) {
    tol = {1e-5, 1e-5, 1e-5, 1e-5, 1e-5};
  } else if (prm.impl == Impl::kPlainFn) {
    tol = {sanity, sanity, sanity, sanity, sanity};
  } else {
    // At most 2x the error of the plain path in the same dtype plus a floor of one eps, and never
    // past the sanity bound. The plain baseline itself must pass the sanity bound too.
    const Errors be = errors_vs(c, run_api(c, in, Impl::kPlainFn, prm.dtype), ref);
    double worst = 0;
    for (double e : {be.o, be.dq, be.dk, be.dv, be.dbias}) worst = std::isnan(e) ? INFINITY : std::max(worst, e);
    EXPECT_LE(worst, sanity) << "the plain baseline in " << dtype_name(prm.dtype) << " is off: " << str(be);
    auto t = [&](double base_err) { return std::min(2 * base_err + eps, sanity); };
    tol = {t(be.o), t(be.dq), t(be.dk), t(be.dv), t(be.dbias)};
  }
  EXPECT_LE(err.o, tol.o) << "out";
  EXPECT_LE(err.dq, tol.dq) << "dq";
  EXPECT_LE(err.dk, tol.dk) << "dk";
  EXPECT_LE(err.dv, tol.dv) << "dv";
  if (in.bias.defined()) {
    EXPECT_LE(err.dbias, tol.dbias) << "dbias";
  }

  // Rows with nothing to attend: exactly zero output and dq; never NaN / inf anywhere.
  const at::Tensor empty_rows = ref.row_valid.logical_not();
  const int64_t n_empty = empty_rows.sum().item<int64_t>();
  if (n_empty > 0) {
    const at::Tensor o_empty = canonical(run.o).to(at::kDouble).index({empty_rows});
    const at::Tensor dq_empty = canonical(run.dq).to(at::kDouble).index({empty_rows});
    EXPECT_EQ(o_empty.abs().max().item<double>(), 0.0) << n_empty << " empty rows: output not 0";
    EXPECT_EQ(dq_empty.abs().max().item<double>(), 0.0) << n_empty << " empty rows: dq not 0";
  }
  for (const at::Tensor* t : {&run.o, &run.dq, &run.dk, &run.dv, &run.dbias})
    if (t->defined()) {
      EXPECT_TRUE(at::isfinite(*t).all().item<bool>()) << "NaN / inf in a result";
    }

  if (std::getenv("FLASHCOS_TEST_VERBOSE") != nullptr)
    std::printf("  err %s\n  tol %s\n", str(err).c_str(), str(tol).c_str());
  if (::testing::Test::HasFailure())
    ADD_FAILURE() << "errors: " << str(err) << " (empty rows " << n_empty << ")";
}

std::vector<Param> all_params() {
  std::vector<Param> ps;
  for (const Case& c : all_cases())
    for (Impl impl : {Impl::kPlainFn, Impl::kTiled})
      for (at::ScalarType dt : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
        // f16 runs the plain path as the tiled test's baseline (with its sanity bound) only.
        if (dt == at::kHalf && impl == Impl::kPlainFn) continue;
        ps.push_back({c, impl, dt});
      }
  return ps;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return info.param.c.name + "_" + impl_name(info.param.impl) + "_" + dtype_name(info.param.dtype);
}

INSTANTIATE_TEST_SUITE_P(Cpu, AttentionVsLoops, ::testing::ValuesIn(all_params()), param_name);

// ---- the entry point's defaults ------------------------------------------------------------

class AttentionCpu : public ::testing::Test, OneThread {};

// Backend::kAuto on CPU tensors (the tiled path with its default tile) and Backend::kPlain through
// the entry point agree with the loops too; default options are cosine, scale 10, l2norm on.
TEST_F(AttentionCpu, AutoAndPlainBackendThroughEntryPoint) {
  at::manual_seed(11);
  Case c = C("auto", 2, 2, 2, 40, 600, 16).causal().mask().bias_head();
  const Inputs in = make_inputs(c);
  const RefResult ref = reference_attention(make_problem(c, in));
  for (Backend be : {Backend::kAuto, Backend::kPlain}) {
    auto opts = AttentionOptions().causal(true).mask(in.mask).attn_bias(in.bias).backend(be);
    const at::Tensor o = flashcos::cosine_sim_attention(in.q, in.k, in.v, opts);
    EXPECT_LE(rel_err(o, ref.o), 1e-10) << flashcos::to_string(be);
  }
  // All defaults (cosine, scale 10, l2norm, auto backend) on a merged (1, I, D) problem.
  Case c2 = C("defaults", 1, 1, 1, 40, 600, 16).merged();
  Inputs in2;
  in2.q = in.q.select(0, 0).select(0, 0).unsqueeze(0);
  in2.k = in.k.select(0, 0).select(0, 0).unsqueeze(0);
  in2.v = in.v.select(0, 0).select(0, 0).unsqueeze(0);
  const at::Tensor o = flashcos::cosine_sim_attention(in2.q, in2.k, in2.v);
  EXPECT_LE(rel_err(o, reference_attention(make_problem(c2, in2)).o), 1e-10) << "default options";
}

// Same inputs twice give bit-identical results.
TEST_F(AttentionCpu, Deterministic) {
  at::manual_seed(12);
  Case c = C("det", 2, 2, 2, 40, 50, 16).causal().mask().tile(16);
  const Inputs in = make_inputs(c);
  for (Impl impl : {Impl::kPlainFn, Impl::kTiled}) {
    const ApiRun a = run_api(c, in, impl, at::kFloat), b = run_api(c, in, impl, at::kFloat);
    EXPECT_TRUE(at::equal(a.o, b.o)) << impl_name(impl);
    EXPECT_TRUE(at::equal(a.dq, b.dq)) << impl_name(impl);
    EXPECT_TRUE(at::equal(a.dk, b.dk)) << impl_name(impl);
  }
}

// flashcos::l2norm: every group chunk of the last dim has unit norm and the same direction.
TEST_F(AttentionCpu, L2normGroups) {
  at::manual_seed(13);
  for (int64_t groups : {1, 2, 4}) {
    const at::Tensor x = at::randn({3, 5, 32}, at::kDouble);
    const at::Tensor y = flashcos::l2norm(x, groups);
    ASSERT_EQ(y.sizes(), x.sizes());
    const at::Tensor xg = x.reshape({3, 5, groups, 32 / groups});
    const at::Tensor expected = (xg / xg.norm(2, -1, true)).reshape({3, 5, 32});
    EXPECT_LE(rel_err(y, expected), 1e-14) << "groups " << groups;
  }
}

// flashcos::rms_l2norm (the CUDA fp16 / bf16 l2norm): values and gradients equal the l2norm
// Function's in float64, for group sizes where 1 / sqrt(gs) is exact (64, 16) and where it is not
// (32, 8), on a non-contiguous input.
TEST_F(AttentionCpu, RmsL2normMatchesL2norm) {
  at::manual_seed(14);
  for (int64_t groups : {1, 2, 4, 8}) {
    const at::Tensor base = at::randn({2, 7, 3, 64}, at::kDouble);
    const at::Tensor x1 = base.transpose(1, 2).detach().requires_grad_(true);  // (2, 3, 7, 64) strided
    const at::Tensor x2 = base.transpose(1, 2).detach().requires_grad_(true);
    const at::Tensor y1 = flashcos::rms_l2norm(x1, groups);
    const at::Tensor y2 = flashcos::l2norm(x2, groups);
    ASSERT_EQ(y1.sizes(), x1.sizes());
    EXPECT_LE(rel_err(y1, y2), 1e-13) << "groups " << groups;
    const at::Tensor dy = at::randn(y1.sizes(), at::kDouble);
    (y1 * dy).sum().backward();
    (y2 * dy).sum().backward();
    EXPECT_LE(rel_err(x1.grad(), x2.grad()), 1e-12) << "groups " << groups;
  }
}

// ---- finite differences ----------------------------------------------------------------------

// Central differences of sum(out * dout) in float64 against autograd through the public API:
// this checks the whole chain (l2norm in groups, mask, causal, bias) independently of the loops.
class AttentionFiniteDiff : public ::testing::TestWithParam<Backend>, OneThread {};

TEST_P(AttentionFiniteDiff, GradientsMatchCentralDifferences) {
  const Backend be = GetParam();
  at::manual_seed(21);
  // Grouped k/v (4 heads on 2), I > J causal (a row with nothing), mask, per-head bias, groups 2.
  const int64_t B = 2, H = 4, Hkv = 2, I = 6, J = 5, D = 4;
  at::Tensor q = at::randn({B, H, I, D}, at::kDouble);
  at::Tensor k = at::randn({B, Hkv, J, D}, at::kDouble);
  at::Tensor v = at::randn({B, Hkv, J, D}, at::kDouble);
  at::Tensor bias = at::randn({H, I, J}, at::kDouble) * 0.5;
  at::Tensor mask = at::ones({B, J}, at::kBool);
  mask.index_put_({0, 1}, false);
  mask.index_put_({1, 0}, false);
  mask.index_put_({1, 3}, false);
  const at::Tensor dout = at::randn({B, H, I, D}, at::kDouble);
  auto opts = [&](const at::Tensor& b) {
    return AttentionOptions().causal(true).scale(4.0).groups(2).mask(mask).attn_bias(b).backend(be).tile_size(2);
  };
  auto loss = [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_, const at::Tensor& b_) {
    return (flashcos::cosine_sim_attention(q_, k_, v_, opts(b_)) * dout).sum();
  };

  std::vector<at::Tensor> xs = {q, k, v, bias};
  std::vector<at::Tensor> leaves;
  for (auto& x : xs) leaves.push_back(x.clone().requires_grad_(true));
  loss(leaves[0], leaves[1], leaves[2], leaves[3]).backward();

  const char* names[] = {"q", "k", "v", "attn_bias"};
  const double h = 1e-6;
  for (size_t a = 0; a < xs.size(); ++a) {
    const at::Tensor analytic = leaves[a].grad();
    ASSERT_TRUE(analytic.defined()) << names[a];
    at::Tensor numeric = at::zeros_like(xs[a]);
    at::Tensor flat = xs[a].view({-1});
    at::Tensor nflat = numeric.view({-1});
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double x0 = flat[e].item<double>();
      flat[e] = x0 + h;
      const double lp = loss(xs[0], xs[1], xs[2], xs[3]).item<double>();
      flat[e] = x0 - h;
      const double lm = loss(xs[0], xs[1], xs[2], xs[3]).item<double>();
      flat[e] = x0;
      nflat[e] = (lp - lm) / (2 * h);
    }
    const double scale = std::max(1.0, analytic.abs().max().item<double>());
    const double max_diff = (analytic - numeric).abs().max().item<double>();
    EXPECT_LE(max_diff, 1e-6 * scale) << names[a] << " (" << flashcos::to_string(be) << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, AttentionFiniteDiff, ::testing::Values(Backend::kTiled, Backend::kPlain),
                         [](const ::testing::TestParamInfo<Backend>& i) {
                           return i.param == Backend::kTiled ? std::string("tiled") : std::string("plain");
                         });

// ---- validation --------------------------------------------------------------------------------


struct Qkv {
  at::Tensor q, k, v;
};

Qkv qkv(int64_t B = 2, int64_t H = 4, int64_t Hkv = 4, int64_t I = 8, int64_t J = 9, int64_t D = 16) {
  return {at::randn({B, H, I, D}), at::randn({B, Hkv, J, D}), at::randn({B, Hkv, J, D})};
}

// Both entry points validate the same way.
void expect_both(const Qkv& t, const AttentionOptions& o, const std::vector<std::string>& needles) {
  SCOPED_TRACE(needles.front());
  expect_error([&] { flashcos::cosine_sim_attention(t.q, t.k, t.v, AttentionOptions(o).backend(Backend::kTiled)); }, needles);
  expect_error([&] { flashcos::plain_cosine_sim_attention(t.q, t.k, t.v, o); }, needles);
}

TEST(AttentionValidation, WrongRank) {
  at::manual_seed(31);
  Qkv t = qkv();
  expect_both({t.q.flatten(0, 2), t.k, t.v}, {}, {"q"});              // 2-D q
  expect_both({t.q.unsqueeze(0), t.k, t.v}, {}, {"q"});               // 5-D q
  expect_both({t.q, t.k.flatten(0, 2), t.v}, {}, {"k"});              // 2-D k
  expect_both({t.q.flatten(0, 1), t.k, t.v}, {}, {"k"});              // merged q, 4-D k
}

TEST(AttentionValidation, ShapeMismatch) {
  at::manual_seed(32);
  Qkv t = qkv();
  expect_both({t.q, at::randn({2, 4, 9, 8}), at::randn({2, 4, 9, 8})}, {}, {"k"});  // head dim
  expect_both({t.q, t.k, at::randn({2, 4, 10, 16})}, {}, {"v"});                     // J of v
  expect_both({t.q, at::randn({3, 4, 9, 16}), at::randn({3, 4, 9, 16})}, {}, {"k"}); // batch
  expect_both({t.q, t.k, t.v.flatten(0, 1)}, {}, {"v"});                             // v rank
}

TEST(AttentionValidation, DtypeMix) {
  at::manual_seed(33);
  Qkv t = qkv();
  expect_both({t.q, t.k.to(at::kDouble), t.v}, {}, {"dtype"});
  expect_both({t.q, t.k, t.v.to(at::kBFloat16)}, {}, {"dtype"});
  expect_both({t.q.to(at::kLong), t.k.to(at::kLong), t.v.to(at::kLong)}, {}, {"floating point"});
}

TEST(AttentionValidation, GroupedHeads) {
  at::manual_seed(34);
  expect_both(qkv(2, 4, 3), {}, {"head"});  // 4 % 3 != 0
}

TEST(AttentionValidation, GroupsMustDivideHeadDim) {
  at::manual_seed(35);
  expect_both(qkv(), AttentionOptions().groups(3), {"groups"});
  expect_both(qkv(), AttentionOptions().groups(0), {"groups"});
}

TEST(AttentionValidation, Mask) {
  at::manual_seed(36);
  Qkv t = qkv();
  expect_both(t, AttentionOptions().mask(at::ones({2, 8}, at::kBool)), {"mask"});     // J
  expect_both(t, AttentionOptions().mask(at::ones({3, 9}, at::kBool)), {"mask"});     // B
  expect_both(t, AttentionOptions().mask(at::ones({2, 1, 9}, at::kBool)), {"mask"});  // rank
  expect_both(t, AttentionOptions().mask(at::ones({2, 9}, at::kFloat)), {"mask"});    // dtype
}

TEST(AttentionValidation, AttnBias) {
  at::manual_seed(37);
  Qkv t = qkv();
  expect_both(t, AttentionOptions().attn_bias(at::randn({4, 8, 8})), {"attn_bias"});  // J
  expect_both(t, AttentionOptions().attn_bias(at::randn({3, 8, 9})), {"attn_bias"});  // H
  expect_both(t, AttentionOptions().attn_bias(at::randn({4, 8, 9})).attn_bias_batch_dim(true),
              {"attn_bias"});  // B = 2, not 4
  expect_both(t, AttentionOptions().attn_bias(at::randn({8, 9})), {"attn_bias"});  // rank
  expect_both(t, AttentionOptions().attn_bias(at::ones({4, 8, 9}, at::kLong)), {"attn_bias"});  // dtype
}

TEST(AttentionValidation, FusedBackendOnCpu) {
  at::manual_seed(38);
  // CPU tensors with the fused backend: a clear error naming the backend, not a crash.
  Qkv u = qkv(1, 2, 2, 8, 8, 64);
  expect_error([&] { flashcos::cosine_sim_attention(u.q, u.k, u.v, AttentionOptions().backend(Backend::kFused)); },
               {"fused"});
}

TEST(AttentionValidation, FusedBackendHeadDim) {
  // The device check comes first, so the head-dim check is only reachable with CUDA tensors.
  if (!at::hasCUDA() || !flashcos::fused_kernels_compiled()) GTEST_SKIP() << "needs CUDA and the fused kernels";
  at::manual_seed(39);
  // Head dim 48 is not one of the fused kernels' (16, 32, 64, 80, 96, 128).
  Qkv t = qkv(1, 2, 2, 8, 8, 48);
  t = {t.q.cuda(), t.k.cuda(), t.v.cuda()};
  expect_error([&] { flashcos::cosine_sim_attention(t.q, t.k, t.v, AttentionOptions().backend(Backend::kFused)); },
               {"head dim"});
}

}  // namespace
