// The trainer's sync-free gradient norm and clipping (model/optim.h: grad_norm, clip_grad_norm)
// against the same sums in float64, on fresh random gradients of odd sizes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "model/optim.h"

namespace {

// Parameters of odd sizes in float32 and float64 with random gradients times `scale`; the last one
// has no gradient (the norm must leave it out).
std::vector<at::Tensor> params_with_grads(double scale, int64_t seed) {
  at::manual_seed(seed);
  std::vector<at::Tensor> params;
  const std::vector<std::vector<int64_t>> shapes = {{1}, {63}, {127, 3}, {1000}, {8, 8}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto dtype = i % 2 == 0 ? at::kFloat : at::kDouble;
    auto p = at::randn(shapes[i], at::TensorOptions().dtype(dtype));
    p.mutable_grad() = at::randn(shapes[i], at::TensorOptions().dtype(dtype)) * scale;
    params.push_back(p);
  }
  params.push_back(at::randn({5}));  // no gradient
  return params;
}

double norm64(const std::vector<at::Tensor>& params) {
  double sum = 0;
  for (const auto& p : params)
    if (p.grad().defined()) sum += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sum);
}

std::vector<at::Tensor> grads_copy(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return out;
}

TEST(GradNorm, MatchesFloat64OverTheDefinedGradients) {
  for (double scale : {1e-3, 1.0, 50.0}) {
    const auto params = params_with_grads(scale, 11);
    const at::Tensor n = flashcos::model::grad_norm(params);
    ASSERT_TRUE(n.defined());
    EXPECT_EQ(n.dim(), 0);
    EXPECT_EQ(n.scalar_type(), at::kFloat);
    const double ref = norm64(params);
    EXPECT_NEAR(n.item<double>(), ref, 1e-6 * ref) << "scale " << scale;
  }
}

TEST(GradNorm, UndefinedWhereNoGradientIs) {
  const std::vector<at::Tensor> params = {at::randn({3}), at::randn({4, 2})};
  EXPECT_FALSE(flashcos::model::grad_norm(params).defined());
  EXPECT_FALSE(flashcos::model::clip_grad_norm(params, 1.0).defined());
  EXPECT_FALSE(params[0].grad().defined());
}

TEST(ClipGradNorm, ScalesToMaxNormAndReturnsTheNormBeforeClipping) {
  const auto params = params_with_grads(3.0, 12);
  const double before = norm64(params);
  const double max_norm = 0.25;
  ASSERT_GT(before, 10 * max_norm);  // the case clips
  const auto grads_before = grads_copy(params);
  const at::Tensor n = flashcos::model::clip_grad_norm(params, max_norm);
  ASSERT_TRUE(n.defined());
  EXPECT_NEAR(n.item<double>(), before, 1e-6 * before);
  EXPECT_NEAR(norm64(params), max_norm, 1e-5 * max_norm);
  // Every gradient scaled by the same factor, max_norm / norm.
  const double coef = max_norm / before;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads_before[i].defined()) {
      EXPECT_FALSE(params[i].grad().defined());
      continue;
    }
    const double err = (params[i].grad().to(at::kDouble) - grads_before[i].to(at::kDouble) * coef).abs().max().item<double>();
    const double tol = 1e-6 * grads_before[i].to(at::kDouble).abs().max().item<double>() * coef + 1e-12;
    EXPECT_LE(err, tol) << "parameter " << i;
  }
}

TEST(ClipGradNorm, LeavesGradientsBelowTheBoundAsTheyAre) {
  const auto params = params_with_grads(1e-3, 13);
  const double before = norm64(params);
  ASSERT_LT(before, 1.0);
  const auto grads_before = grads_copy(params);
  const at::Tensor n = flashcos::model::clip_grad_norm(params, 1.0);
  EXPECT_NEAR(n.item<double>(), before, 1e-6 * before);
  for (size_t i = 0; i < params.size(); ++i) {
    if (grads_before[i].defined()) {
      EXPECT_TRUE(at::equal(params[i].grad(), grads_before[i])) << "parameter " << i;
    }
  }
}

}  // namespace
