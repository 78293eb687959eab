// The fused CUDA decode attention (model/decode/decode_attention.h), skipped without a CUDA device:
//  - one launch against a float64 reference of the same step (l2norm per group, rope at pos, the
//    ring write at pos mod L, softmax / exp attention over the filled slots) on fresh random
//    inputs, with the output and the unfilled slots poisoned (NaN): the output must be all new,
//    the new slot must hold k, v and every other slot must be untouched;
//  - the static decoder with the kernel (and the fused one-row linears, decode_linear.h, with the
//    embedding lookup and the position advance folded in) against the same decoder on torch ops,
//    step by step past max_seq_len so the ring wraps (float32 within 1e-5, bf16 within 1e-2 on the
//    logits), the position on the device one further per step.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include <flashcos/rotary.h>

#include "model/decode/decode_attention.h"
#include "model/decode_step.h"
#include "model/gpt.h"
#include "tests/attention_test_util.h"
#include "tests/model_test_util.h"

namespace {

using flashcos::model::DecodeAttentionScratch;
using flashcos::model::GPT;
using flashcos::model::KVCache;
using flashcos::model::ModelConfig;
using flashcos::model::StaticDecoder;
using flashcos::test::rel_err;
using flashcos::test::make_model;

struct KernelCase {
  std::string attention, pos;
  int64_t groups, heads, head_dim, max_len;
};

std::string name_of(const KernelCase& c) {
  return c.attention + " " + c.pos + " G" + std::to_string(c.groups) + " NH" + std::to_string(c.heads) + " HS" +
         std::to_string(c.head_dim) + " L" + std::to_string(c.max_len);
}

ModelConfig config_of(const KernelCase& c) {
  ModelConfig cfg;
  cfg.dim = 48, cfg.depth = 2, cfg.heads = c.heads, cfg.dim_head = c.head_dim, cfg.max_seq_len = c.max_len;
  cfg.pos = c.pos, cfg.attention = c.attention, cfg.l2norm_groups = c.groups, cfg.attention_impl = "plain";
  if (c.attention == "exp") cfg.attn_scale = 2.0;
  return cfg;
}

std::vector<KernelCase> kernel_cases() {
  std::vector<KernelCase> out;
  for (int64_t L : {1, 63, 1000}) {
    out.push_back({"cosine", "rope", 1, 8, 64, L});
    out.push_back({"cosine", "rope", 2, 1, 32, L});
    out.push_back({"cosine", "none", 2, 8, 32, L});
    out.push_back({"exp", "rope", 2, 8, 64, L});
    out.push_back({"exp", "none", 1, 1, 64, L});
  }
  return out;
}

bool have_kernel(const ModelConfig& cfg) {
  return torch::cuda::is_available() && flashcos::model::fused_decode_attention_available(cfg, torch::kCUDA);
}

// q, k (NH, HS) float64 -> l2-normalised per group and rotated at pos (the angle formed in float32
// as float(pos) * inv_freq[m], as every path forms it).
at::Tensor prepare_ref(const at::Tensor& x, const ModelConfig& cfg, int64_t pos) {
  const int64_t G = cfg.l2norm_groups, gs = cfg.dim_head / G;
  auto xg = x.view({cfg.heads, G, gs});
  auto y = xg / xg.norm(2, -1, true).clamp_min(1e-12);
  if (cfg.pos != "rope") return y.reshape({cfg.heads, cfg.dim_head});
  const auto inv = flashcos::rotary_inv_freq(gs, cfg.rope_base);
  std::vector<double> cs(inv.size()), sn(inv.size());
  for (size_t m = 0; m < inv.size(); ++m) {
    const float angle = static_cast<float>(pos) * inv[m];
    cs[m] = std::cos(static_cast<double>(angle)), sn[m] = std::sin(static_cast<double>(angle));
  }
  const auto c = torch::tensor(cs, torch::kDouble), s = torch::tensor(sn, torch::kDouble);
  auto yp = y.reshape({cfg.heads, G, gs / 2, 2});
  const auto a = yp.select(-1, 0), b = yp.select(-1, 1);
  return torch::stack({a * c - b * s, a * s + b * c}, -1).reshape({cfg.heads, cfg.dim_head});
}

class DecodeKernel : public ::testing::TestWithParam<KernelCase> {};

TEST_P(DecodeKernel, OneStepMatchesFloat64Reference) {
  const auto cfg = config_of(GetParam());
  if (!have_kernel(cfg)) GTEST_SKIP() << "needs a CUDA device, a CUDA build and FLASHCOS_DECODE_KERNEL not 0";
  const int64_t NH = cfg.heads, HS = cfg.dim_head, L = cfg.max_seq_len, inner = NH * HS;
  torch::manual_seed(17 + L + NH + HS);
  auto scratch = flashcos::model::make_decode_attention_scratch(cfg, torch::kCUDA);
  at::Tensor inv_freq;
  if (cfg.pos == "rope") {
    inv_freq = torch::tensor(flashcos::rotary_inv_freq(HS / cfg.l2norm_groups, cfg.rope_base)).to(torch::kCUDA);
  }
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t pos : {int64_t(0), L / 2, L - 1, L, 2 * L + 7, 3 * L + L / 3}) {
      const int64_t n = std::min(pos + 1, L), s = pos % L;
      // Filled slots random (keys on the unit sphere per group, as the ring holds them), the
      // unfilled ones NaN: the kernel must never read them.
      auto k = torch::randn({1, NH, L, cfg.l2norm_groups, HS / cfg.l2norm_groups}, torch::kDouble);
      k = (k / k.norm(2, -1, true)).view({1, NH, L, HS});
      auto v = torch::randn({1, NH, L, HS}, torch::kDouble);
      if (n < L) {
        k.narrow(2, n, L - n).fill_(NAN);
        v.narrow(2, n, L - n).fill_(NAN);
      }
      const auto qkv = torch::randn({1, 3 * inner}, torch::kDouble);
      auto k_dev = k.to(dtype).to(torch::kCUDA), v_dev = v.to(dtype).to(torch::kCUDA);
      const auto qkv_dev = qkv.to(dtype).to(torch::kCUDA);
      auto out = torch::full({1, inner}, NAN, torch::TensorOptions().dtype(dtype).device(torch::kCUDA));
      const auto pos_dev = torch::full({1}, pos, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
      const auto k_before = k_dev.cpu(), v_before = v_dev.cpu();
      flashcos::model::fused_decode_attention(cfg, qkv_dev, k_dev, v_dev, out, pos_dev, inv_freq, scratch);

      // Reference from the inputs as rounded to dtype.
      const auto x = qkv_dev.cpu().to(torch::kDouble).view({3, NH, HS});
      const auto q = prepare_ref(x[0].clone(), cfg, pos).to(dtype).to(torch::kDouble);  // q in the cache dtype
      const auto kn = prepare_ref(x[1].clone(), cfg, pos);
      auto kr = k_before.to(torch::kDouble).clone(), vr = v_before.to(torch::kDouble).clone();
      kr.select(2, s).copy_(kn.to(dtype).to(torch::kDouble).view({1, NH, HS}));
      vr.select(2, s).copy_(x[2].view({1, NH, HS}));
      const auto kf = kr.narrow(2, 0, n)[0], vf = vr.narrow(2, 0, n)[0];  // (NH, n, HS)
      const auto sim = torch::einsum("hd,hjd->hj", {q, kf}) * cfg.attn_scale;
      const auto p = cfg.attention == "cosine" ? sim.softmax(-1) : sim.exp();
      const auto o_ref = torch::einsum("hj,hjd->hd", {p, vf}).reshape({1, inner});

      const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
      const std::string where = name_of(GetParam()) + " " + std::string(c10::toString(dtype)) + " pos " +
                                std::to_string(pos);
      EXPECT_LT(rel_err(out.cpu(), o_ref), tol) << where;
      // The ring: slot s holds the new k, v; every other slot (NaN ones included) is untouched.
      const auto k_after = k_dev.cpu(), v_after = v_dev.cpu();
      EXPECT_LT(rel_err(k_after.select(2, s), kr.select(2, s)), dtype == at::kFloat ? 1e-6 : 1e-2) << where;
      EXPECT_TRUE(torch::equal(v_after.select(2, s), vr.select(2, s).to(dtype))) << where;
      for (int64_t j = 0; j < L; ++j) {
        if (j == s) continue;
        ASSERT_TRUE(torch::allclose(k_after.select(2, j), k_before.select(2, j), 0, 0, /*equal_nan=*/true)) << where;
        ASSERT_TRUE(torch::allclose(v_after.select(2, j), v_before.select(2, j), 0, 0, /*equal_nan=*/true)) << where;
      }
    }
  }
  // Every launch leaves the per-head counters at zero (the next launch, or graph replay, relies on it).
  EXPECT_EQ(scratch.counters.abs().sum().item<int64_t>(), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeKernel, ::testing::ValuesIn(kernel_cases()),
                         [](const ::testing::TestParamInfo<KernelCase>& i) {
                           std::string s = name_of(i.param);
                           for (char& ch : s) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return s;
                         });

class DecodeKernelStep : public ::testing::TestWithParam<KernelCase> {};

// The static decoder with the kernel against itself on torch ops, past max_seq_len.
TEST_P(DecodeKernelStep, SameLogitsAsTorchOps) {
  const auto cfg = config_of(GetParam());
  if (!have_kernel(cfg)) GTEST_SKIP() << "needs a CUDA device, a CUDA build and FLASHCOS_DECODE_KERNEL not 0";
  auto m = make_model(cfg, 23);
  m->to(torch::kCUDA);
  torch::NoGradGuard no_grad;
  const int64_t L = cfg.max_seq_len, steps = L + 40, prime = std::min<int64_t>(L, 3);
  const auto tokens = torch::randint(0, 256, {1, prime + steps}, torch::kLong);
  // float32: the kernel equals the torch ops to rounding. bf16: both round differently (the torch ops
  // cast the attention weights to bf16 before P v, the kernel keeps them in float32), so each is
  // measured against the float32 step, and over all steps the kernel's mean error may be at most
  // twice the torch ops' (one step's ratio is noisy: 2.3x at one step of 440 on the H100).
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    KVCache a, b, c;
    m->forward_cached(tokens.narrow(1, 0, prime).to(torch::kCUDA), a);
    m->forward_cached(tokens.narrow(1, 0, prime).to(torch::kCUDA), b);
    m->forward_cached(tokens.narrow(1, 0, prime).to(torch::kCUDA), c);
    StaticDecoder fused(m, a, dtype), ops(m, b, dtype), ref(m, c, at::kFloat);
    ASSERT_TRUE(fused.fused_attention());
    ASSERT_TRUE(fused.fused_linear());  // dim 48, every width a multiple of 8: the one-row linears too
    ops.set_fused_attention(false);
    ref.set_fused_attention(false);
    at::Tensor previous;
    double kernel_err = 0, ops_err = 0;
    for (int64_t t = 0; t < steps; ++t) {
      const int64_t tok = tokens[0][prime + t].item<int64_t>();
      if (previous.defined()) previous.fill_(NAN);  // poison the logits buffer: the step must rewrite it
      const auto y_dev = fused.step(tok);  // the decoder's logits buffer
      const auto y = y_dev.cpu();
      const auto x = ops.step(tok).cpu();
      const auto r = ref.step(tok).cpu();
      if (dtype == at::kFloat) {
        ASSERT_LT(rel_err(y, x), 1e-5) << name_of(GetParam()) << " float32 step " << t;
      } else {
        ASSERT_TRUE(std::isfinite(rel_err(y, r))) << name_of(GetParam()) << " bf16 step " << t;
        ASSERT_LT(rel_err(y, r), 0.1) << name_of(GetParam()) << " bf16 step " << t;
        kernel_err += rel_err(y, r) / steps;
        ops_err += rel_err(x, r) / steps;
      }
      // One position per step on the device (the fused step advances it inside its last launch).
      ASSERT_EQ(fused.device_position(), prime + t + 1) << name_of(GetParam()) << " step " << t;
      ASSERT_EQ(ops.device_position(), prime + t + 1) << name_of(GetParam()) << " step " << t;
      previous = y_dev;
    }
    if (dtype != at::kFloat) {
      EXPECT_LE(kernel_err, 2 * ops_err + 1e-3)
          << name_of(GetParam()) << ": mean error from the float32 step, kernel " << kernel_err << ", torch ops "
          << ops_err;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeKernelStep, ::testing::ValuesIn(kernel_cases()),
                         [](const ::testing::TestParamInfo<KernelCase>& i) {
                           std::string s = name_of(i.param);
                           for (char& ch : s) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return s;
                         });

// Without the kernel (CPU, or the switch) the decoder refuses to turn it on, with a reason.
TEST(DecodeKernelSwitch, RefusedWhereItDoesNotApply) {
  auto cfg = config_of({"cosine", "rope", 1, 2, 16, 8});
  auto m = make_model(cfg, 5);
  torch::NoGradGuard no_grad;
  KVCache cache;
  m->forward_cached(torch::zeros({1, 2}, torch::kLong), cache);
  StaticDecoder cpu(m, cache, at::kFloat);
  EXPECT_FALSE(cpu.fused_attention());
  EXPECT_THROW(cpu.set_fused_attention(true), std::invalid_argument);
  cpu.set_fused_attention(false);
  EXPECT_EQ(cpu.step(3).size(1), cfg.vocab);
}

}  // namespace
