// Fastmax on the CPU (runs in CI): the factorised chunked path and its analytic backward against
// the O(I J) definition in float64, central finite differences of the autograd Function, an
// explicit-loop check of the definition itself, shapes, masking, option validation.
#include <flashcos/fastmax.h>
#include "tests/fastmax_test_util.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using flashcos::FastmaxBackend;
using flashcos::FastmaxOptions;

at::TensorOptions f64() { return at::TensorOptions().dtype(at::kDouble); }

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

using Grads = flashcos::test::FastmaxGrads;
using flashcos::test::fastmax_grads;

FastmaxOptions base_opts(int64_t p, bool causal) {
  FastmaxOptions o;
  o.p(p).causal(causal);
  if (p == 1) o.normalize(true).lim(0.9).a0(1.0).a1(1.0);  // p = 1 needs a bounded s
  return o;
}

// ---- factorised == definition, float64 ------------------------------------------------------

struct MatchCase {
  int64_t p;
  bool causal;
  int64_t I, J;
  int64_t chunk;
};

class FastmaxMatch : public ::testing::TestWithParam<MatchCase> {};

TEST_P(FastmaxMatch, ChunkedEqualsReferenceFp64) {
  const MatchCase c = GetParam();
  at::manual_seed(1000 + c.I * 7 + c.J * 13 + c.p + (c.causal ? 100 : 0) + c.chunk);
  const int64_t B = 2, H = 3, D = 5;
  at::Tensor q = at::randn({B, H, c.I, D}, f64()) * 0.6;
  at::Tensor k = at::randn({B, H, c.J, D}, f64()) * 0.6;
  at::Tensor v = at::randn({B, H, c.J, D}, f64());
  at::Tensor w = at::randn({B, H, c.I, D}, f64());
  FastmaxOptions opt = base_opts(c.p, c.causal).chunk_size(c.chunk).temperature(1.3);
  Grads ref = fastmax_grads(q, k, v, w, FastmaxOptions(opt).backend(FastmaxBackend::kReference));
  Grads got = fastmax_grads(q, k, v, w, FastmaxOptions(opt).backend(FastmaxBackend::kChunked));
  EXPECT_LE(max_abs(got.o, ref.o), 1e-10);
  EXPECT_LE(max_abs(got.dq, ref.dq), 1e-10);
  EXPECT_LE(max_abs(got.dk, ref.dk), 1e-10);
  EXPECT_LE(max_abs(got.dv, ref.dv), 1e-10);
  EXPECT_FALSE(got.o.isnan().any().item<bool>());
}

std::vector<MatchCase> match_cases() {
  std::vector<MatchCase> out;
  const std::vector<std::pair<int64_t, int64_t>> lens = {{1, 1}, {63, 63}, {127, 127}, {17, 40},
                                                        {40, 17}, {1, 63}, {63, 1},  {100, 100}};
  for (int64_t p : {1, 2})
    for (bool causal : {false, true})
      for (auto [i, j] : lens)
        for (int64_t chunk : {16, 256}) out.push_back({p, causal, i, j, chunk});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cpu, FastmaxMatch, ::testing::ValuesIn(match_cases()),
                         [](const ::testing::TestParamInfo<MatchCase>& info) {
                           const MatchCase& c = info.param;
                           return "p" + std::to_string(c.p) + (c.causal ? "_causal" : "_full") + "_i" +
                                  std::to_string(c.I) + "_j" + std::to_string(c.J) + "_chunk" +
                                  std::to_string(c.chunk);
                         });

// ---- the definition itself, against explicit loops -------------------------------------------

TEST(FastmaxCpu, ReferenceMatchesLoops) {
  at::manual_seed(7);
  const int64_t N = 2, I = 6, J = 9, D = 4;
  const double a0 = 0.7, a1 = 1.2, a2 = 0.9, T = 1.5;
  at::Tensor q = at::randn({N, I, D}, f64()), k = at::randn({N, J, D}, f64()), v = at::randn({N, J, D}, f64());
  for (bool causal : {false, true}) {
    at::Tensor o = flashcos::fastmax_reference(
        q, k, v, FastmaxOptions().p(2).a0(a0).a1(a1).a2(a2).temperature(T).causal(causal));
    auto qa = q.accessor<double, 3>(), ka = k.accessor<double, 3>(), va = v.accessor<double, 3>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < I; ++i) {
        std::vector<double> num(D, 0.0);
        double den = 0;
        for (int64_t j = 0; j < J; ++j) {
          if (causal && j > i + (J - I)) continue;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += qa[n][i][d] * ka[n][j][d];
          s /= T;
          const double f = a0 + a1 * s + a2 * s * s;
          den += f;
          for (int64_t d = 0; d < D; ++d) num[d] += f * va[n][j][d];
        }
        for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(o[n][i][d].item<double>(), num[d] / den, 1e-12);
      }
  }
}

// ---- central finite differences of the autograd Function (float64) ---------------------------

struct FdCase {
  int64_t p;
  bool causal, normalize;
  FastmaxBackend backend;
};

class FastmaxFiniteDiff : public ::testing::TestWithParam<FdCase> {};

TEST_P(FastmaxFiniteDiff, GradientsMatchCentralDifferences) {
  const FdCase c = GetParam();
  at::manual_seed(42 + c.p + 2 * c.causal + 4 * c.normalize);
  // Grouped heads (H 4, Hkv 2), I != J, a chunk smaller than the sequence.
  const int64_t B = 1, H = 4, Hkv = 2, I = 5, J = 7, D = 3;
  at::Tensor q = at::randn({B, H, I, D}, f64()) * 0.7;
  at::Tensor k = at::randn({B, Hkv, J, D}, f64()) * 0.7;
  at::Tensor v = at::randn({B, Hkv, J, D}, f64());
  at::Tensor w = at::randn({B, H, I, D}, f64());
  FastmaxOptions opt = FastmaxOptions().p(c.p).causal(c.causal).normalize(c.normalize).chunk_size(3).backend(
      c.backend);
  if (c.normalize) opt.lim(0.8).temperature(0.9).a0(1.0).a1(1.1).a2(0.4);
  else opt.temperature(1.7);
  Grads g = fastmax_grads(q, k, v, w, opt);
  auto loss = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
    return (flashcos::fastmax_attention(qq, kk, vv, opt) * w).sum().item<double>();
  };
  const double h = 1e-6;
  auto check = [&](const at::Tensor& x, const at::Tensor& analytic, int which, const char* name) {
    at::Tensor xf = x.clone().reshape({-1});
    for (int64_t e = 0; e < xf.numel(); ++e) {
      at::Tensor xp = xf.clone(), xm = xf.clone();
      xp[e] += h;
      xm[e] -= h;
      at::Tensor P = xp.view(x.sizes()), M = xm.view(x.sizes());
      const double lp = which == 0 ? loss(P, k, v) : which == 1 ? loss(q, P, v) : loss(q, k, P);
      const double lm = which == 0 ? loss(M, k, v) : which == 1 ? loss(q, M, v) : loss(q, k, M);
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(analytic.reshape({-1})[e].item<double>(), fd, 1e-6 * (1 + std::abs(fd))) << name << "[" << e << "]";
    }
  };
  check(q, g.dq, 0, "dq");
  check(k, g.dk, 1, "dk");
  check(v, g.dv, 2, "dv");
}

std::vector<FdCase> fd_cases() {
  std::vector<FdCase> out;
  for (FastmaxBackend b : {FastmaxBackend::kChunked, FastmaxBackend::kReference})
    for (bool causal : {false, true}) {
      out.push_back({2, causal, false, b});
      out.push_back({2, causal, true, b});
      out.push_back({1, causal, true, b});
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cpu, FastmaxFiniteDiff, ::testing::ValuesIn(fd_cases()),
                         [](const ::testing::TestParamInfo<FdCase>& info) {
                           const FdCase& c = info.param;
                           return flashcos::to_string(c.backend) + "_p" + std::to_string(c.p) +
                                  (c.causal ? "_causal" : "_full") + (c.normalize ? "_norm" : "");
                         });

// ---- shapes, masking, chunking ---------------------------------------------------------------

TEST(FastmaxCpu, ShapesMergedSingleHeadedGrouped) {
  at::manual_seed(3);
  const int64_t B = 2, H = 4, I = 11, J = 13, D = 6;
  at::Tensor q = at::randn({B, H, I, D}, f64()) * 0.5;
  at::Tensor k1 = at::randn({B, J, D}, f64()) * 0.5, v1 = at::randn({B, J, D}, f64());
  for (bool causal : {false, true}) {
    FastmaxOptions opt = FastmaxOptions().causal(causal).chunk_size(4);
    // Single-headed (B, J, D) == every head reading the same k, v.
    at::Tensor single = flashcos::fastmax_attention(q, k1, v1, opt);
    at::Tensor kx = k1.unsqueeze(1).expand({B, H, J, D}), vx = v1.unsqueeze(1).expand({B, H, J, D});
    at::Tensor full = flashcos::fastmax_attention(q, kx, vx, opt);
    EXPECT_EQ(single.sizes(), q.sizes());
    EXPECT_LE(max_abs(single, full), 1e-12);
    // Merged (BH, I, D).
    at::Tensor merged = flashcos::fastmax_attention(q.reshape({B * H, I, D}), kx.reshape({B * H, J, D}),
                                                    vx.reshape({B * H, J, D}), opt);
    EXPECT_EQ(merged.dim(), 3);
    EXPECT_LE(max_abs(merged.view({B, H, I, D}), full), 1e-12);
    // Grouped (B, 2, J, D): heads 0, 1 read kv head 0; heads 2, 3 read kv head 1.
    at::Tensor k2 = at::randn({B, 2, J, D}, f64()) * 0.5, v2 = at::randn({B, 2, J, D}, f64());
    at::Tensor grouped = flashcos::fastmax_attention(q, k2, v2, opt);
    at::Tensor kk = k2.repeat_interleave(2, 1), vv = v2.repeat_interleave(2, 1);
    EXPECT_LE(max_abs(grouped, flashcos::fastmax_reference(q, kk, vv, opt)), 1e-12);
    // Value dim may differ from the q/k head dim.
    at::Tensor v3 = at::randn({B, H, J, 9}, f64());
    at::Tensor o3 = flashcos::fastmax_attention(q, kx, v3, opt);
    EXPECT_EQ(o3.size(-1), 9);
    EXPECT_LE(max_abs(o3, flashcos::fastmax_reference(q, kx, v3, opt)), 1e-12);
  }
}

TEST(FastmaxCpu, RowsWithoutKeysAreZero) {
  // Causal with I > J: query r sees keys 0 .. r + J - I, so the first I - J rows see nothing.
  at::manual_seed(5);
  const int64_t I = 9, J = 4, D = 3;
  at::Tensor q = at::randn({1, 2, I, D}, f64()), k = at::randn({1, 2, J, D}, f64()), v = at::randn({1, 2, J, D}, f64());
  at::Tensor w = at::randn({1, 2, I, D}, f64());
  for (FastmaxBackend b : {FastmaxBackend::kChunked, FastmaxBackend::kReference}) {
    Grads g = fastmax_grads(q, k, v, w, FastmaxOptions().causal(true).chunk_size(2).backend(b));
    EXPECT_EQ(g.o.narrow(2, 0, I - J).abs().max().item<double>(), 0.0) << flashcos::to_string(b);
    EXPECT_EQ(g.dq.narrow(2, 0, I - J).abs().max().item<double>(), 0.0) << flashcos::to_string(b);
    EXPECT_GT(g.o.narrow(2, I - J, J).abs().max().item<double>(), 0.0);
    for (const at::Tensor& t : {g.o, g.dq, g.dk, g.dv}) EXPECT_TRUE(t.isfinite().all().item<bool>());
  }
}

TEST(FastmaxCpu, ChunkSizeDoesNotChangeTheResult) {
  at::manual_seed(11);
  at::Tensor q = at::randn({1, 2, 77, 8}, f64()) * 0.4, k = at::randn({1, 2, 77, 8}, f64()) * 0.4;
  at::Tensor v = at::randn({1, 2, 77, 8}, f64());
  at::Tensor base = flashcos::fastmax_attention(q, k, v, FastmaxOptions().causal(true).chunk_size(1));
  for (int64_t c : {0, 2, 7, 32, 77, 1000})
    EXPECT_LE(max_abs(flashcos::fastmax_attention(q, k, v, FastmaxOptions().causal(true).chunk_size(c)), base), 1e-12)
        << "chunk " << c;
}

TEST(FastmaxCpu, NormalizeUsesOnlyTheTokenItself) {
  // Causal + normalize: changing a future key (and its value) must not change earlier outputs.
  at::manual_seed(13);
  const int64_t L = 20, D = 4, t = 15;
  at::Tensor q = at::randn({1, 1, L, D}, f64()), k = at::randn({1, 1, L, D}, f64()), v = at::randn({1, 1, L, D}, f64());
  FastmaxOptions opt = FastmaxOptions().p(1).normalize(true).lim(0.9).causal(true).chunk_size(8);
  at::Tensor o1 = flashcos::fastmax_attention(q, k, v, opt);
  at::Tensor k2 = k.clone(), q2 = q.clone();
  k2.select(2, t).mul_(50.0);
  q2.select(2, t).mul_(50.0);
  at::Tensor o2 = flashcos::fastmax_attention(q2, k2, v, opt);
  EXPECT_LE(max_abs(o1.narrow(2, 0, t), o2.narrow(2, 0, t)), 1e-13);
  // Per-token: scaling a token's q or k does not change anything at all.
  at::Tensor o3 = flashcos::fastmax_attention(q * 3.0, k * 0.25, v, opt);
  EXPECT_LE(max_abs(o1, o3), 1e-12);
}

TEST(FastmaxCpu, LowPrecisionAgainstFp64) {
  at::manual_seed(17);
  at::Tensor q = at::randn({2, 2, 65, 16}, f64()) * 0.3, k = at::randn({2, 2, 65, 16}, f64()) * 0.3;
  at::Tensor v = at::randn({2, 2, 65, 16}, f64()), w = at::randn({2, 2, 65, 16}, f64());
  for (bool causal : {false, true}) {
    FastmaxOptions opt = FastmaxOptions().causal(causal).chunk_size(16);
    Grads ref = fastmax_grads(q, k, v, w, opt);
    for (at::ScalarType t : {at::kFloat, at::kBFloat16}) {
      Grads plain = fastmax_grads(q.to(t), k.to(t), v.to(t), w, FastmaxOptions(opt).backend(FastmaxBackend::kReference));
      Grads got = fastmax_grads(q.to(t), k.to(t), v.to(t), w, opt);
      EXPECT_EQ(got.o.scalar_type(), t);
      EXPECT_EQ(got.dq.scalar_type(), t);
      const double slack = t == at::kFloat ? 1e-6 : 1e-2;
      EXPECT_LE(max_abs(got.o, ref.o), 2 * max_abs(plain.o, ref.o) + slack);
      EXPECT_LE(max_abs(got.dq, ref.dq), 2 * max_abs(plain.dq, ref.dq) + slack);
      EXPECT_LE(max_abs(got.dk, ref.dk), 2 * max_abs(plain.dk, ref.dk) + slack);
      EXPECT_LE(max_abs(got.dv, ref.dv), 2 * max_abs(plain.dv, ref.dv) + slack);
    }
  }
}

// ---- validation ------------------------------------------------------------------------------

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected a c10::Error containing '" << needle << "'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(FastmaxValidation, Options) {
  using flashcos::check_fastmax_options;
  EXPECT_NO_THROW(check_fastmax_options(FastmaxOptions()));
  expect_error([] { check_fastmax_options(FastmaxOptions().p(3)); }, "p must be 1");
  expect_error([] { check_fastmax_options(FastmaxOptions().p(1)); }, "normalize");
  expect_error([] { check_fastmax_options(FastmaxOptions().p(1).normalize(true).lim(1.0).a0(1).a1(1)); },
               "reaches");  // 1 + s reaches 0 at s = -1
  EXPECT_NO_THROW(check_fastmax_options(FastmaxOptions().p(1).normalize(true).lim(0.9)));
  expect_error([] { check_fastmax_options(FastmaxOptions().a2(-0.1)); }, "reaches");
  expect_error([] { check_fastmax_options(FastmaxOptions().a1(2).a2(0.5)); }, "reaches");  // a1^2 = 4 a0 a2
  EXPECT_NO_THROW(check_fastmax_options(FastmaxOptions().a1(2).a2(0.5).normalize(true).lim(0.5)));
  expect_error([] { check_fastmax_options(FastmaxOptions().temperature(0)); }, "temperature");
  expect_error([] { check_fastmax_options(FastmaxOptions().lim(-1)); }, "lim");
  expect_error([] { check_fastmax_options(FastmaxOptions().chunk_size(-1)); }, "chunk_size");
  EXPECT_NO_THROW(check_fastmax_options(FastmaxOptions().chunk_size(0)));  // automatic
  EXPECT_DOUBLE_EQ(flashcos::fastmax_min_weight(FastmaxOptions()), 0.5);
}

TEST(FastmaxValidation, Tensors) {
  at::Tensor q = at::randn({2, 4, 5, 8}), k = at::randn({2, 4, 6, 8}), v = at::randn({2, 4, 6, 8});
  expect_error([&] { flashcos::fastmax_attention(q, at::randn({2, 3, 6, 8}), at::randn({2, 3, 6, 8})); },
               "multiple of k/v heads");
  expect_error([&] { flashcos::fastmax_attention(q, at::randn({2, 4, 6, 7}), v); }, "same head dim");
  expect_error([&] { flashcos::fastmax_attention(q, k, at::randn({2, 4, 5, 8})); }, "same shape");
  expect_error([&] { flashcos::fastmax_attention(q, k.to(at::kDouble), v); }, "dtype");
  expect_error([&] { flashcos::fastmax_attention(q.view({-1}), k, v); }, "(B, H, I, D)");
  expect_error([&] { flashcos::fastmax_attention(q.view({8, 5, 8}), k, v); }, "merged");
  expect_error([&] { flashcos::fastmax_attention(q, k, v, FastmaxOptions().p(1)); }, "normalize");
  if (flashcos::fastmax_cuda_compiled()) {
    expect_error([&] { flashcos::fastmax_attention(q, k, v, FastmaxOptions().backend(FastmaxBackend::kCuda)); },
                 "CUDA tensors");
  } else {
    expect_error([&] { flashcos::fastmax_attention(q, k, v, FastmaxOptions().backend(FastmaxBackend::kCuda)); },
                 "nvcc");
  }
}

}  // namespace
