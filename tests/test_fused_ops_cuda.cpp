// The fused trainer operators (model/fused/) on the GPU (skips without CUDA): the CUDA kernels'
// forward and every gradient against a float64 reference, bounded by twice the error of the
// composite libtorch ops run in the same dtype plus a floor (flash-attention's criterion).
// FLASHCOS_POISON=1 is set, so every output starts as NaN and a row or column a kernel leaves
// unwritten fails. Odd sizes: rows 1, 63, 127, 1000 (5000, 20001: several rows a warp); add +
// LayerNorm (with and without the residual branch's bias) widths 8, 24, 512, 520, 1024 (kernel)
// and 63, 1032 (the op path on CUDA); bias + GELU widths 8, 24, 520, 2048 (kernel), 63, 1001.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "model/fused/add_layer_norm.h"
#include "model/fused/bias_gelu.h"
#include "model/fused/classifier_cross_entropy.h"
#include "model/fused/switch.h"
#include "model/autocast.h"
#include "model/gpt.h"
#include "tests/fused_ops_test_util.h"

namespace {

namespace fused = flashcos::model::fused;
namespace ft = flashcos::test;

const char* dtype_name(at::ScalarType t) {
  return t == at::kHalf ? "f16" : t == at::kBFloat16 ? "bf16" : t == at::kFloat ? "f32" : "f64";
}

// One rounding of a value of magnitude 1 in t.
double unit_eps(at::ScalarType t) {
  return t == at::kBFloat16 ? 7.8125e-3 : t == at::kHalf ? 9.765625e-4 : 1.1920929e-7;
}

struct LnCase {
  at::ScalarType act;       // dtype of r and the normed output (the GEMMs' dtype)
  at::ScalarType residual;  // dtype of x (the residual stream)
  int64_t rows, width;
  bool add;
  at::ScalarType bias = at::ScalarType::Undefined;  // r_bias's dtype (with add), Undefined: none
};

std::string ln_name(const ::testing::TestParamInfo<LnCase>& info) {
  const auto& c = info.param;
  return std::string(dtype_name(c.act)) + "_x" + dtype_name(c.residual) + "_rows" + std::to_string(c.rows) +
         "_width" + std::to_string(c.width) + (c.add ? "_add" : "_plain") +
         (c.bias != at::ScalarType::Undefined ? std::string("_bias") + dtype_name(c.bias) : "");
}

class AddLayerNormCuda : public ft::PoisonedGpuTest<LnCase> {};

TEST_P(AddLayerNormCuda, ForwardAndGradsVsFp64) {
  const LnCase c = GetParam();
  const bool has_bias = c.bias != at::ScalarType::Undefined;
  at::manual_seed(c.rows * 131 + c.width * 3 + c.add + int(c.act) + 11 * has_bias);
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kDouble);
  const double eps = 1e-5;
  at::Tensor x = (at::randn({c.rows, c.width}, opt) * 2 + 0.5).to(c.residual);
  at::Tensor r = c.add ? at::randn({c.rows, c.width}, opt).to(c.act) : at::Tensor();
  at::Tensor r_bias = has_bias ? (0.5 * at::randn({c.width}, opt)).to(c.bias) : at::Tensor();
  at::Tensor gamma = (1 + 0.3 * at::randn({c.width}, opt)).to(at::kFloat);
  at::Tensor beta = (0.1 * at::randn({c.width}, opt)).to(at::kFloat);
  auto s_dtype = c.add ? at::result_type(x, r) : c.residual;
  if (has_bias) s_dtype = at::promote_types(s_dtype, c.bias);
  at::Tensor dy = at::randn({c.rows, c.width}, opt).to(c.act);
  at::Tensor ds = at::randn({c.rows, c.width}, opt).to(s_dtype);

  auto run = [&](bool ours, at::ScalarType in_dtype, at::ScalarType out_dtype) {
    auto in = ft::leaves({x, r, gamma, beta, r_bias}, in_dtype);
    std::pair<at::Tensor, at::Tensor> sy;
    if (ours) {
      auto o = fused::add_layer_norm(in[0], in[1], in[4], in[2], in[3], eps, out_dtype);
      sy = {o.sum, o.normed};
    } else {
      sy = ft::composite_add_layer_norm(in[0], in[1], in[2], in[3], eps, out_dtype, in[4]);
    }
    std::vector<at::Tensor> outs{sy.second}, up{dy.to(out_dtype)};
    if (c.add) outs.push_back(sy.first), up.push_back(ds.to(sy.first.scalar_type()));
    torch::autograd::backward(outs, up);
    in.push_back(sy.first);
    in.push_back(sy.second);
    return in;  // x, r, gamma, beta, r_bias (with grads), sum, normed
  };
  auto got = run(true, at::ScalarType::Undefined, c.act);
  auto ref = run(false, at::kDouble, at::kDouble);
  auto comp = run(false, at::ScalarType::Undefined, c.act);
  ASSERT_EQ(got[6].scalar_type(), c.act);
  EXPECT_EQ(fused::add_layer_norm_uses_kernel(x, r, gamma, c.act, r_bias), c.width % 8 == 0 && c.width <= 1024);

  auto check = [&](int i, const char* what, at::ScalarType dt) {
    const at::Tensor g = i < 5 ? got[i].grad() : got[i];
    const at::Tensor rf = i < 5 ? ref[i].grad() : ref[i];
    const at::Tensor cp = i < 5 ? comp[i].grad() : comp[i];
    ASSERT_TRUE(g.defined()) << what;
    ASSERT_TRUE(ft::all_finite(g)) << what << " has NaN / inf (unwritten under poison?)";
    if (i < 5) {
      ASSERT_EQ(g.scalar_type(), (i == 1 ? r : i == 0 ? x : i == 4 ? r_bias : gamma).scalar_type()) << what;
    }
    const double err = ft::max_abs_diff(g, rf);
    // dgamma / dbeta / d r_bias sum over rows: their floor grows with sqrt(rows).
    const double scale = (1 + ft::max_abs(rf)) * (i >= 2 && i < 5 ? std::sqrt(double(c.rows)) : 1.0);
    // float32: sums over the row / rows in another order than libtorch's, a few ulps more.
    const double bound = 2 * ft::max_abs_diff(cp, rf) + (dt == at::kFloat ? 32 : 4) * unit_eps(dt) * scale;
    EXPECT_LE(err, bound) << what << ": max |ours - fp64| " << err << " > " << bound;
  };
  check(6, "normed", c.act);
  check(0, "dx", c.residual);
  check(2, "dgamma", at::kFloat);
  check(3, "dbeta", at::kFloat);
  if (c.add) {
    check(5, "sum", s_dtype);
    check(1, "dr", c.act);
  }
  if (has_bias) check(4, "dr_bias", c.bias);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AddLayerNormCuda,
    ::testing::Values(
        // The model under bf16 autocast: float32 residual stream, bf16 branch and output.
        LnCase{at::kBFloat16, at::kFloat, 1, 512, true}, LnCase{at::kBFloat16, at::kFloat, 63, 512, true},
        LnCase{at::kBFloat16, at::kFloat, 127, 512, false}, LnCase{at::kBFloat16, at::kFloat, 1000, 512, true},
        LnCase{at::kBFloat16, at::kFloat, 1000, 520, true}, LnCase{at::kBFloat16, at::kFloat, 63, 1024, true},
        LnCase{at::kBFloat16, at::kBFloat16, 127, 24, true}, LnCase{at::kHalf, at::kFloat, 127, 512, true},
        LnCase{at::kHalf, at::kHalf, 1000, 8, true}, LnCase{at::kFloat, at::kFloat, 1, 8, false},
        LnCase{at::kFloat, at::kFloat, 127, 520, true}, LnCase{at::kFloat, at::kFloat, 1000, 1024, false},
        // With the residual branch's bias (ff_out's, float32 as the model's master weight): every
        // slot count of the backward (widths 24, 512, 520 / 1024), rows 1 to 1000 (and 5000: several
        // rows per warp on the backward's 2-blocks-an-SM grid).
        LnCase{at::kBFloat16, at::kFloat, 1, 512, true, at::kFloat},
        LnCase{at::kBFloat16, at::kFloat, 1000, 512, true, at::kFloat},
        LnCase{at::kBFloat16, at::kFloat, 5000, 512, true, at::kFloat},
        LnCase{at::kBFloat16, at::kFloat, 63, 1024, true, at::kFloat},
        LnCase{at::kBFloat16, at::kBFloat16, 127, 24, true, at::kBFloat16},
        LnCase{at::kHalf, at::kFloat, 127, 520, true, at::kFloat},
        LnCase{at::kFloat, at::kFloat, 1000, 520, true, at::kFloat},
        LnCase{at::kFloat, at::kFloat, 63, 8, true, at::kHalf},
        // Widths the kernel does not take: the op path, on CUDA.
        LnCase{at::kBFloat16, at::kFloat, 63, 63, true}, LnCase{at::kFloat, at::kFloat, 1, 1032, true},
        LnCase{at::kBFloat16, at::kFloat, 63, 63, true, at::kFloat}),
    ln_name);

struct GeluCase {
  at::ScalarType dtype;  // of y, h, dh, dy (the GEMMs' dtype)
  at::ScalarType bias;   // of b and db (float32: the model's master weight)
  int64_t rows, width;
};

std::string gelu_name(const ::testing::TestParamInfo<GeluCase>& info) {
  const auto& c = info.param;
  return std::string(dtype_name(c.dtype)) + "_bias" + dtype_name(c.bias) + "_rows" + std::to_string(c.rows) + "_width" +
         std::to_string(c.width);
}

class BiasGeluCuda : public ft::PoisonedGpuTest<GeluCase> {};

// h = gelu(y + b), dy and db against float64, bounded by twice the error of the composite (linear's
// bias cast to the GEMM dtype and added there, at::gelu and its backward in that dtype, db summed
// from the rounded dy) plus a floor.
TEST_P(BiasGeluCuda, ForwardAndGradsVsFp64) {
  const GeluCase c = GetParam();
  at::manual_seed(c.rows * 7 + c.width * 5 + int(c.dtype) + 3 * int(c.bias));
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kDouble);
  // (B, T, F) as the model passes it; pre-activations around 0, where GELU bends, out to +-6.
  at::Tensor y = (2 * at::randn({1, c.rows, c.width}, opt)).to(c.dtype);
  at::Tensor b = (0.5 * at::randn({c.width}, opt)).to(c.bias);
  at::Tensor dh = at::randn({1, c.rows, c.width}, opt).to(c.dtype);

  auto run = [&](int which) {  // 0 ours, 1 fp64 composite, 2 composite in c.dtype
    auto in = ft::leaves({y, b}, which == 1 ? at::kDouble : at::ScalarType::Undefined);
    at::Tensor h = which == 0 ? fused::bias_gelu(in[0], in[1])
                              : ft::composite_bias_gelu(in[0], in[1], which == 1 ? at::kDouble : c.dtype);
    h.backward(which == 1 ? dh.to(at::kDouble) : dh);
    in.push_back(h);
    return in;  // y, b (with grads), h
  };
  auto got = run(0), ref = run(1), comp = run(2);
  EXPECT_EQ(fused::bias_gelu_uses_kernel(y, b), c.width % 8 == 0);
  const char* names[] = {"dy", "db", "h"};
  for (int i = 0; i < 3; ++i) {
    const at::Tensor g = i < 2 ? got[i].grad() : got[i];
    const at::Tensor rf = i < 2 ? ref[i].grad() : ref[i];
    const at::Tensor cp = i < 2 ? comp[i].grad() : comp[i];
    ASSERT_TRUE(g.defined()) << names[i];
    ASSERT_TRUE(ft::all_finite(g)) << names[i] << " has NaN / inf (unwritten under poison?)";
    ASSERT_EQ(g.scalar_type(), i == 1 ? c.bias : c.dtype) << names[i];
    ASSERT_EQ(g.sizes(), (i == 1 ? b : y).sizes()) << names[i];
    const double err = ft::max_abs_diff(g, rf);
    // db sums rows: its floor grows with sqrt(rows); float32 erff / expf are a few ulps off.
    const at::ScalarType dt = i == 1 ? c.bias : c.dtype;
    const double scale = (1 + ft::max_abs(rf)) * (i == 1 ? std::sqrt(double(c.rows)) : 1.0);
    const double bound = 2 * ft::max_abs_diff(cp, rf) + (dt == at::kFloat ? 32 : 4) * unit_eps(dt) * scale;
    EXPECT_LE(err, bound) << names[i] << ": max |ours - fp64| " << err << " > " << bound;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BiasGeluCuda,
    ::testing::Values(
        // The model under bf16 autocast: ff_in's (B T, 4 C) output, float32 bias.
        GeluCase{at::kBFloat16, at::kFloat, 1, 2048}, GeluCase{at::kBFloat16, at::kFloat, 63, 2048},
        GeluCase{at::kBFloat16, at::kFloat, 1000, 2048}, GeluCase{at::kBFloat16, at::kFloat, 127, 520},
        GeluCase{at::kBFloat16, at::kFloat, 1000, 24}, GeluCase{at::kBFloat16, at::kBFloat16, 127, 8},
        // Many rows on few columns: every warp strides over several rows (and the forward's unroll
        // has a remainder).
        GeluCase{at::kBFloat16, at::kFloat, 20001, 24}, GeluCase{at::kHalf, at::kFloat, 127, 2048},
        GeluCase{at::kHalf, at::kHalf, 1000, 520}, GeluCase{at::kFloat, at::kFloat, 1, 8},
        GeluCase{at::kFloat, at::kFloat, 63, 2048}, GeluCase{at::kFloat, at::kFloat, 1000, 520},
        // Widths the kernel does not take: the op path, on CUDA.
        GeluCase{at::kBFloat16, at::kFloat, 63, 63}, GeluCase{at::kFloat, at::kFloat, 127, 1001}),
    gelu_name);

struct CeCase {
  at::ScalarType dtype;
  int64_t rows, width, vocab, chunk;
};

std::string ce_name(const ::testing::TestParamInfo<CeCase>& info) {
  const auto& c = info.param;
  return std::string(dtype_name(c.dtype)) + "_rows" + std::to_string(c.rows) + "_C" + std::to_string(c.width) + "_V" +
         std::to_string(c.vocab) + "_chunk" + std::to_string(c.chunk);
}

class ClassifierCrossEntropyCuda : public ft::PoisonedGpuTest<CeCase> {};

TEST_P(ClassifierCrossEntropyCuda, LossAndGradsVsFp64) {
  const CeCase c = GetParam();
  at::manual_seed(c.rows * 7 + c.vocab + c.chunk + int(c.dtype));
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kDouble);
  at::Tensor h = at::randn({1, c.rows, c.width}, opt).to(c.dtype);  // as the fused final norm writes it
  at::Tensor w = (at::randn({c.vocab, c.width}, opt) * (2.0 / std::sqrt(double(c.width)))).to(at::kFloat);
  at::Tensor b = (at::randn({c.vocab}, opt) * 0.5).to(at::kFloat);
  at::Tensor target = at::randint(0, c.vocab, {1, c.rows}, opt.dtype(at::kLong));
  const double g = 0.37;

  auto run = [&](int which) {  // 0 ours, 1 fp64 composite, 2 composite in c.dtype
    auto in = ft::leaves({h, w, b}, which == 1 ? at::kDouble : at::ScalarType::Undefined);
    at::Tensor loss = which == 0 ? fused::classifier_cross_entropy(in[0], in[1], in[2], target, c.dtype, c.chunk)
                                 : ft::composite_classifier_ce(in[0], in[1], in[2], target,
                                                               which == 1 ? at::kDouble : c.dtype);
    torch::autograd::backward({loss}, {at::full({}, g, loss.options())});
    in.push_back(loss);
    return in;
  };
  auto got = run(0), ref = run(1), comp = run(2);
  const char* names[] = {"dh", "dW", "db", "loss"};
  for (int i = 0; i < 4; ++i) {
    const at::Tensor gg = i < 3 ? got[i].grad() : got[i];
    const at::Tensor rf = i < 3 ? ref[i].grad() : ref[i];
    const at::Tensor cp = i < 3 ? comp[i].grad() : comp[i];
    ASSERT_TRUE(gg.defined()) << names[i];
    ASSERT_TRUE(ft::all_finite(gg)) << names[i];
    if (i < 3) {
      ASSERT_EQ(gg.scalar_type(), (i == 0 ? h : i == 1 ? w : b).scalar_type()) << names[i];
    }
    const double err = ft::max_abs_diff(gg, rf);
    const double bound = 2 * ft::max_abs_diff(cp, rf) + 4 * unit_eps(c.dtype) * ft::max_abs(rf) + 1e-7;
    EXPECT_LE(err, bound) << names[i] << ": max |ours - fp64| " << err << " > " << bound;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ClassifierCrossEntropyCuda,
                         ::testing::Values(CeCase{at::kBFloat16, 1, 512, 256, 8192},
                                           CeCase{at::kBFloat16, 63, 512, 256, 8192},
                                           CeCase{at::kBFloat16, 1000, 512, 256, 127},
                                           CeCase{at::kBFloat16, 127, 64, 256, 1},
                                           CeCase{at::kHalf, 1000, 512, 256, 300},
                                           CeCase{at::kFloat, 127, 512, 256, 64},
                                           CeCase{at::kFloat, 1000, 40, 13, 999},  // V not a multiple of 8
                                           CeCase{at::kBFloat16, 63, 24, 1000, 8}),
                         ce_name);

TEST(ClassifierCrossEntropyCuda, OutOfRangeTargetGivesNan) {
  if (!ft::fused_kernels_on_gpu()) GTEST_SKIP() << "needs a CUDA device and a build with the CUDA kernels";
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::Tensor target = at::zeros({4}, opt.dtype(at::kLong));
  target[2] = 256;
  at::Tensor loss = fused::classifier_cross_entropy(at::randn({4, 32}, opt), at::randn({256, 32}, opt), at::Tensor(),
                                                    target, at::kBFloat16);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
}

// The whole model under bf16 autocast: loss and every parameter's gradient with the fused
// operators against FLASHCOS_FUSED_OPS=0 (the composite path), same weights and batch.
TEST(FusedOpsCuda, GptLossAndGradsMatchTheCompositePath) {
  if (!ft::fused_kernels_on_gpu()) GTEST_SKIP() << "needs a CUDA device and a build with the CUDA kernels";
  flashcos::model::ModelConfig cfg;
  cfg.dim = 128, cfg.depth = 2, cfg.heads = 2, cfg.dim_head = 64, cfg.max_seq_len = 256;
  cfg.attention_impl = "plain";
  at::manual_seed(5);
  flashcos::model::GPT model(cfg);
  {
    // Non-zero biases and LayerNorm affines (the init zeroes the biases): a bias the fused path
    // dropped (ff_in's in bias_gelu, ff_out's carried to the next norm), or a bias gradient it
    // lost, would show in the loss or the gradients below.
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) {
      const std::string& k = p.key();
      const bool bias = k.size() >= 4 && k.compare(k.size() - 4, 4, "bias") == 0;
      if (bias || k.find("norm") != std::string::npos) p.value().add_(0.2 * at::randn_like(p.value()));
    }
  }
  model->to(at::kCUDA);
  at::Tensor window = at::randint(0, 256, {2, 129}, at::TensorOptions().device(at::kCUDA).dtype(at::kLong));
  auto step = [&](const char* fused_env) {
    setenv("FLASHCOS_FUSED_OPS", fused_env, 1);
    model->zero_grad();
    double loss;
    {
      flashcos::model::AutocastScope autocast(true, at::kCUDA, at::kBFloat16);
      at::Tensor l = model->loss(window);
      l.backward();
      loss = l.item<double>();
    }
    std::vector<at::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return std::make_pair(loss, grads);
  };
  auto composite = step("0");
  auto fused_run = step("1");
  unsetenv("FLASHCOS_FUSED_OPS");
  EXPECT_NEAR(fused_run.first, composite.first, 2e-2) << "loss";
  const auto names = model->named_parameters();
  for (size_t i = 0; i < composite.second.size(); ++i) {
    const double scale = ft::max_abs(composite.second[i]);
    EXPECT_LE(ft::max_abs_diff(fused_run.second[i], composite.second[i]), 0.05 * scale + 1e-6)
        << names[i].key();
  }
}

}  // namespace

namespace {

// The fused operators add their parameters' gradients straight into an existing .grad
// (model/fused/grad_accumulate.h): a second backward must give the first's gradients plus what
// .grad held, as autograd's own accumulation would.
TEST(FusedOpsCuda, ParameterGradientsAddIntoAnExistingGrad) {
  if (!ft::fused_kernels_on_gpu()) GTEST_SKIP() << "needs a CUDA device and a build with the CUDA kernels";
  at::manual_seed(21);
  const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const int64_t N = 1000, C = 512, F = 2048;
  const at::Tensor x = at::randn({N, C}, f32), r = at::randn({N, C}, f32).to(at::kBFloat16);
  const at::Tensor y = at::randn({N, F}, f32).to(at::kBFloat16);
  at::Tensor gamma = (1 + 0.1 * at::randn({C}, f32)).requires_grad_(true);
  at::Tensor beta = (0.1 * at::randn({C}, f32)).requires_grad_(true);
  at::Tensor r_bias = (0.1 * at::randn({C}, f32)).requires_grad_(true);
  at::Tensor b = (0.1 * at::randn({F}, f32)).requires_grad_(true);
  const std::vector<at::Tensor> params = {gamma, beta, r_bias, b};
  const at::Tensor dnorm = at::randn({N, C}, f32).to(at::kBFloat16), dh = at::randn({N, F}, f32).to(at::kBFloat16);
  auto backward = [&] {
    const auto out = fused::add_layer_norm(x, r, r_bias, gamma, beta, 1e-5, at::kBFloat16);
    const at::Tensor h = fused::bias_gelu(y, b);
    torch::autograd::backward({out.normed, h}, {dnorm, dh});
  };
  backward();  // .grad undefined: autograd takes the fresh gradients
  std::vector<at::Tensor> fresh, preset;
  for (const auto& p : params) {
    ASSERT_TRUE(p.grad().defined());
    fresh.push_back(p.grad().clone());
    preset.push_back(at::randn_like(p));
    p.mutable_grad() = preset.back().clone();
  }
  backward();  // .grad defined: the kernels add into it
  const char* names[] = {"gamma", "beta", "r_bias", "b"};
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor want = preset[i] + fresh[i];
    EXPECT_LE(ft::max_abs_diff(params[i].grad(), want), 1e-4 * (1 + ft::max_abs(want))) << names[i];
  }
  // A hooked parameter gets its gradient through autograd (the hook sees it), added all the same.
  at::Tensor seen;
  b.register_hook([&](const at::Tensor& g) {
    seen = g.clone();
    return g;
  });
  const at::Tensor before = b.grad().clone();
  backward();
  ASSERT_TRUE(seen.defined());
  EXPECT_LE(ft::max_abs_diff(seen, fresh[3]), 1e-4 * (1 + ft::max_abs(fresh[3])));
  EXPECT_LE(ft::max_abs_diff(b.grad(), before + fresh[3]), 1e-4 * (1 + ft::max_abs(before)));
}

}  // namespace
