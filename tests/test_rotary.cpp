// Rotary positions on the CPU (flashcos/rotary.h, the libtorch-op path): against float64 loops,
// the gradient is R^T, the rotation keeps norms, the attention with rotary depends on relative
// positions only (shift invariance), decode rows (I < J, position_offset) equal the full
// attention's rows, and the plain and tiled backends agree.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <flashcos/attention.h>

#include "tests/attention_test_util.h"
#include "tests/rotary_test_util.h"

namespace {

using flashcos::AttentionOptions;
using flashcos::Backend;
using flashcos::test::l2norm64;
using flashcos::test::rel_err;
using flashcos::test::rotary_loop;

struct Case {
  int64_t T, D, groups, offset;
  at::ScalarType dtype;
};

// |x_g| of every group of the last dim, float64.
at::Tensor group_norms(const at::Tensor& x, int64_t groups) {
  auto sizes = x.sizes().vec();
  sizes.back() = groups;
  sizes.push_back(x.size(-1) / groups);
  return x.detach().to(at::kDouble).reshape(sizes).norm(2, -1);
}

class RotaryCpu : public ::testing::TestWithParam<Case> {};

TEST_P(RotaryCpu, ForwardAndGradientMatchFloat64Loops) {
  const Case c = GetParam();
  torch::manual_seed(1000 + c.T * 7 + c.groups + c.offset);
  const auto x = torch::randn({2, 3, c.T, c.D}, torch::dtype(c.dtype)).requires_grad_(true);
  const auto y = flashcos::rotary(x, c.groups, 10000.0, c.offset);
  ASSERT_EQ(y.scalar_type(), c.dtype);
  ASSERT_EQ(y.sizes(), x.sizes());
  const double tol = c.dtype == at::kDouble ? 1e-12 : 2e-6;
  const auto y_ref = rotary_loop(x, c.groups, 10000.0, c.offset);
  EXPECT_LT(rel_err(y, y_ref), tol);
  // A rotation: the norm of every group is kept.
  EXPECT_LT(rel_err(group_norms(y, c.groups), group_norms(x, c.groups)), tol);
  const auto dy = torch::randn_like(y);
  y.backward(dy);
  EXPECT_LT(rel_err(x.grad(), rotary_loop(dy, c.groups, 10000.0, c.offset, /*transpose=*/true)), tol);
}

TEST_P(RotaryCpu, L2NormRotaryIsTheComposition) {
  const Case c = GetParam();
  torch::manual_seed(2000 + c.T + c.groups);
  const auto x = torch::randn({2, c.T, c.D}, torch::dtype(c.dtype));
  const auto y = flashcos::l2norm_rotary(x, c.groups, 500.0, c.offset);
  const auto ref = rotary_loop(l2norm64(x, c.groups), c.groups, 500.0, c.offset);
  EXPECT_LT(rel_err(y, ref), c.dtype == at::kDouble ? 1e-12 : 2e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RotaryCpu,
                         ::testing::Values(Case{1, 16, 1, 0, at::kFloat}, Case{63, 64, 1, 0, at::kFloat},
                                           Case{127, 64, 2, 5, at::kDouble}, Case{1, 64, 4, 4097, at::kFloat},
                                           Case{33, 32, 4, 1000, at::kDouble}, Case{1000, 16, 2, 3, at::kFloat}));

TEST(RotaryCpuErrors, RejectsOddGroupsBadBaseAndNegativeOffsets) {
  const auto x = torch::randn({4, 12});
  EXPECT_THROW(flashcos::rotary(x, 4, 10000.0, 0), c10::Error);  // group size 3 is odd
  EXPECT_THROW(flashcos::rotary(x, 5, 10000.0, 0), c10::Error);  // 5 does not divide 12
  EXPECT_THROW(flashcos::rotary(x, 1, -2.0, 0), c10::Error);
  EXPECT_THROW(flashcos::rotary(x, 1, 10000.0, -1), c10::Error);
  EXPECT_THROW(flashcos::rotary(torch::randn({12}), 1, 10000.0, 0), c10::Error);
}

AttentionOptions rope_options(int64_t groups, int64_t offset, Backend backend) {
  return AttentionOptions().causal(true).scale(8.0).groups(groups).rotary(true).rotary_base(10000.0)
      .position_offset(offset).backend(backend);
}

// Adding the same offset to every position leaves the attention unchanged (only i - j enters);
// positions are exact and angles rounded to float32, so at offsets up to ~5000 the outputs agree
// to ~1e-5 relative (a wrong rotation of q vs k would be off by O(1)).
TEST(RotaryAttentionCpu, ShiftInvariance) {
  torch::manual_seed(7);
  for (int64_t groups : {1, 2, 4}) {
    const auto q = torch::randn({2, 3, 45, 32}, torch::kDouble), k = torch::randn({2, 3, 45, 32}, torch::kDouble);
    const auto v = torch::randn({2, 3, 45, 32}, torch::kDouble);
    const auto o0 = flashcos::plain_cosine_sim_attention(q, k, v, rope_options(groups, 0, Backend::kPlain));
    for (int64_t offset : {1, 17, 5000}) {
      const auto o1 = flashcos::plain_cosine_sim_attention(q, k, v, rope_options(groups, offset, Backend::kPlain));
      EXPECT_LT(rel_err(o1, o0), offset > 100 ? 1e-4 : 1e-6) << "groups " << groups << " offset " << offset;
    }
    // And the positions do matter: without the rotation the output differs.
    const auto plain = flashcos::plain_cosine_sim_attention(q, k, v, rope_options(groups, 0, Backend::kPlain).rotary(false));
    EXPECT_GT(rel_err(plain, o0), 1e-2);
  }
}

// The attention with rotary against a float64 reference built from the loops: q, k normalised and
// rotated, then the plain cosine-sim attention with l2norm off.
TEST(RotaryAttentionCpu, MatchesReferenceAndBackendsAgree) {
  torch::manual_seed(11);
  const auto q = torch::randn({1, 2, 63, 64}, torch::kDouble), k = torch::randn({1, 2, 63, 64}, torch::kDouble);
  const auto v = torch::randn({1, 2, 63, 64}, torch::kDouble);
  for (int64_t groups : {1, 2}) {
    const auto qr = rotary_loop(l2norm64(q, groups), groups, 10000.0, 3);
    const auto kr = rotary_loop(l2norm64(k, groups), groups, 10000.0, 3);
    const auto ref = flashcos::plain_cosine_sim_attention(
        qr, kr, v, AttentionOptions().causal(true).scale(8.0).groups(groups).l2norm_qk(false));
    const auto plain = flashcos::plain_cosine_sim_attention(q, k, v, rope_options(groups, 3, Backend::kPlain));
    EXPECT_LT(rel_err(plain, ref), 1e-12);
    for (auto dtype : {at::kDouble, at::kFloat}) {
      auto opts = rope_options(groups, 3, Backend::kTiled).tile_size(16);
      const auto tiled = flashcos::cosine_sim_attention(q.to(dtype), k.to(dtype), v.to(dtype), opts);
      EXPECT_LT(rel_err(tiled, ref), dtype == at::kDouble ? 1e-10 : 1e-5) << "groups " << groups;
    }
  }
}

// Decode: the last I query rows against all J keys (position_offset = the keys' start) equal the
// last I rows of the full causal attention.
TEST(RotaryAttentionCpu, DecodeRowsEqualFullAttentionRows) {
  torch::manual_seed(13);
  const int64_t T = 37;
  const auto q = torch::randn({1, 2, T, 32}, torch::kDouble), k = torch::randn({1, 2, T, 32}, torch::kDouble);
  const auto v = torch::randn({1, 2, T, 32}, torch::kDouble);
  const auto full = flashcos::plain_cosine_sim_attention(q, k, v, rope_options(2, 0, Backend::kPlain));
  for (int64_t I : {1, 5}) {
    const auto qi = q.narrow(2, T - I, I);
    const auto rows = flashcos::cosine_sim_attention(qi, k, v, rope_options(2, 0, Backend::kTiled).tile_size(8));
    EXPECT_LT(rel_err(rows, full.narrow(2, T - I, I)), 1e-10) << "I = " << I;
  }
  // A window of the last 20 keys at their own positions: the same as the full attention's last row
  // restricted to those keys (computed by the reference at offset T - 20).
  const int64_t W = 20;
  const auto row = flashcos::plain_cosine_sim_attention(q.narrow(2, T - 1, 1), k.narrow(2, T - W, W), v.narrow(2, T - W, W),
                                                        rope_options(2, T - W, Backend::kPlain));
  const auto ref = flashcos::plain_cosine_sim_attention(q.narrow(2, T - W, W), k.narrow(2, T - W, W),
                                                        v.narrow(2, T - W, W), rope_options(2, 0, Backend::kPlain));
  EXPECT_LT(rel_err(row, ref.narrow(2, W - 1, 1)), 1e-6);
}

}  // namespace
