// The fused trainer operators (model/fused/) on CPU, where they run as libtorch ops inside their
// autograd Functions (chunking, the gradient made in the forward, the hand-written LayerNorm and
// bias + GELU backwards): forward and every gradient against the composite ops they replace, both
// evaluated in float64 and in the operators' dtypes. Runs in CI (no GPU).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "model/fused/add_layer_norm.h"
#include "model/fused/bias_gelu.h"
#include "model/fused/classifier_cross_entropy.h"
#include "model/fused/switch.h"
#include "tests/fused_ops_test_util.h"

namespace {

namespace fused = flashcos::model::fused;
namespace ft = flashcos::test;

struct LnCase {
  at::ScalarType dtype;  // of x, r and the output
  int64_t rows, width;
  bool residual;
  bool bias = false;  // r_bias (float32, as the model's ff_out.bias), with the residual
};

std::string ln_name(const ::testing::TestParamInfo<LnCase>& info) {
  const auto& c = info.param;
  return std::string(c.dtype == at::kDouble ? "f64" : c.dtype == at::kFloat ? "f32" : "bf16") + "_rows" +
         std::to_string(c.rows) + "_width" + std::to_string(c.width) + (c.residual ? "_add" : "_plain") +
         (c.bias ? "_bias" : "");
}

class AddLayerNormCpu : public ::testing::TestWithParam<LnCase> {};

TEST_P(AddLayerNormCpu, ForwardAndGradsMatchCompositeOps) {
  const LnCase c = GetParam();
  at::manual_seed(c.rows * 131 + c.width + c.residual + 7 * c.bias);
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  const double eps = 1e-5;
  // The residual stream in float32 (fp64 for the double case), the branch in the case's dtype.
  const auto x_dtype = c.dtype == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor x = (at::randn({c.rows, c.width}, opt) * 2 + 0.5).to(x_dtype);
  at::Tensor r = c.residual ? at::randn({c.rows, c.width}, opt).to(c.dtype) : at::Tensor();
  at::Tensor r_bias = c.bias ? (0.5 * at::randn({c.width}, opt)).to(at::kFloat) : at::Tensor();
  at::Tensor gamma = (1 + 0.3 * at::randn({c.width}, opt)).to(at::kFloat);
  at::Tensor beta = (0.1 * at::randn({c.width}, opt)).to(at::kFloat);
  at::Tensor dy = at::randn({c.rows, c.width}, opt);
  at::Tensor ds = at::randn({c.rows, c.width}, opt);

  // Inputs in the order x, r, gamma, beta, r_bias.
  auto ours_in = ft::leaves({x, r, gamma, beta, r_bias});
  auto out = fused::add_layer_norm(ours_in[0], ours_in[1], ours_in[4], ours_in[2], ours_in[3], eps, c.dtype);
  ASSERT_EQ(out.normed.scalar_type(), c.dtype);
  std::vector<at::Tensor> outs{out.normed}, upstream{dy.to(c.dtype)};
  if (c.residual) outs.push_back(out.sum), upstream.push_back(ds.to(out.sum.scalar_type()));
  torch::autograd::backward(outs, upstream);

  // Float64 composite reference on the same (rounded) inputs.
  auto ref_in = ft::leaves({x, r, gamma, beta, r_bias}, at::kDouble);
  auto [s_ref, y_ref] =
      ft::composite_add_layer_norm(ref_in[0], ref_in[1], ref_in[2], ref_in[3], eps, at::kDouble, ref_in[4]);
  std::vector<at::Tensor> ref_outs{y_ref}, ref_up{dy.to(c.dtype).to(at::kDouble)};
  if (c.residual) ref_outs.push_back(s_ref), ref_up.push_back(ds.to(out.sum.scalar_type()).to(at::kDouble));
  torch::autograd::backward(ref_outs, ref_up);

  const double tol = c.dtype == at::kDouble ? 1e-10 : c.dtype == at::kFloat ? 2e-5 : 0.0;
  // bf16: one rounding of the output / gradient dominates; bound by twice the composite's own
  // error in the same dtype (computed next) plus a floor.
  auto check = [&](const at::Tensor& got, const at::Tensor& ref, const at::Tensor& comp, const char* what) {
    ASSERT_TRUE(got.defined()) << what;
    ASSERT_TRUE(ft::all_finite(got)) << what;
    const double err = ft::max_abs_diff(got, ref);
    // gamma / beta / r_bias are float32 master weights in every case, so in the float64 case their
    // gradients are float32 tensors: float64 math, then one rounding to float32 (at most 2^-24 |value|).
    const double rounding = c.dtype == at::kDouble && got.scalar_type() == at::kFloat ? std::ldexp(1.0, -24) : 0.0;
    const double bound = c.dtype == at::kBFloat16 ? 2 * ft::max_abs_diff(comp, ref) + 1e-2 * (1 + ft::max_abs(ref))
                                                  : tol * (1 + ft::max_abs(ref)) + rounding * ft::max_abs(ref);
    EXPECT_LE(err, bound) << what << ": max |ours - fp64| " << err << " > " << bound;
  };
  auto comp_in = ft::leaves({x, r, gamma, beta, r_bias});
  auto [s_c, y_c] =
      ft::composite_add_layer_norm(comp_in[0], comp_in[1], comp_in[2], comp_in[3], eps, c.dtype, comp_in[4]);
  std::vector<at::Tensor> comp_outs{y_c}, comp_up{dy.to(c.dtype)};
  if (c.residual) comp_outs.push_back(s_c), comp_up.push_back(ds.to(s_c.scalar_type()));
  torch::autograd::backward(comp_outs, comp_up);

  check(out.normed, y_ref, y_c, "normed");
  if (c.residual) {
    const auto s_dtype = at::result_type(x, r);
    ASSERT_EQ(out.sum.scalar_type(), c.bias ? at::promote_types(s_dtype, at::kFloat) : s_dtype);
    check(out.sum, s_ref, s_c, "sum");
    check(ours_in[1].grad(), ref_in[1].grad(), comp_in[1].grad(), "dr");
    ASSERT_EQ(ours_in[1].grad().scalar_type(), r.scalar_type());
  }
  if (c.bias) {
    // d r_bias = sum_rows dsum: what r's GEMM's bias would get from dr.
    check(ours_in[4].grad(), ref_in[4].grad(), comp_in[4].grad(), "dr_bias");
    ASSERT_EQ(ours_in[4].grad().scalar_type(), at::kFloat);
  }
  check(ours_in[0].grad(), ref_in[0].grad(), comp_in[0].grad(), "dx");
  check(ours_in[2].grad(), ref_in[2].grad(), comp_in[2].grad(), "dgamma");
  check(ours_in[3].grad(), ref_in[3].grad(), comp_in[3].grad(), "dbeta");
}

INSTANTIATE_TEST_SUITE_P(Cases, AddLayerNormCpu,
                         ::testing::Values(LnCase{at::kDouble, 63, 512, true}, LnCase{at::kFloat, 1, 512, true},
                                           LnCase{at::kFloat, 127, 24, true}, LnCase{at::kFloat, 63, 7, false},
                                           LnCase{at::kFloat, 1000, 520, false}, LnCase{at::kBFloat16, 127, 512, true},
                                           LnCase{at::kBFloat16, 63, 63, true},
                                           // With the residual branch's bias (r_bias).
                                           LnCase{at::kDouble, 63, 512, true, true},
                                           LnCase{at::kFloat, 1, 24, true, true}, LnCase{at::kFloat, 127, 7, true, true},
                                           LnCase{at::kBFloat16, 127, 512, true, true}),
                         ln_name);

TEST(AddLayerNormCpu, BadArgumentsNameWhatIsWrong) {
  const auto x = at::randn({4, 8});
  try {
    fused::add_layer_norm(x, at::randn({4, 7}), at::ones({8}), at::zeros({8}), 1e-5, at::kFloat);
    FAIL() << "a residual of another shape must be rejected";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must have x's shape"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fused::layer_norm(x, at::ones({7}), at::zeros({7}), 1e-5, at::kFloat), c10::Error);
  try {
    fused::add_layer_norm(x, at::Tensor(), at::zeros({8}), at::ones({8}), at::zeros({8}), 1e-5, at::kFloat);
    FAIL() << "a residual bias without a residual must be rejected";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a residual r"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fused::add_layer_norm(x, x, at::zeros({7}), at::ones({8}), at::zeros({8}), 1e-5, at::kFloat),
               c10::Error);
}

struct GeluCase {
  at::ScalarType dtype;  // of y, h and their gradients (the bias is float32, as the model's)
  int64_t rows, width;
};

std::string gelu_name(const ::testing::TestParamInfo<GeluCase>& info) {
  const auto& c = info.param;
  return std::string(c.dtype == at::kDouble ? "f64" : c.dtype == at::kFloat ? "f32" : "bf16") + "_rows" +
         std::to_string(c.rows) + "_width" + std::to_string(c.width);
}

class BiasGeluCpu : public ::testing::TestWithParam<GeluCase> {};

// fused::bias_gelu's libtorch-op path (h = gelu(y + b), dy, db = sum_rows dy) against the explicit
// ops with autograd: at::gelu(y + b) in float64, and in the case's dtype (the composite).
TEST_P(BiasGeluCpu, ForwardAndGradsMatchCompositeOps) {
  const GeluCase c = GetParam();
  at::manual_seed(c.rows * 17 + c.width);
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  // Pre-activations around 0, where GELU bends, and out to +-6.
  at::Tensor y = (2 * at::randn({c.rows, c.width}, opt)).to(c.dtype);
  at::Tensor b = (0.5 * at::randn({c.width}, opt)).to(at::kFloat);
  at::Tensor dh = at::randn({c.rows, c.width}, opt).to(c.dtype);

  auto ours = ft::leaves({y, b});
  at::Tensor h = fused::bias_gelu(ours[0], ours[1]);
  ASSERT_EQ(h.scalar_type(), c.dtype);
  ASSERT_EQ(h.sizes(), y.sizes());
  h.backward(dh);
  auto ref = ft::leaves({y, b}, at::kDouble);
  at::Tensor h_ref = ft::composite_bias_gelu(ref[0], ref[1], at::kDouble);
  h_ref.backward(dh.to(at::kDouble));
  auto comp = ft::leaves({y, b});
  at::Tensor h_c = ft::composite_bias_gelu(comp[0], comp[1], c.dtype);
  h_c.backward(dh);

  auto check = [&](const at::Tensor& got, const at::Tensor& rf, const at::Tensor& cp, const char* what, double scale) {
    ASSERT_TRUE(got.defined()) << what;
    ASSERT_TRUE(ft::all_finite(got)) << what;
    const double err = ft::max_abs_diff(got, rf);
    // The bias is float32 in every case: its gradient in the float64 case is float64 math rounded
    // once to float32.
    const double tol = c.dtype == at::kDouble ? (got.scalar_type() == at::kFloat ? std::ldexp(1.0, -23) : 1e-12)
                       : c.dtype == at::kFloat ? 1e-6
                                               : 0.0;
    const double bound = c.dtype == at::kBFloat16 ? 2 * ft::max_abs_diff(cp, rf) + 1e-2 * scale * (1 + ft::max_abs(rf))
                                                  : tol * scale * (1 + ft::max_abs(rf));
    EXPECT_LE(err, bound) << what << ": max |ours - fp64| " << err << " > " << bound;
  };
  check(h, h_ref, h_c, "h", 1.0);
  check(ours[0].grad(), ref[0].grad(), comp[0].grad(), "dy", 1.0);
  ASSERT_EQ(ours[0].grad().scalar_type(), c.dtype);
  // db sums rows: float32 accumulation error grows with them.
  check(ours[1].grad(), ref[1].grad(), comp[1].grad(), "db", std::sqrt(double(c.rows)));
  ASSERT_EQ(ours[1].grad().scalar_type(), at::kFloat);
}

INSTANTIATE_TEST_SUITE_P(Cases, BiasGeluCpu,
                         ::testing::Values(GeluCase{at::kDouble, 63, 2048}, GeluCase{at::kFloat, 1, 8},
                                           GeluCase{at::kFloat, 127, 24}, GeluCase{at::kFloat, 1000, 520},
                                           GeluCase{at::kFloat, 63, 7}, GeluCase{at::kBFloat16, 127, 2048}),
                         gelu_name);

TEST(BiasGeluCpu, ThreeDimensionalInputAndBadArguments) {
  at::manual_seed(2);
  // (B, T, F) as the model passes it: the same as the rows flattened.
  const at::Tensor y = at::randn({2, 5, 16}), b = at::randn({16});
  EXPECT_TRUE(at::allclose(fused::bias_gelu(y, b), at::gelu(y + b), 1e-6, 1e-7));
  try {
    fused::bias_gelu(y, at::randn({15}));
    FAIL() << "a bias of another width must be rejected";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be (F) = (16)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fused::bias_gelu(y, at::Tensor()), c10::Error);
}

struct CeCase {
  at::ScalarType dtype;  // compute dtype of the GEMMs and the saved dlogits
  int64_t rows, width, vocab, chunk;
  bool bias;
};

std::string ce_name(const ::testing::TestParamInfo<CeCase>& info) {
  const auto& c = info.param;
  return std::string(c.dtype == at::kDouble ? "f64" : c.dtype == at::kFloat ? "f32" : "bf16") + "_rows" +
         std::to_string(c.rows) + "_C" + std::to_string(c.width) + "_V" + std::to_string(c.vocab) + "_chunk" +
         std::to_string(c.chunk) + (c.bias ? "_bias" : "_nobias");
}

class ClassifierCrossEntropyCpu : public ::testing::TestWithParam<CeCase> {};

TEST_P(ClassifierCrossEntropyCpu, LossAndGradsMatchCompositeOps) {
  const CeCase c = GetParam();
  at::manual_seed(c.rows * 7 + c.vocab + c.chunk);
  const auto opt = at::TensorOptions().dtype(at::kDouble);
  // h as the final norm leaves it (unit scale), float32 master weights; rows as (B, T) = (1, rows).
  at::Tensor h = at::randn({1, c.rows, c.width}, opt).to(at::kFloat);
  at::Tensor w = (at::randn({c.vocab, c.width}, opt) * 0.3).to(at::kFloat);
  at::Tensor b = c.bias ? (at::randn({c.vocab}, opt) * 0.5).to(at::kFloat) : at::Tensor();
  at::Tensor target = at::randint(0, c.vocab, {1, c.rows}, at::TensorOptions().dtype(at::kLong));
  const double g = 0.37;  // upstream gradient != 1: the backward's scaling is part of the test

  auto ours_in = ft::leaves({h, w, b});
  at::Tensor loss = fused::classifier_cross_entropy(ours_in[0], ours_in[1], ours_in[2], target, c.dtype, c.chunk);
  ASSERT_EQ(loss.dim(), 0);
  ASSERT_EQ(loss.scalar_type(), c.dtype == at::kDouble ? at::kDouble : at::kFloat);
  torch::autograd::backward({loss}, {at::full({}, g, loss.options())});

  auto ref_in = ft::leaves({h, w, b}, at::kDouble);
  at::Tensor ref = ft::composite_classifier_ce(ref_in[0], ref_in[1], ref_in[2], target, at::kDouble);
  torch::autograd::backward({ref}, {at::full({}, g, ref.options())});
  auto comp_in = ft::leaves({h, w, b});
  at::Tensor comp = ft::composite_classifier_ce(comp_in[0], comp_in[1], comp_in[2], target, c.dtype);
  torch::autograd::backward({comp}, {at::full({}, g, comp.options())});

  auto check = [&](const at::Tensor& got, const at::Tensor& r, const at::Tensor& cp, const char* what) {
    ASSERT_TRUE(got.defined()) << what;
    ASSERT_TRUE(ft::all_finite(got)) << what;
    const double err = ft::max_abs_diff(got, r);
    const double floor = c.dtype == at::kDouble ? 1e-12 : c.dtype == at::kFloat ? 1e-5 : 4e-3;
    const double bound = 2 * ft::max_abs_diff(cp, r) + floor * (1 + ft::max_abs(r));
    EXPECT_LE(err, bound) << what << ": max |ours - fp64| " << err << " > " << bound;
  };
  check(loss, ref, comp, "loss");
  check(ours_in[0].grad(), ref_in[0].grad(), comp_in[0].grad(), "dh");
  EXPECT_EQ(ours_in[0].grad().sizes(), h.sizes());
  check(ours_in[1].grad(), ref_in[1].grad(), comp_in[1].grad(), "dW");
  if (c.bias) check(ours_in[2].grad(), ref_in[2].grad(), comp_in[2].grad(), "db");
}

INSTANTIATE_TEST_SUITE_P(Cases, ClassifierCrossEntropyCpu,
                         ::testing::Values(CeCase{at::kDouble, 127, 64, 256, 50, true},
                                           CeCase{at::kFloat, 1, 512, 256, 8192, true},
                                           CeCase{at::kFloat, 63, 40, 256, 7, false},
                                           CeCase{at::kFloat, 1000, 64, 13, 300, true},
                                           CeCase{at::kBFloat16, 127, 128, 256, 64, true}),
                         ce_name);

TEST(ClassifierCrossEntropyCpu, BadArgumentsNameWhatIsWrong) {
  const auto h = at::randn({5, 8});
  try {
    fused::classifier_cross_entropy(h, at::randn({16, 8}), at::Tensor(), at::zeros({4}, at::kLong), at::kFloat);
    FAIL() << "a target of the wrong length must be rejected";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("one entry per row"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fused::classifier_cross_entropy(h, at::randn({16, 7}), at::Tensor(), at::zeros({5}, at::kLong), at::kFloat),
               c10::Error);
  EXPECT_THROW(fused::classifier_cross_entropy(h, at::randn({16, 8}), at::Tensor(), at::zeros({5}, at::kLong), at::kFloat, 0),
               c10::Error);
}

// The model's calls without a residual (every pre-attention norm, the final norm) and a
// classifier without a bias, as evaluation runs them: under NoGradGuard, on inputs that need no
// gradient. Function::apply must take the missing tensor in either grad mode.
TEST(FusedOpsCpu, NoResidualAndNoBiasRunWithoutGrad) {
  at::manual_seed(3);
  c10::AutoGradMode no_grad(false);
  const at::Tensor x = at::randn({2, 5, 16}), gamma = 1 + 0.3 * at::randn({16}), beta = 0.1 * at::randn({16});
  const at::Tensor y = fused::layer_norm(x, gamma, beta, 1e-5, at::kFloat);
  const auto ref = ft::composite_add_layer_norm(x, at::Tensor(), gamma, beta, 1e-5, at::kFloat);
  EXPECT_LE(ft::max_abs_diff(y, ref.second), 1e-5 * (1 + ft::max_abs(ref.second)));
  const auto both = fused::add_layer_norm(x, at::Tensor(), gamma, beta, 1e-5, at::kFloat);
  EXPECT_TRUE(both.sum.is_same(x)) << "without a residual the sum is x itself";

  const at::Tensor w = 0.3 * at::randn({13, 16});
  const at::Tensor target = at::randint(0, 13, {2, 5}, at::TensorOptions().dtype(at::kLong));
  const at::Tensor loss = fused::classifier_cross_entropy(y, w, at::Tensor(), target, at::kFloat, 3);
  const at::Tensor loss_ref = ft::composite_classifier_ce(y, w, at::Tensor(), target, at::kFloat);
  EXPECT_LE(ft::max_abs_diff(loss, loss_ref), 1e-5 * (1 + ft::max_abs(loss_ref)));
}

TEST(FusedOpsSwitch, CpuTensorsTakeTheCompositePath) {
  // The model's CPU numbers must not change: CPU tensors never take the fused operators.
  EXPECT_FALSE(fused::fused_ops_enabled(at::randn({2, 8})));
  EXPECT_EQ(fused::activation_dtype(at::randn({2}, at::kFloat)), at::kFloat);
  {
    // The tests' switch for the fused structure on a CPU: on while it lives, FLASHCOS_FUSED_OPS=0
    // still wins, and off again after.
    fused::FusedOpsOnCpuForTesting on;
    EXPECT_TRUE(fused::fused_ops_enabled(at::randn({2, 8})));
    setenv("FLASHCOS_FUSED_OPS", "0", 1);
    EXPECT_FALSE(fused::fused_ops_enabled(at::randn({2, 8})));
    unsetenv("FLASHCOS_FUSED_OPS");
  }
  EXPECT_FALSE(fused::fused_ops_enabled(at::randn({2, 8})));
}

TEST(FusedOpsSwitch, AListFusesOnlyTheOperatorsItNames) {
  fused::FusedOpsOnCpuForTesting on;
  const at::Tensor t = at::randn({2, 8});
  const char* ops[] = {"norm", "gelu", "embedding", "classifier", "copies"};
  for (const char* all : {"", "1"}) {  // unset, then 1: every operator
    if (*all) setenv("FLASHCOS_FUSED_OPS", all, 1);
    for (const char* op : ops) EXPECT_TRUE(fused::fused_op_enabled(t, op)) << op << " under '" << all << "'";
  }
  setenv("FLASHCOS_FUSED_OPS", "gelu,classifier", 1);
  for (const char* op : ops) {
    const bool listed = std::string(op) == "gelu" || std::string(op) == "classifier";
    EXPECT_EQ(fused::fused_op_enabled(t, op), listed) << op;
  }
  EXPECT_TRUE(fused::fused_ops_enabled(t)) << "a list keeps the fused structure";
  setenv("FLASHCOS_FUSED_OPS", "norm", 1);
  EXPECT_FALSE(fused::fused_op_enabled(t, "nor")) << "items match whole";
  EXPECT_TRUE(fused::fused_op_enabled(t, "norm"));
  setenv("FLASHCOS_FUSED_OPS", "0", 1);
  for (const char* op : ops) EXPECT_FALSE(fused::fused_op_enabled(t, op)) << op;
  unsetenv("FLASHCOS_FUSED_OPS");
  // FLASHCOS_WEIGHT_COPIES=0: copies off, every other operator on.
  setenv("FLASHCOS_WEIGHT_COPIES", "0", 1);
  for (const char* op : ops) EXPECT_EQ(fused::fused_op_enabled(t, op), std::string(op) != "copies") << op;
  unsetenv("FLASHCOS_WEIGHT_COPIES");
}

}  // namespace
