// The decode step's one-row linear kernel (model/decode/decode_linear.h), skipped without a CUDA
// device: every combination of LayerNorm, bias, GELU and residual accumulation, in float32 /
// bf16 / fp16, for odd output counts and widths up to the 2048 limit, against a float64 reference
// that rounds where the kernel is specified to round (the LayerNorm output and each result to the
// compute dtype). Outputs are poisoned first (NaN, or a known residual that must be added to). The
// decode step's folds (the embedding row at a device token, the position advance) give the plain
// launch's output bit for bit. Bad arguments are refused with a message.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/decode/decode_linear.h"
#include "tests/attention_test_util.h"

namespace {

using flashcos::model::decode_linear;
using flashcos::model::decode_linear_available;
using flashcos::model::DecodeLinearFolds;

struct Case {
  int64_t n, k;
  bool ln, bias, gelu, accumulate;
};

// The specified computation in float64, rounding through `dtype` where the kernel rounds.
at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& g,
                     const at::Tensor& beta, const Case& c, at::ScalarType dtype) {
  auto round = [&](const at::Tensor& t) { return t.to(dtype).to(at::kDouble); };
  auto h = x.to(at::kDouble);
  if (c.ln) {
    const auto mean = h.mean();
    const auto var = (h - mean).pow(2).mean();
    h = round((h - mean) / (var + 1e-5).sqrt() * g.to(at::kDouble) + beta.to(at::kDouble));
  }
  auto y = at::matmul(w.to(at::kDouble), h.view({-1}));
  if (c.bias) y = y + b.to(at::kDouble);
  y = round(y);
  if (c.gelu) y = round(0.5 * y * (1 + at::erf(y / std::sqrt(2.0))));
  return y;
}

// |a - ref| / |scale| in float64, scale = |W| |h| + |b| (+ |residual|): the size of the terms
// summed, not of their sum, which for one output can cancel to near zero (a float32 dot product
// of K terms is exact to ~sqrt(K) eps of the terms). GELU's slope is at most 1.13, so its output
// error is measured on the same scale (its 1 + erf(y / sqrt 2) cancels for negative y: a near-zero
// output carries float32 erf's error, large relative to itself).
double err_vs(const at::Tensor& a, const at::Tensor& ref, const at::Tensor& scale) {
  const auto a64 = a.to(at::kDouble);
  if (!at::isfinite(a64).all().item<bool>()) return INFINITY;
  return (a64 - ref).norm().item<double>() / std::max(scale.norm().item<double>(), 1e-30);
}

TEST(DecodeLinear, MatchesFloat64Reference) {
  if (!torch::cuda::is_available() || !decode_linear_available(torch::kCUDA, 64)) {
    GTEST_SKIP() << "needs a CUDA device, a CUDA build and FLASHCOS_DECODE_LINEAR not 0";
  }
  std::vector<Case> cases;
  for (int64_t n : {1, 63, 127, 1000}) {
    for (int64_t k : {8, 264, 512, 520, 2048}) {  // 512: LayerNorm parameters loaded before the wait
      for (int flags = 0; flags < 16; ++flags) {
        cases.push_back({n, k, (flags & 1) != 0, (flags & 2) != 0, (flags & 4) != 0, (flags & 8) != 0});
      }
    }
  }
  const auto dev = at::TensorOptions().device(torch::kCUDA);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const auto& c : cases) {
      const std::string name = std::string(c10::toString(dtype)) + " n" + std::to_string(c.n) + " k" +
                               std::to_string(c.k) + (c.ln ? " ln" : "") + (c.bias ? " bias" : "") +
                               (c.gelu ? " gelu" : "") + (c.accumulate ? " accumulate" : "");
      // x: the float32 residual (LayerNorm'd) or a compute-dtype activation.
      const auto x = (at::randn({1, c.k}, dev) * 3 + 0.5).to(c.ln ? at::kFloat : dtype);
      const auto w = (at::randn({c.n, c.k}, dev) / std::sqrt(static_cast<double>(c.k))).to(dtype);
      const auto b = c.bias ? at::randn({c.n}, dev).to(dtype) : at::Tensor();
      const auto g = c.ln ? at::randn({c.k}, dev) : at::Tensor();
      const auto beta = c.ln ? at::randn({c.k}, dev) : at::Tensor();
      const auto out_dtype = c.accumulate ? at::kFloat : dtype;
      const auto start = c.accumulate ? at::randn({1, c.n}, dev) : at::full({1, c.n}, NAN, dev.dtype(out_dtype));
      auto out = start.clone();
      decode_linear(x, w, b, out, g, beta, 1e-5, c.gelu, c.accumulate);
      auto ref = reference(x.cpu(), w.cpu(), c.bias ? b.cpu() : b, c.ln ? g.cpu() : g, c.ln ? beta.cpu() : beta, c,
                           dtype);
      // |W| |h|: the linear part of the reference run on absolute values of W and of h.
      auto h = x.cpu().to(at::kDouble);
      if (c.ln) {
        const auto mean = h.mean();
        h = ((h - mean) / ((h - mean).pow(2).mean() + 1e-5).sqrt() * g.cpu().to(at::kDouble) +
             beta.cpu().to(at::kDouble));
      }
      auto scale = at::matmul(w.cpu().to(at::kDouble).abs(), h.abs().view({-1}));
      if (c.bias) scale = scale + b.cpu().to(at::kDouble).abs();
      if (c.accumulate) {
        ref = ref + start.cpu().to(at::kDouble).view({-1});
        scale = scale + start.cpu().to(at::kDouble).abs().view({-1});
      }
      // float32: summation order only. bf16 / fp16: one rounding step of the output (a float32
      // sum that lands beside a rounding boundary) on some elements.
      const double tol = dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 2e-3 : 1e-2;
      ASSERT_LT(err_vs(out.cpu().view({-1}), ref, scale), tol) << name;
    }
  }
}

// The decode step's folds: with a token the kernel takes row token of a (rows, K) table as x (the
// same output, bit for bit, as that row passed as x), stores the row in float32 into x_store (the
// only write there), and with pos it adds exactly 1 per launch; the table in float32 or in the
// compute dtype, and the LayerNorm'd K = 512 of the model as well as a wide K.
TEST(DecodeLinear, EmbeddingRowAndPositionFolds) {
  if (!torch::cuda::is_available() || !decode_linear_available(torch::kCUDA, 64)) {
    GTEST_SKIP() << "needs a CUDA device, a CUDA build and FLASHCOS_DECODE_LINEAR not 0";
  }
  const auto dev = at::TensorOptions().device(torch::kCUDA);
  const int64_t rows = 37, n = 300;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (auto table_dtype : {at::kFloat, dtype}) {
      for (int64_t k : {512, 1032}) {
        const std::string name = std::string(c10::toString(dtype)) + " table " + c10::toString(table_dtype) +
                                 " k" + std::to_string(k);
        const auto table = (at::randn({rows, k}, dev) * 2 + 0.25).to(table_dtype);
        const auto w = (at::randn({n, k}, dev) / std::sqrt(static_cast<double>(k))).to(dtype);
        const auto b = at::randn({n}, dev).to(dtype);
        const auto g = at::randn({k}, dev), beta = at::randn({k}, dev);
        const auto pos = at::full({1}, 41, dev.dtype(at::kLong));
        for (int64_t tok : {int64_t(0), int64_t(17), rows - 1}) {
          DecodeLinearFolds folds;
          folds.token = at::full({1, 1}, tok, dev.dtype(at::kLong));
          folds.x_store = at::full({1, k}, NAN, dev);
          folds.pos = pos;
          auto out = at::full({1, n}, NAN, dev.dtype(dtype));
          decode_linear(table, w, b, out, g, beta, 1e-5, true, false, folds);
          const auto row = table[tok].view({1, k}).contiguous();
          auto want = at::full({1, n}, NAN, dev.dtype(dtype));
          decode_linear(row, w, b, want, g, beta, 1e-5, true, false);
          EXPECT_TRUE(at::equal(out, want)) << name << " token " << tok;
          EXPECT_TRUE(at::equal(folds.x_store, row.to(at::kFloat))) << name << " token " << tok;
        }
        EXPECT_EQ(pos.item<int64_t>(), 44) << name;  // three launches with pos, one without
      }
    }
  }
}

TEST(DecodeLinear, BadArgumentsAreRefused) {
  if (!torch::cuda::is_available() || !decode_linear_available(torch::kCUDA, 64)) {
    GTEST_SKIP() << "needs a CUDA device, a CUDA build and FLASHCOS_DECODE_LINEAR not 0";
  }
  const auto dev = at::TensorOptions().device(torch::kCUDA);
  const at::Tensor none;
  const auto w = at::randn({16, 64}, dev), x = at::randn({1, 64}, dev), out = at::empty({1, 16}, dev);
  EXPECT_THROW(decode_linear(at::randn({1, 60}, dev), at::randn({16, 60}, dev), none, out, none, none, 1e-5, false,
                             false),
               c10::Error);  // K not a multiple of 8
  EXPECT_THROW(decode_linear(x, at::randn({16, 4096}, dev), none, out, none, none, 1e-5, false, false),
               c10::Error);  // K over the limit
  EXPECT_THROW(decode_linear(x, w, none, at::empty({1, 15}, dev), none, none, 1e-5, false, false), c10::Error);
  EXPECT_THROW(decode_linear(x.to(at::kBFloat16), w, none, out, none, none, 1e-5, false, true),
               c10::Error);  // x in neither float32 nor w's dtype
  EXPECT_THROW(decode_linear(x, w.to(at::kBFloat16), none, out.to(at::kBFloat16), none, none, 1e-5, false, true),
               c10::Error);  // accumulating into a non-float32 out
  const auto sq = at::randn({64, 64}, dev), row = at::randn({1, 64}, dev), g = at::ones({64}, dev);
  EXPECT_THROW(decode_linear(row, sq, none, row, g, g, 1e-5, false, true), c10::Error);  // LN'd x is out
  EXPECT_THROW(decode_linear(row, sq, none, row, none, none, 1e-5, false, true), c10::Error);  // x is out
  const auto out64 = at::empty({1, 64}, dev);
  DecodeLinearFolds folds;
  folds.x_store = at::empty({1, 64}, dev);
  EXPECT_THROW(decode_linear(row, sq, none, out64, none, none, 1e-5, false, false, folds), c10::Error);  // no token
  folds.token = at::zeros({1}, dev.dtype(at::kLong));
  const auto table = at::randn({5, 64}, dev);
  EXPECT_THROW(decode_linear(table, sq, none, folds.x_store, none, none, 1e-5, false, true, folds),
               c10::Error);  // accumulating into x_store
  folds.token = at::zeros({1}, dev.dtype(at::kInt));
  EXPECT_THROW(decode_linear(table, sq, none, out64, none, none, 1e-5, false, false, folds),
               c10::Error);  // token not int64
  DecodeLinearFolds bad_pos;
  bad_pos.pos = at::zeros({2}, dev.dtype(at::kLong));
  EXPECT_THROW(decode_linear(x, w, none, out, none, none, 1e-5, false, false, bad_pos), c10::Error);
}

}  // namespace
