// The deterministic mode's dQ grid (attention/cosine/dq_grid.h), on the CPU (runs in CI): the rows'
// units bound dq as the Hopper kernel needs (every partial sum below 2^(u + 22)) without wasting its
// precision, addends rounded to a row's grid sum to the same float32 in any order (and do not
// without the rounding), and a row whose bound is not finite gets a constant that makes its dq NaN.
// On a GPU (skipped without one): the constants of the grid kernels the Hopper backward runs
// equal these. The deterministic backward itself: test_deterministic_cuda.cpp.
#include <flashcos/attention.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <limits>

#include "attention/cosine/dq_grid.h"

namespace {

using flashcos::detail::dq_grid_constants;
using flashcos::detail::dq_grid_constants_cuda;

// 2^u from c = 1.5 * 2^(u + 23).
at::Tensor unit_of(const at::Tensor& c) { return c.to(at::kDouble) / (1.5 * std::ldexp(1.0, 23)); }

struct Inputs {
  at::Tensor q, k, v, dout;
};

// Random inputs of the attention's shapes, float64; q and k l2-normalised as the cosine-sim layer
// feeds them to the kernels (or not: the bound takes k's largest element as it is).
Inputs make_inputs(int64_t B, int64_t H, int64_t Hkv, int64_t I, int64_t J, int64_t D, bool normalise, uint64_t seed) {
  at::manual_seed(seed);
  Inputs x{at::randn({B, H, I, D}, at::kDouble), at::randn({B, Hkv, J, D}, at::kDouble),
           3 * at::randn({B, Hkv, J, D}, at::kDouble), at::randn({B, H, I, D}, at::kDouble)};
  if (normalise) {
    x.q = x.q / x.q.norm(2, -1, true);
    x.k = x.k / x.k.norm(2, -1, true);
  }
  return x;
}

// Each row's largest |dq_id| of the plain (float64) attention, in units of its grid.
at::Tensor dq_in_units(const Inputs& x, double scale, bool causal) {
  at::Tensor q = x.q.clone().requires_grad_(true);
  const auto o =
      flashcos::AttentionOptions().scale(scale).causal(causal).l2norm_qk(false).backend(flashcos::Backend::kPlain);
  at::Tensor k = x.k.clone(), v = x.v.clone();
  if (x.q.size(1) != x.k.size(1)) {  // grouped heads: each kv head serves H / Hkv query heads
    k = k.repeat_interleave(x.q.size(1) / x.k.size(1), 1);
    v = v.repeat_interleave(x.q.size(1) / x.k.size(1), 1);
  }
  (flashcos::cosine_sim_attention(q, k, v, o) * x.dout).sum().backward();
  return q.grad().abs().amax(-1) / unit_of(dq_grid_constants(x.dout, x.k, x.v, scale));  // (B, H, I)
}

TEST(DqGrid, UnitsBoundDqAndKeepItsPrecision) {
  struct Case {
    int64_t B, H, Hkv, I, J, D;
    bool normalise;
    double scale;
  };
  const Case cases[] = {{2, 2, 2, 63, 127, 64, true, 10.0},  {1, 4, 2, 1, 1000, 32, true, 10.0},
                        {1, 2, 1, 127, 63, 16, false, 0.7}, {2, 1, 1, 200, 200, 64, true, 25.0},
                        {1, 2, 2, 300, 300, 8, true, 10.0}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    for (bool causal : {false, true}) {
      const Inputs x = make_inputs(c.B, c.H, c.Hkv, c.I, c.J, c.D, c.normalise, ++seed);
      const at::Tensor units = dq_in_units(x, c.scale, causal);
      // The kernel's partial sums stay below 2^22 units; the whole sum is one of them.
      EXPECT_LE(units.max().item<double>(), std::ldexp(1.0, 22)) << "I " << c.I << " J " << c.J << " causal " << causal;
      // Most rows keep at least 2^10 units of their largest element: the bound is not wastefully
      // loose. (Rows with no key, or causal rows with one, have dq = 0.)
      const at::Tensor flat = units.flatten();
      const double median = flat.index({flat > 0}).median().item<double>();
      EXPECT_GE(median, std::ldexp(1.0, 10)) << "I " << c.I << " J " << c.J << " causal " << causal;
    }
  }
}

TEST(DqGrid, ConstantsArePowersOfTwoAndFollowTheirRow) {
  const Inputs x = make_inputs(1, 4, 2, 50, 70, 32, true, 3);
  const at::Tensor c = dq_grid_constants(x.dout, x.k, x.v, 10.0);
  ASSERT_EQ(c.sizes(), (at::IntArrayRef{1, 4, 50}));
  EXPECT_EQ(c.scalar_type(), at::kFloat);
  const at::Tensor e = at::log2(unit_of(c));
  EXPECT_TRUE(at::equal(e, at::round(e)));
  // Four times one row of dout: four times that row's unit only (its bound is 4x).
  at::Tensor d2 = x.dout.clone();
  d2[0][3][7].mul_(4);
  at::Tensor c2 = dq_grid_constants(d2, x.k, x.v, 10.0);
  EXPECT_EQ(c2[0][3][7].item<float>(), 4 * c[0][3][7].item<float>());
  c2[0][3][7] = c[0][3][7];
  EXPECT_TRUE(at::equal(c, c2));
  // A zero row still gets a finite constant; a row with a NaN or an infinity, a non-finite one.
  d2[0][0][0].zero_();
  d2[0][1][1][5] = std::numeric_limits<double>::quiet_NaN();
  d2[0][2][2][0] = std::numeric_limits<double>::infinity();
  const at::Tensor c3 = dq_grid_constants(d2, x.k, x.v, 10.0);
  EXPECT_TRUE(std::isfinite(c3[0][0][0].item<float>()));
  EXPECT_FALSE(std::isfinite(c3[0][1][1].item<float>()));
  EXPECT_FALSE(std::isfinite(c3[0][2][2].item<float>()));
  EXPECT_THROW(dq_grid_constants(at::zeros({1, 3, 4, 8}), at::zeros({1, 2, 4, 8}), at::zeros({1, 2, 4, 8}), 1.0),
               c10::Error);
}

// The kernel's adds: 128 key blocks' addends per element, each below 2^(u + 22) / 128 so that every
// partial sum is below 2^(u + 22), added in float32 in two orders.
TEST(DqGrid, RoundedAddendsSumToTheSameFloatInAnyOrder) {
  at::manual_seed(21);
  const int n = 128;
  const at::Tensor u = at::exp2(at::randint(-30, 30, {64}, at::kFloat));  // 64 rows' units
  const at::Tensor c = 1.5f * u * float(std::ldexp(1.0, 23));
  const at::Tensor addends = (at::rand({n, 64, 16}) * 2 - 1) * (u * float(std::ldexp(1.0, 22) / n)).unsqueeze(-1);
  auto sum = [&](bool rounded, bool reversed) {
    at::Tensor s = at::zeros({64, 16}, at::kFloat);
    for (int j = 0; j < n; ++j) {
      at::Tensor x = addends[reversed ? n - 1 - j : j];
      if (rounded) x = (x + c.unsqueeze(-1)) - c.unsqueeze(-1);  // two float32 ops, not fused
      s += x;
    }
    return s;
  };
  EXPECT_TRUE(at::equal(sum(true, false), sum(true, true)));
  EXPECT_FALSE(at::equal(sum(false, false), sum(false, true)));  // plain float32 sums are not
  // The rounded sum is the exact sum of the rounded addends, within n / 2 units of the unrounded one.
  const at::Tensor exact = addends.to(at::kDouble).sum(0);
  EXPECT_LE(((sum(true, false).to(at::kDouble) - exact).abs() / u.to(at::kDouble).unsqueeze(-1)).max().item<double>(),
            n / 2.0);
}

// The kernels against the libtorch constants on the same 16-bit inputs: equal, but where the bound
// sits within float32 rounding of a power of 2 (the sums run in another order), where they may
// differ by a factor of 2. Odd sizes, grouped heads, strided (non-contiguous) inputs, and rows with
// a NaN or an infinity.
TEST(DqGridCuda, KernelsGiveTheLibtorchConstants) {
  if (!torch::cuda::is_available() || !flashcos::fused_kernels_compiled()) GTEST_SKIP() << "needs a CUDA device";
  struct Case {
    at::ScalarType dtype;
    int64_t B, H, Hkv, I, J, D;
  };
  const Case cases[] = {{at::kBFloat16, 2, 4, 2, 1000, 127, 64}, {at::kHalf, 1, 2, 2, 1, 1, 16},
                        {at::kBFloat16, 1, 3, 1, 63, 1000, 128}, {at::kHalf, 3, 2, 2, 127, 63, 96}};
  uint64_t seed = 40;
  for (const Case& c : cases) {
    at::manual_seed(++seed);
    const auto opts = at::TensorOptions().dtype(c.dtype).device(at::kCUDA);
    at::Tensor dout = at::randn({c.B, c.I, c.H, c.D}, opts).transpose(1, 2);  // (B, H, I, D), strided
    const at::Tensor k = at::randn({c.B, c.Hkv, c.J, c.D}, opts), v = 3 * at::randn({c.B, c.Hkv, c.J, c.D}, opts);
    const at::Tensor got = dq_grid_constants_cuda(dout, k, v, 10.0).cpu(), want = dq_grid_constants(dout, k, v, 10.0).cpu();
    ASSERT_EQ(got.sizes(), want.sizes());
    const at::Tensor ratio = got / want;
    EXPECT_TRUE(((ratio == 1) | (ratio == 2) | (ratio == 0.5)).all().item<bool>()) << c.I << " x " << c.D;
    EXPECT_GE((ratio == 1).to(at::kDouble).mean().item<double>(), 0.99) << c.I << " x " << c.D;
  }
  // Non-finite inputs: a NaN in one row of dout, an infinity in one head's v.
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor dout = at::randn({1, 2, 50, 64}, opts), k = at::randn({1, 2, 70, 64}, opts), v = at::randn({1, 2, 70, 64}, opts);
  dout[0][0][3][9] = std::numeric_limits<float>::quiet_NaN();
  v[0][1][69][0] = std::numeric_limits<float>::infinity();
  const at::Tensor got = dq_grid_constants_cuda(dout, k, v, 10.0).cpu();
  EXPECT_TRUE(std::isnan(got[0][0][3].item<float>()));
  EXPECT_TRUE(got[0][1].isnan().all().item<bool>());
  EXPECT_EQ(got[0][0].isfinite().sum().item<int64_t>(), 49);
}

}  // namespace
