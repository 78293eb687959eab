// CUDA tests of the fused cosine-sim attention kernels (skipped without a GPU).
//
// Each case runs the public API with Backend::kFused on the GPU and compares out, dq, dk, dv and
// dbias with a float64 reference: flashcos::plain_cosine_sim_attention run in float64 on the
// same (dtype-rounded) inputs, through autograd (the CPU suite pins that reference to explicit
// float64 loops). Tolerances, relative Frobenius error:
//   f64: 1e-10.  f32: 1e-5.  f16 / bf16: 2x the error of the plain implementation run in the same
//   dtype on the same inputs (+ a floor of eps / 4 for errors that round to nothing); with one key
//   per row, where the plain ops are exact, the rounding bound of the Hopper forward's normaliser.
// FLASHCOS_POISON=1 is set, so every output is NaN before the kernels write it; rows with nothing
// to attend must give exactly 0 output and 0 dq; nothing may be NaN / inf.
// Which family ran is checked per direction: on a compute capability 9.0 device every 16-bit
// forward and backward runs on the Hopper kernels (bias, its gradient and the online max included;
// the biased backward not with FLASHCOS_HOPPER_BWD_BIAS=0).
// The grid covers every axis (mask / causal / none x bias none / head / batch, lengths 1 .. 2049
// with I == J and I != J, every head dim, every dtype, multi-head / multi-query / grouped /
// merged, l2norm on / off, groups, the exp kind, non-contiguous inputs) with a chosen subset of
// the product, so the suite runs in about a minute.
#include <flashcos/attention.h>
#include "tests/attention_test_util.h"
#include "tests/fused_attention_gpu.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace {

using flashcos::AttentionKind;
using flashcos::AttentionOptions;
using flashcos::Backend;
using namespace flashcos::test;

// clang-format off
std::vector<Case> all_cases() {
  return {
    C("d16_basic",                   2, 3, 3, 128, 128, 16),
    C("d16_2049_causal_mask",        1, 2, 2, 2049, 2049, 16).causal().mask(),
    C("d32_cross_63x127",            2, 2, 2, 63, 127, 32),
    C("d32_2049x1000_mask_bias_head",1, 2, 2, 2049, 1000, 32).mask().bias_head(),
    C("d64_len1",                    2, 2, 2, 1, 1, 64),
    C("d64_len1_causal_mask",        2, 2, 2, 1, 1, 64).causal().mask(),
    C("d64_causal_1000",             1, 2, 2, 1000, 1000, 64).causal(),
    C("d64_causal_i_gt_j",           1, 2, 2, 127, 63, 64).causal(),  // 64 rows see nothing
    C("d64_causal_2049",             1, 2, 2, 2049, 2049, 64).causal(),
    C("d64_bias_batch_128x63",       3, 2, 2, 128, 63, 64).bias_batch(),
    C("d64_mask_bias_head_causal",   2, 2, 2, 127, 127, 64).mask().bias_head().causal(),
    C("d64_multi_query_causal",      2, 4, 1, 127, 1000, 64).mq().causal(),
    C("d64_merged_causal_bias",      6, 1, 1, 127, 127, 64).merged().causal().bias_batch(),
    C("d64_no_l2norm_all",           2, 2, 2, 127, 127, 64).no_l2norm().scale(2.0).causal().mask().bias_head(),
    C("d64_scale_25_causal",         1, 2, 2, 128, 128, 64).scale(25.0).causal(),
    // scale 40: exp(scale (cos - 1)) spans 115 binades, past bf16's fixed-offset range too, so both
    // 16-bit dtypes run the forward's online-max variant (fwd_kernel.cuh).
    C("d64_scale_40_mask",           1, 2, 2, 127, 127, 64).scale(40.0).mask(),
    C("d64_noncontig_all",           2, 3, 3, 127, 127, 64).noncontig().causal().mask().bias_head(),
    C("d64_noncontig_mq",            2, 3, 1, 63, 128, 64).mq().noncontig().bias_batch(),
    C("d64_exp",                     2, 2, 2, 127, 128, 64).exp_kind().scale(1.0),
    C("d80_grouped_mask_bias_batch", 2, 6, 2, 128, 127, 80).mask().bias_batch(),
    C("d80_causal_i_lt_j_mask",      1, 2, 2, 63, 1000, 80).causal().mask(),
    C("d96_mask",                    3, 2, 2, 127, 128, 96).mask(),  // batch 2 fully masked
    C("d96_grouped_causal",          1, 4, 2, 1000, 1000, 96).causal().bias_head(),
    C("d128_mask_bias_head_causal",  2, 2, 2, 1000, 1000, 128).mask().bias_head().causal(),
    C("d128_len1_j2049_causal_bias", 1, 2, 2, 1, 2049, 128).causal().bias_head(),
    C("d128_groups2_causal",         1, 2, 2, 127, 127, 128).groups(2).causal(),
    C("d128_exp_causal_mask_bias",   2, 2, 2, 1000, 1000, 128).exp_kind().scale(1.5).causal().mask().bias_head(),
    C("d32_exp_mq",                  2, 3, 1, 63, 2049, 32).exp_kind().scale(0.7).mq().causal(),
    // No mask, no bias, d 64 / 128: the Hopper family on an H100 (attention/cosine/cuda/launch.cu); the
    // suite runs a second time with FLASHCOS_HOPPER=0 for the sm_80 kernels (scripts/gpu_check.sh).
    C("d64_grouped_1000x2049",       1, 4, 2, 1000, 2049, 64),
    C("d64_causal_i_gt_j_1000x127",  1, 2, 2, 1000, 127, 64).causal(),  // 873 rows see nothing
    C("d128_causal_2049",            1, 2, 2, 2049, 2049, 128).causal(),
    C("d128_cross_257x1000",         2, 2, 2, 257, 1000, 128),
    C("d128_causal_i_lt_j_63x1000",  1, 2, 2, 63, 1000, 128).causal(),
    C("d128_causal_i_gt_j_1000x300", 1, 2, 2, 1000, 300, 128).causal(),  // 700 rows see nothing; 80-row steps off the grid
    C("d128_len1",                   2, 2, 2, 1, 1, 128),
    C("d128_mq_exp_causal",          2, 4, 1, 300, 700, 128).mq().exp_kind().scale(1.2).causal(),
    // Head dims below the Hopper tiles' 64 / 128 (zero-padded there), no mask, no bias.
    C("d16_causal_1000",             1, 2, 2, 1000, 1000, 16).causal(),
    C("d32_grouped_127x2049",        2, 4, 2, 127, 2049, 32),
    C("d80_causal_2049",             1, 2, 2, 2049, 2049, 80).causal(),
    C("d96_cross_257x1000",          2, 2, 2, 257, 1000, 96),
    C("d96_mq_causal_1000",          1, 4, 1, 1000, 1000, 96).mq().causal(),
    // Key masks on the Hopper family: rows with every key masked, I != J, grouped heads.
    C("d64_mask_causal_2049",        2, 2, 2, 2049, 2049, 64).causal().mask(),
    C("d64_mask_grouped_127x1000",   3, 4, 2, 127, 1000, 64).mask(),
    C("d128_mask_causal_1000x2049",  2, 2, 2, 1000, 2049, 128).causal().mask(),
    C("d128_mask_exp_300x700",       2, 2, 2, 300, 700, 128).mask().exp_kind().scale(1.3),
    // The Hopper forward with a bias (fp16: always the online max) and with the online max (scale 40),
    // over several key blocks (the running max grows from block to block): I != J, causal, key masks
    // with rows that see no key, even J (float2 bias loads) and odd J (scalar loads), every tile.
    C("d64_mask_bias_head_causal_63x1000",   2, 2, 2, 63, 1000, 64).causal().mask().bias_head(),
    C("d128_mask_bias_batch_causal_63x1000", 2, 2, 2, 63, 1000, 128).causal().mask().bias_batch(),
    C("d96_mask_bias_head_causal_1000x127",  2, 2, 2, 1000, 127, 96).causal().mask().bias_head(),  // 873 rows see nothing
    C("d64_len1_j3_bias_head",               2, 2, 2, 1, 3, 64).bias_head(),  // one key would make dbias exactly 0
    C("d64_scale_40_1000",                   1, 2, 2, 1000, 1000, 64).scale(40.0),
    C("d128_scale_40_causal_1000",           1, 2, 2, 1000, 1000, 128).scale(40.0).causal(),
    C("d96_scale_40_bias_batch_127x1000",    2, 2, 2, 127, 1000, 96).scale(40.0).bias_batch(),
    C("d32_scale_40_mask_bias_head_1000x63", 2, 2, 2, 1000, 63, 32).scale(40.0).mask().bias_head(),
  };
}
// clang-format on

struct Param {
  Case c;
  at::ScalarType dtype;
};

struct Inputs {
  at::Tensor q, k, v, mask, bias, dout;  // float64, CUDA
};

at::Tensor randn_maybe_noncontig(at::IntArrayRef shape, bool noncontig) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  if (!noncontig) return at::randn(shape, opts);
  std::vector<int64_t> t(shape.begin(), shape.end());
  const size_t n = t.size();
  std::swap(t[n - 3], t[n - 2]);
  return at::randn(t, opts).transpose(int64_t(n) - 3, int64_t(n) - 2);
}

Inputs make_inputs(const Case& c) {
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  Inputs in;
  const double qk_scale = c.l2norm ? 1.0 : 1.0 / std::sqrt(double(c.D));  // keeps |q.k| ~ 1
  const std::vector<int64_t> qs = c.merged ? std::vector<int64_t>{c.B, c.I, c.D}
                                           : std::vector<int64_t>{c.B, c.H, c.I, c.D};
  const std::vector<int64_t> ks = (c.merged || c.multi_query) ? std::vector<int64_t>{c.B, c.J, c.D}
                                                              : std::vector<int64_t>{c.B, c.Hkv, c.J, c.D};
  in.q = randn_maybe_noncontig(qs, c.noncontig) * qk_scale;
  in.k = randn_maybe_noncontig(ks, c.noncontig) * qk_scale;
  in.v = randn_maybe_noncontig(ks, c.noncontig);
  in.dout = at::randn(qs, opts);
  if (c.mask == MaskMode::kRandom) {
    in.mask = at::rand({c.B, c.J}, opts) < 0.75;
    in.mask.index_put_({0, at::indexing::Slice(0, std::min<int64_t>(3, c.J))}, false);
    if (c.B >= 2) in.mask.index_put_({c.B - 1}, false);  // a fully masked batch
  }
  if (c.bias == BiasMode::kHead) in.bias = at::randn({c.H, c.I, c.J}, opts) * 0.5;
  if (c.bias == BiasMode::kBatch) in.bias = at::randn({c.B, c.I, c.J}, opts) * 0.5;
  return in;
}

// The inputs as the dtype sees them, back in float64 (strides kept).
Inputs rounded(const Inputs& in, at::ScalarType dtype) {
  auto rt = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    at::Tensor r = at::empty_strided(t.sizes(), t.strides(), t.options());
    r.copy_(t.to(dtype).to(at::kDouble));
    return r;
  };
  Inputs r = in;
  r.q = rt(in.q), r.k = rt(in.k), r.v = rt(in.v), r.bias = rt(in.bias), r.dout = rt(in.dout);
  return r;
}

using Outputs = ApiRun;

Outputs run_api(const Case& c, const Inputs& in, bool fused, at::ScalarType dtype) {
  at::Tensor q = leaf(in.q, dtype), k = leaf(in.k, dtype), v = leaf(in.v, dtype);
  at::Tensor bias;
  if (in.bias.defined()) bias = leaf(in.bias, dtype);
  auto opts = AttentionOptions()
                  .causal(c.causal)
                  .scale(c.scale)
                  .groups(c.groups)
                  .l2norm_qk(c.l2norm)
                  .kind(c.exp_kind ? AttentionKind::kExp : AttentionKind::kCosine)
                  .backend(fused ? Backend::kFused : Backend::kPlain);
  if (in.mask.defined()) opts.mask(in.mask);
  if (bias.defined()) opts.attn_bias(bias).attn_bias_batch_dim(c.bias == BiasMode::kBatch);
  at::Tensor o = fused ? flashcos::cosine_sim_attention(q, k, v, opts)
                       : flashcos::plain_cosine_sim_attention(q, k, v, opts);
  EXPECT_EQ(o.scalar_type(), dtype);
  EXPECT_EQ(o.sizes(), in.q.sizes());
  o.backward(in.dout.to(dtype));
  Outputs r{o.detach(), q.grad(), k.grad(), v.grad(), {}};
  if (bias.defined()) r.dbias = bias.grad();
  return r;
}

struct Errors {
  double o = 0, dq = 0, dk = 0, dv = 0, dbias = 0;
};

// Relative error of a gradient whose true value can vanish: with a single visible key, P / l = 1
// and dq = dk = 0 exactly, so |ref| is rounding noise. The denominator is floored at
// 1e-3 scale |ref dv|, far below the size dq, dk have in a non-degenerate problem.
double grad_err(const at::Tensor& a, const at::Tensor& ref, double floor) {
  const double num = (a.detach().to(at::kDouble) - ref.detach().to(at::kDouble)).norm().item<double>();
  if (!std::isfinite(num)) return INFINITY;
  const double den = std::max(ref.detach().to(at::kDouble).norm().item<double>(), floor);
  return den == 0 ? (num == 0 ? 0.0 : INFINITY) : num / den;
}

Errors errors_vs(const Outputs& run, const Outputs& ref, double scale) {
  Errors e;
  const double floor = 1e-3 * scale * ref.dv.detach().to(at::kDouble).norm().item<double>();
  e.o = rel_err(run.o, ref.o);
  e.dq = grad_err(run.dq, ref.dq, floor);
  e.dk = grad_err(run.dk, ref.dk, floor);
  e.dv = rel_err(run.dv, ref.dv);
  if (ref.dbias.defined()) e.dbias = rel_err(run.dbias, ref.dbias);
  return e;
}

// (B, H, I) bool: the row has at least one key to attend (canonical shapes).
at::Tensor row_has_keys(const Case& c, const Inputs& in) {
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const at::Tensor i = at::arange(c.I, opts.dtype(at::kLong)).view({c.I, 1});
  const at::Tensor j = at::arange(c.J, opts.dtype(at::kLong)).view({1, c.J});
  at::Tensor allowed = at::ones({1, c.I, c.J}, opts.dtype(at::kBool));  // (B, I, J)
  if (c.causal) allowed = allowed & (j <= i + (c.J - c.I)).unsqueeze(0);
  if (in.mask.defined()) allowed = allowed & in.mask.view({c.B, 1, c.J});
  const int64_t heads = c.merged ? 1 : c.H;
  return allowed.any(-1).view({-1, 1, c.I}).expand({allowed.size(0) == 1 ? c.B : allowed.size(0), heads, c.I});
}

class FusedAttention : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!have_fused_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
    setenv("FLASHCOS_POISON", "1", 1);
  }
};

TEST_P(FusedAttention, MatchesFloat64Reference) {
  const Param& prm = GetParam();
  const Case& c = prm.c;
  at::manual_seed(int64_t(name_seed(c.name)));
  const Inputs in = rounded(make_inputs(c), prm.dtype);
  const Outputs ref = run_api(c, in, /*fused=*/false, at::kDouble);
  const int64_t fwd_before = flashcos::hopper_forward_kernel_launches();
  const int64_t bwd_before = flashcos::hopper_backward_kernel_launches();
  const Outputs run = run_api(c, in, /*fused=*/true, prm.dtype);
  const int64_t fwd_runs = flashcos::hopper_forward_kernel_launches() - fwd_before;
  const int64_t bwd_runs = flashcos::hopper_backward_kernel_launches() - bwd_before;
  ASSERT_TRUE(run.dq.defined() && run.dk.defined() && run.dv.defined()) << "no gradient reached q/k/v";
  // Which family ran: on a compute capability 9.0 device (unless FLASHCOS_HOPPER=0) the Hopper
  // kernels take every 16-bit forward, any head dim (16 / 32 on the d 64 tiles, 80 / 96 on the d 128
  // ones), key mask, bias and online max (scale 40, fp16 with a bias) included, and every 16-bit
  // backward, a bias with its gradient included unless FLASHCOS_HOPPER_BWD_BIAS=0 (then the sm_80
  // backward runs on the Hopper forward's l); nothing else reaches them.
  const bool hopper = (prm.dtype == at::kBFloat16 || prm.dtype == at::kHalf) && hopper_family_expected();
  if (hopper) {
    EXPECT_GE(fwd_runs, 1) << "the Hopper forward did not run";
  } else {
    EXPECT_EQ(fwd_runs, 0) << "the Hopper forward ran where it does not apply";
  }
  const char* bwd_bias_env = std::getenv("FLASHCOS_HOPPER_BWD_BIAS");
  const bool bwd_bias_on = bwd_bias_env == nullptr || bwd_bias_env[0] != '0';
  if (hopper && (c.bias == BiasMode::kNone || bwd_bias_on)) {
    EXPECT_GE(bwd_runs, 1) << "the Hopper backward did not run";
  } else {
    EXPECT_EQ(bwd_runs, 0) << "the Hopper backward ran where it does not apply";
  }
  if (in.bias.defined()) {
    ASSERT_TRUE(run.dbias.defined()) << "no gradient reached attn_bias";
  }
  const Errors err = errors_vs(run, ref, c.scale);

  Errors tol;
  if (prm.dtype == at::kDouble) {
    tol = {1e-10, 1e-10, 1e-10, 1e-10, 1e-10};
  } else if (prm.dtype == at::kFloat) {
    tol = {1e-5, 1e-5, 1e-5, 1e-5, 1e-5};
  } else {
    const Errors be = errors_vs(run_api(c, in, /*fused=*/false, prm.dtype), ref, c.scale);
    const double floor = dtype_eps(prm.dtype) / 4;
    tol = {2 * be.o + floor, 2 * be.dq + floor, 2 * be.dk + floor, 2 * be.dv + floor, 2 * be.dbias + floor};
    if (c.J == 1) {
      // One key per row: the plain ops give o = v and dq = dk = 0 exactly. The Hopper forward divides
      // P V by the fp32 sum of the unrounded P (hopper/fwd_hopper_ws.cuh), so o = v (1 + d), d one
      // rounding of p, then o's own rounding: |o - v| <= eps |v| per element. The backward's
      // dS = dO . (v - o) is then that rounding, and dq, dk are its noise: up to 512 eps of grad_err's
      // floor (1e-3 scale |dv|) is accepted. Measured on an H100 (docs/correctness.md, runs I3 and
      // J3): 27 eps (bf16) and 7 eps (fp16) here, at most 157 eps over the QKV suite's T = 1
      // cases; a wrong gradient, O(scale |dO| |v| / sqrt(D)), is O(1e3 |v| / sqrt(D)) of the floor.
      const double eps = dtype_eps(prm.dtype);
      tol.o = std::max(tol.o, eps);
      tol.dq = std::max(tol.dq, 512 * eps);
      tol.dk = std::max(tol.dk, 512 * eps);
    }
    std::printf("[ errors   ] %-34s %-4s fused o %.2e dq %.2e dk %.2e dv %.2e db %.2e | plain o %.2e dq %.2e dk %.2e dv %.2e db %.2e\n",
                c.name.c_str(), dtype_name(prm.dtype).c_str(), err.o, err.dq, err.dk, err.dv, err.dbias, be.o,
                be.dq, be.dk, be.dv, be.dbias);
  }
  EXPECT_LE(err.o, tol.o) << "out";
  EXPECT_LE(err.dq, tol.dq) << "dq";
  EXPECT_LE(err.dk, tol.dk) << "dk";
  EXPECT_LE(err.dv, tol.dv) << "dv";
  if (in.bias.defined()) {
    EXPECT_LE(err.dbias, tol.dbias) << "dbias";
  }

  const at::Tensor empty = row_has_keys(c, in).logical_not();
  const int64_t n_empty = empty.sum().item<int64_t>();
  if (n_empty > 0) {
    const at::Tensor o_empty = canonical(run.o).to(at::kDouble).index({empty});
    const at::Tensor dq_empty = canonical(run.dq).to(at::kDouble).index({empty});
    EXPECT_EQ(o_empty.abs().max().item<double>(), 0.0) << n_empty << " empty rows: output not 0";
    EXPECT_EQ(dq_empty.abs().max().item<double>(), 0.0) << n_empty << " empty rows: dq not 0";
  }
  for (const at::Tensor* t : {&run.o, &run.dq, &run.dk, &run.dv, &run.dbias})
    if (t->defined()) {
      EXPECT_TRUE(at::isfinite(*t).all().item<bool>()) << "NaN / inf in a result";
    }
  if (::testing::Test::HasFailure())
    ADD_FAILURE() << "errors: o " << err.o << " dq " << err.dq << " dk " << err.dk << " dv " << err.dv
                  << " dbias " << err.dbias << " (empty rows " << n_empty << ")";
}

std::vector<Param> all_params() {
  std::vector<Param> ps;
  for (const Case& c : all_cases()) {
    for (at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat}) ps.push_back({c, dt});
    if (c.I * c.J <= 128 * 128) ps.push_back({c, at::kDouble});
  }
  return ps;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return info.param.c.name + "_" + dtype_name(info.param.dtype);
}

INSTANTIATE_TEST_SUITE_P(Cuda, FusedAttention, ::testing::ValuesIn(all_params()), param_name);

// The backward on its persistent grid (bwd_hopper.cuh): under a causal mask its plain instance runs
// one CTA an SM once there are more items than SMs (here 33 key blocks x 8 (b, kv head)s = 264, with
// GQA 132 x 2 query heads), each CTA taking its next key block from a counter as it comes free, its
// barriers' phases and dS buffers counting on over its blocks. Against float64 as the grid (2x the
// plain ops' error + eps / 4), with a key mask, bf16 and fp16, d 64 and 128. fp16 at d 128 has a CTA
// an item by default (hopper::bwd_persistent_by_default), so its cases here run that grid. (The
// grid's small cases, with and without a causal mask and split-tail pieces, run on 3 CTAs in
// scripts/gpu_check.sh bwdkinds: FLASHCOS_HOPPER_BWD_PERSISTENT=3.)
TEST_F(FusedAttentionMisc, BackwardPersistentGridMatchesFloat64) {
  const std::vector<Case> cases = {C("d64_persistent_causal", 2, 4, 4, 4200, 4200, 64).causal(),
                                   C("d128_persistent_causal", 2, 4, 4, 4200, 4200, 128).causal(),
                                   C("d128_persistent_gqa_mask_causal", 2, 4, 2, 4200, 4200, 128).causal().mask()};
  for (const Case& c : cases) {
    for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
      at::manual_seed(int64_t(name_seed(c.name)));
      const Inputs in = rounded(make_inputs(c), dt);
      const Outputs ref = run_api(c, in, /*fused=*/false, at::kDouble);
      const Outputs run = run_api(c, in, /*fused=*/true, dt);
      const Errors e = errors_vs(run, ref, c.scale);
      const Errors be = errors_vs(run_api(c, in, /*fused=*/false, dt), ref, c.scale);
      const double floor = dtype_eps(dt) / 4;
      std::printf("[ errors   ] %-32s %-4s fused dq %.2e dk %.2e dv %.2e | plain dq %.2e dk %.2e dv %.2e\n",
                  c.name.c_str(), dtype_name(dt).c_str(), e.dq, e.dk, e.dv, be.dq, be.dk, be.dv);
      EXPECT_LE(e.dq, 2 * be.dq + floor) << c.name << " " << dtype_name(dt) << " dq";
      EXPECT_LE(e.dk, 2 * be.dk + floor) << c.name << " " << dtype_name(dt) << " dk";
      EXPECT_LE(e.dv, 2 * be.dv + floor) << c.name << " " << dtype_name(dt) << " dv";
    }
  }
}

// fp16 backward where dP - D_i passes fp16's 65504 while dS = P (dP - D_i) does not: the last 6
// rows of dO scaled by 6000 (|dP| up to ~6000 sqrt(D) 4), the rest as usual; the last rows, so that
// a causal row sees ~300 keys and P stays ~1/300 (row 1 sees 2 keys: P ~ 1/2, dS itself past 65504).
// The Hopper kernels form fp16's dS from (dP - D_i) 2^-6 rounded to fp16 (range 4.2e6) or in fp32
// (hopper/bwd_ds.cuh): dP - D_i rounded to fp16 unshifted would make dS, dq, dk inf / NaN here. The
// backward is linear in dO, so the errors against float64 must stay those of the same inputs with unscaled dO (2x + eps / 4), at d 64 and
// 128, with and without a causal mask, and with a key mask (P = 0 next to a large dP - D_i).
TEST_F(FusedAttentionMisc, Fp16BackwardLargeDpMinusD) {
  const std::vector<Case> cases = {C("d64_large_do", 1, 2, 2, 300, 300, 64), C("d128_large_do", 1, 2, 2, 300, 300, 128),
                                   C("d128_large_do_causal", 1, 2, 2, 300, 300, 128).causal(),
                                   C("d128_large_do_mask", 1, 2, 2, 300, 300, 128).mask()};
  for (const Case& c : cases) {
    at::manual_seed(int64_t(name_seed(c.name)));
    const Inputs base = rounded(make_inputs(c), at::kHalf);
    Inputs large = base;
    large.dout = base.dout.clone();
    large.dout.narrow(2, c.I - 6, 6).mul_(6000.0);  // the last 6 rows of every head
    large = rounded(large, at::kHalf);
    const Outputs ref_base = run_api(c, base, /*fused=*/false, at::kDouble);
    const Outputs ref_large = run_api(c, large, /*fused=*/false, at::kDouble);
    // dP - D_i (D_i = dO_i . O_i) of the large rows, every key: some must pass fp16's range.
    const at::Tensor do_rows = large.dout.narrow(2, c.I - 6, 6);
    const at::Tensor d_i = (do_rows * ref_large.o.narrow(2, c.I - 6, 6)).sum(-1, true);
    const double x_max = (at::matmul(do_rows, large.v.transpose(-1, -2)) - d_i).abs().max().item<double>();
    ASSERT_GT(x_max, 65504.0) << c.name << ": dP - D_i stays inside fp16's range";
    const Errors e_base = errors_vs(run_api(c, base, /*fused=*/true, at::kHalf), ref_base, c.scale);
    const Outputs run = run_api(c, large, /*fused=*/true, at::kHalf);
    for (const at::Tensor* t : {&run.dq, &run.dk, &run.dv})
      EXPECT_TRUE(at::isfinite(*t).all().item<bool>()) << c.name << ": NaN / inf in a gradient";
    const Errors e = errors_vs(run, ref_large, c.scale);
    const double floor = dtype_eps(at::kHalf) / 4;
    std::printf("[ errors   ] %-22s fp16 dO x 6000 (max |dP - D_i| %.3g): dq %.2e dk %.2e dv %.2e | unscaled dq %.2e dk %.2e dv %.2e\n",
                c.name.c_str(), x_max, e.dq, e.dk, e.dv, e_base.dq, e_base.dk, e_base.dv);
    EXPECT_LE(e.dq, 2 * e_base.dq + floor) << c.name << " dq";
    EXPECT_LE(e.dk, 2 * e_base.dk + floor) << c.name << " dk";
    EXPECT_LE(e.dv, 2 * e_base.dv + floor) << c.name << " dv";
  }
}

// fp16's exp kind where the backward's P passes 2^10: P = exp(scale q.k) with unit rows and k = q, so
// every row's own key has q.k = 1 and P = e^7.5 (1,808). The plain instances carry the 16-bit P as
// P 2^6 for their paired dS product (hopper/bwd_ds.cuh), which would overflow fp16 there (115,700 >
// 65504) and make dv inf: the launcher sends the exp kind to the fp32 product. dO is scaled by 0.05 so
// that dS = P dP and the gradients stay well inside fp16 too. Against float64: finite, and each
// relative error under 1e-2 (the fused fp16 kernels' errors in the grid are ~5e-4), at d 64 and 128,
// causal and not.
TEST_F(FusedAttentionMisc, Fp16ExpKindBackwardLargeP) {
  const std::vector<Case> cases = {C("d64_exp_large_p", 1, 2, 2, 200, 200, 64).exp_kind().scale(7.5),
                                   C("d128_exp_large_p_causal", 1, 2, 2, 200, 200, 128).exp_kind().scale(7.5).causal()};
  for (const Case& c : cases) {
    at::manual_seed(int64_t(name_seed(c.name)));
    Inputs in = make_inputs(c);
    in.q = in.q / in.q.norm(2, -1, true);
    in.k = in.q.clone();
    in.dout = in.dout * 0.05;
    in = rounded(in, at::kHalf);
    const double qk_max = at::matmul(in.q, in.k.transpose(-1, -2)).max().item<double>();
    ASSERT_GT(std::exp(c.scale * qk_max) * 64, 65504.0) << c.name << ": P 2^6 stays inside fp16's range";
    const Outputs ref = run_api(c, in, /*fused=*/false, at::kDouble);
    const Outputs run = run_api(c, in, /*fused=*/true, at::kHalf);
    for (const at::Tensor* t : {&run.o, &run.dq, &run.dk, &run.dv})
      EXPECT_TRUE(at::isfinite(*t).all().item<bool>()) << c.name << ": NaN / inf in a result";
    const Errors e = errors_vs(run, ref, c.scale);
    std::printf("[ errors   ] %-24s fp16 exp kind (max P %.4g): o %.2e dq %.2e dk %.2e dv %.2e\n", c.name.c_str(),
                std::exp(c.scale * qk_max), e.o, e.dq, e.dk, e.dv);
    EXPECT_LE(e.o, 1e-2) << c.name << " o";
    EXPECT_LE(e.dq, 1e-2) << c.name << " dq";
    EXPECT_LE(e.dk, 1e-2) << c.name << " dk";
    EXPECT_LE(e.dv, 1e-2) << c.name << " dv";
  }
}

}  // namespace
