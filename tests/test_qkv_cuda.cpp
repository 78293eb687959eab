// Tests of the packed-QKV entry point's CUDA fast path (flashcos::cosine_sim_attention_qkv,
// attention/cosine/qkv.cpp); the CPU suites are in tests/test_qkv.cpp.
//
// GPU (skipped without a CUDA device and the fused kernels; every suite is instantiated as Gpu/...,
// so --gtest_filter='Gpu/QkvAttentionCuda*' selects them, 'Gpu/*' too):
//   Gpu/QkvAttentionCuda       the fast path (Backend::kFused, fp16 / bf16, l2norm on, no mask /
//                                 bias) vs float64, T 1 .. 2049, d 32 / 64 / 128, groups 1 / 2.
//   Gpu/QkvAttentionCudaMisc   determinism, which cases take the fast path and which the
//                                 general one (and that both are right), upstream-gradient layouts,
//                                 k == q with groups > 1 (logits above 0), an in-place op on o.
// Errors are relative Frobenius errors against float64 on the dtype-rounded inputs: f32 1e-5,
// fp16 / bf16 at most 2x the error of the same computation in plain libtorch ops in that dtype
// plus a floor of eps / 4 (as tests/test_attention_cuda.cpp). FLASHCOS_POISON=1 is set: buffers
// the kernels should overwrite start as NaN, and no result may be NaN / inf.
#include <flashcos/attention.h>
#include "tests/attention_test_util.h"
#include "tests/qkv_test_util.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

namespace {

using flashcos::AttentionKind;
using flashcos::AttentionOptions;
using flashcos::Backend;
using namespace flashcos::test;

bool have_gpu() { return torch::cuda::is_available() && flashcos::fused_kernels_compiled(); }

// The build has the Hopper family, the device is compute capability 9.0 and FLASHCOS_HOPPER is not 0.
bool hopper_family_expected() {
#if defined(FLASHCOS_HAS_HOPPER) && defined(FLASHCOS_WITH_CUDA)
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  const char* env = std::getenv("FLASHCOS_HOPPER");
  return prop->major == 9 && prop->minor == 0 && (env == nullptr || env[0] != '0');
#else
  return false;
#endif
}

bool fast_path_ran(const std::string& fn) { return fn.find("QkvAttention") != std::string::npos; }

// ================================ GPU: packed fast path ========================================

struct PackedParam {
  at::ScalarType dtype;
  int64_t D;
  bool causal;
  int64_t groups;
  bool long_seq;  // also T = 2049
};

void PrintTo(const PackedParam& p, std::ostream* os) {
  *os << dtype_name(p.dtype) << " d" << p.D << (p.causal ? " causal" : " full") << " g" << p.groups
      << (p.long_seq ? " +T2049" : "");
}

class QkvAttentionCuda : public ::testing::TestWithParam<PackedParam> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
    setenv("FLASHCOS_POISON", "1", 1);
  }
};

// Backend::kFused, fp16 / bf16, l2norm on, no mask / bias: the fast path runs (its autograd Function
// is o's grad_fn; the Hopper family on compute capability 9.0 for d 64 / 128), and o and the qkv
// gradient are within 2x the error of plain libtorch ops in the same dtype, against float64.
TEST_P(QkvAttentionCuda, FastPathMatchesFloat64Reference) {
  const PackedParam& prm = GetParam();
  const at::ScalarType dt = prm.dtype;
  const int64_t B = 2, H = 2, D = prm.D;
  std::vector<int64_t> lens = {1, 63, 127, 1000};
  if (prm.long_seq) lens.push_back(2049);
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  const double floor = dtype_eps(dt) / 4;
  for (int64_t T : lens) {
    const std::string name = "packed_" + dtype_name(dt) + "_d" + std::to_string(D) +
                             bool_name(prm.causal, "_causal", "_full") + "_g" + std::to_string(prm.groups) + "_t" +
                             std::to_string(T);
    SCOPED_TRACE(name);
    at::manual_seed(int64_t(name_seed(name)));
    const at::Tensor qkv64 = at::randn({B, T, 3 * H * D}, o64).to(dt).to(at::kDouble);
    const at::Tensor dout64 = at::randn({B, T, H * D}, o64).to(dt).to(at::kDouble);
    const auto opts = AttentionOptions().causal(prm.causal).groups(prm.groups);
    const auto plain = AttentionOptions(opts).backend(Backend::kPlain);
    const RunResult ref = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, at::kDouble);
    const RunResult base = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, dt);
    const int64_t hopper_before = flashcos::hopper_kernel_launches();
    const RunResult fast = run_qkv(Via::kQkv, qkv64, H, AttentionOptions(opts).backend(Backend::kFused), dout64, dt);
    const int64_t hopper_runs = flashcos::hopper_kernel_launches() - hopper_before;

    EXPECT_TRUE(fast_path_ran(fast.fn)) << "the fast path did not run (o's grad_fn: " << fast.fn << ")";
    ASSERT_TRUE(fast.dqkv.defined()) << "no gradient reached qkv";
    EXPECT_EQ(fast.dqkv.sizes(), qkv64.sizes());
    EXPECT_EQ(fast.dqkv.scalar_type(), dt);
    if (hopper_family_expected()) {  // every head dim (padded to the d 64 / d 128 tiles)
      EXPECT_GE(hopper_runs, 1) << "the Hopper kernels did not run";
    } else {
      EXPECT_EQ(hopper_runs, 0) << "the Hopper kernels ran where they do not apply";
    }
    // FLASHCOS_POISON=1: o and every part of dqkv start as NaN; all of it must be written.
    EXPECT_TRUE(at::isfinite(fast.o).all().item<bool>()) << "NaN / inf in o";
    EXPECT_TRUE(at::isfinite(fast.dqkv).all().item<bool>()) << "NaN / inf in dqkv";

    const PartErr e = errors_vs(fast, ref, H, 10.0), be = errors_vs(base, ref, H, 10.0);
    const double vanish = T == 1 ? vanishing_grad_tol(dt) : 0.0;
    // T = 1: plain gives o = v exactly; the fused forward divides by the fp32 sum of the unrounded P,
    // o = v (1 + d) with d one rounding of p, then o's own rounding (test_attention_cuda.cpp).
    const double o_floor = T == 1 ? dtype_eps(dt) : floor;
    EXPECT_LE(e.o, 2 * be.o + o_floor) << "o";
    EXPECT_LE(e.dq, std::max(2 * be.dq + floor, vanish)) << "dq";
    EXPECT_LE(e.dk, std::max(2 * be.dk + floor, vanish)) << "dk";
    EXPECT_LE(e.dv, 2 * be.dv + floor) << "dv";
    std::printf("[ errors   ] %-34s packed %.2e %.2e %.2e %.2e | plain %.2e %.2e %.2e %.2e (o dq dk dv)\n",
                name.c_str(), e.o, e.dq, e.dk, e.dv, be.o, be.dq, be.dk, be.dv);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "packed " << e << " | plain " << be;
      return;
    }
  }
}

std::vector<PackedParam> packed_params() {
  std::vector<PackedParam> ps;
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf})
    for (int64_t d : {32, 64, 128})
      for (bool causal : {false, true})
        for (int64_t g : {1, 2}) ps.push_back({dt, d, causal, g, dt == at::kBFloat16 && d == 128 && causal && g == 1});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Gpu, QkvAttentionCuda, ::testing::ValuesIn(packed_params()),
                         [](const ::testing::TestParamInfo<PackedParam>& i) {
                           return dtype_name(i.param.dtype) + "_d" + std::to_string(i.param.D) +
                                  bool_name(i.param.causal, "_causal", "_full") + "_g" +
                                  std::to_string(i.param.groups) + bool_name(i.param.long_seq, "_t2049", "");
                         });

class QkvAttentionCudaMisc : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
    setenv("FLASHCOS_POISON", "1", 1);
  }
};

// Same input twice: a bit-identical forward, with and without autograd.
TEST_P(QkvAttentionCudaMisc, ForwardIsDeterministic) {
  const at::ScalarType dt = GetParam();
  at::manual_seed(71);
  for (int64_t D : {32, 64, 128}) {
    SCOPED_TRACE("d" + std::to_string(D));
    const auto opts = AttentionOptions().causal(true).backend(Backend::kFused);
    const at::Tensor qkv = at::randn({2, 1000, 3 * 2 * D}, at::TensorOptions().dtype(dt).device(at::kCUDA));
    const at::Tensor qkv_g = qkv.detach().clone().requires_grad_(true);
    const at::Tensor a = flashcos::cosine_sim_attention_qkv(qkv_g, 2, opts);
    const at::Tensor b = flashcos::cosine_sim_attention_qkv(qkv_g, 2, opts);
    EXPECT_TRUE(fast_path_ran(grad_fn_name(a))) << grad_fn_name(a);
    const at::Tensor c = flashcos::cosine_sim_attention_qkv(qkv, 2, opts);  // no grad needed
    at::Tensor d;
    {
      at::NoGradGuard no_grad;
      d = flashcos::cosine_sim_attention_qkv(qkv_g, 2, opts);
    }
    EXPECT_TRUE(at::equal(a, b)) << "two runs differ";
    EXPECT_TRUE(at::equal(a, c)) << "qkv without requires_grad differs";
    EXPECT_TRUE(at::equal(a, d)) << "under NoGradGuard differs";
    EXPECT_TRUE(at::isfinite(a).all().item<bool>());
  }
}

// Which cases take the fast path and which the general one, and every one of them right: the
// packed result vs float64 (plain ops on the views) within 2x the plain-ops error in the dtype.
TEST_P(QkvAttentionCudaMisc, FastAndGeneralPathCases) {
  const at::ScalarType dt = GetParam();
  const int64_t B = 2, T = 127, H = 2;
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  struct PathCase {
    std::string name;
    int64_t D;
    AttentionOptions opts;
    bool fast;                  // expected to take the fast path
    int64_t offset = 0;         // qkv this many elements into a wider buffer
    bool transposed = false;    // qkv a (T, B, 3 H D) tensor transposed
    bool small_qk = false;      // q, k scaled by 1 / sqrt(D) (no l2norm)
    bool f32 = false;           // run in float32 instead of the 16-bit dtype
  };
  at::manual_seed(72);
  at::Tensor mask = at::rand({B, T}, o64) < 0.8;
  mask.index_put_({0, at::indexing::Slice(0, 3)}, false);  // causal rows 0..2 of batch 0 see nothing
  const at::Tensor bias = at::randn({H, T, T}, o64) * 0.5;
  const auto fused = AttentionOptions().backend(Backend::kFused);
  std::vector<PathCase> cases = {
      {"mask_causal", 64, AttentionOptions(fused).mask(mask).causal(true), false},
      {"bias_head", 64, AttentionOptions(fused).attn_bias(bias), false},
      {"mask_bias_d32", 32, AttentionOptions(fused).mask(mask).attn_bias(bias), false},
      {"mask_d128_groups2", 128, AttentionOptions(fused).mask(mask).groups(2), false},
      {"no_l2norm", 64, AttentionOptions(fused).l2norm_qk(false).scale(2.0), false, 0, false, true},
      {"exp_kind", 64, AttentionOptions(fused).kind(AttentionKind::kExp).scale(1.0), false, 0, false, true},
      {"d96_groups1_l2norm_unsupported", 96, fused, false},
      {"d80_groups1_l2norm_unsupported", 80, AttentionOptions(fused).causal(true), false},
      {"misaligned_qkv", 64, AttentionOptions(fused).causal(true), false, 4},
      {"tiled_backend_f32", 64, AttentionOptions().backend(Backend::kTiled).tile_size(32), false, 0, false, false, true},
      {"float32_fused", 64, AttentionOptions(fused).causal(true), false, 0, false, false, true},
      {"d96_groups3", 96, AttentionOptions(fused).groups(3), true},
      {"d80_groups5", 80, AttentionOptions(fused).groups(5).causal(true), true},
      {"d16", 16, AttentionOptions(fused).causal(true), true},
      {"d64_groups4", 64, AttentionOptions(fused).groups(4), true},
      {"d64_groups8", 64, AttentionOptions(fused).groups(8).causal(true), true},
      {"d128_scale_25_causal", 128, AttentionOptions(fused).scale(25.0).causal(true), true},
      {"auto_backend", 64, AttentionOptions().causal(true), true},
      {"transposed_qkv", 64, AttentionOptions(fused).causal(true), true, 0, true},
  };
  const ::testing::TestResult* result = ::testing::UnitTest::GetInstance()->current_test_info()->result();
  for (const PathCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int failures_before = result->total_part_count();
    const at::ScalarType run_dt = c.f32 ? at::kFloat : dt;
    at::Tensor qkv64 = c.transposed ? at::randn({T, B, 3 * H * c.D}, o64).transpose(0, 1)
                                    : at::randn({B, T, 3 * H * c.D}, o64);
    if (c.small_qk) qkv64.narrow(-1, 0, 2 * H * c.D).mul_(1.0 / std::sqrt(double(c.D)));
    qkv64 = rounded_to(qkv64, run_dt);
    const at::Tensor dout64 = at::randn({B, T, H * c.D}, o64).to(run_dt).to(at::kDouble);
    const auto plain = AttentionOptions(c.opts).backend(Backend::kPlain);
    const RunResult ref = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, at::kDouble);
    const RunResult run = run_qkv(Via::kQkv, qkv64, H, c.opts, dout64, run_dt, c.offset);
    EXPECT_EQ(fast_path_ran(run.fn), c.fast) << "o's grad_fn: " << run.fn;
    ASSERT_TRUE(run.dqkv.defined()) << "no gradient reached qkv";
    EXPECT_TRUE(at::isfinite(run.o).all().item<bool>()) << "NaN / inf in o";
    EXPECT_TRUE(at::isfinite(run.dqkv).all().item<bool>()) << "NaN / inf in dqkv";
    const PartErr e = errors_vs(run, ref, H, c.opts.scale());
    PartErr tol{1e-5, 1e-5, 1e-5, 1e-5};
    PartErr be;
    if (!c.f32) {
      be = errors_vs(run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, run_dt), ref, H, c.opts.scale());
      const double floor = dtype_eps(run_dt) / 4;
      tol = {2 * be.o + floor, 2 * be.dq + floor, 2 * be.dk + floor, 2 * be.dv + floor};
    }
    EXPECT_LE(e.o, tol.o) << "o";
    EXPECT_LE(e.dq, tol.dq) << "dq";
    EXPECT_LE(e.dk, tol.dk) << "dk";
    EXPECT_LE(e.dv, tol.dv) << "dv";
    if (result->total_part_count() != failures_before) ADD_FAILURE() << c.name << ": packed " << e << " | plain " << be;
  }
}

// The upstream gradient as autograd may hand it over: expanded (o.sum()) or with a strided last
// dim; the fast path's qkv gradient still matches float64.
TEST_P(QkvAttentionCudaMisc, UpstreamGradientLayouts) {
  const at::ScalarType dt = GetParam();
  const int64_t B = 2, T = 127, H = 2, D = 64;
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  at::manual_seed(73);
  const at::Tensor qkv64 = at::randn({B, T, 3 * H * D}, o64).to(dt).to(at::kDouble);
  const auto opts = AttentionOptions().causal(true).backend(Backend::kFused);
  const auto plain = AttentionOptions(opts).backend(Backend::kPlain);
  const at::Tensor strided = at::randn({B, H * D, T}, o64).to(dt).to(at::kDouble).transpose(1, 2);
  for (const at::Tensor& dout : {at::Tensor(), strided}) {
    SCOPED_TRACE(dout.defined() ? "dout with a strided last dim" : "o.sum()");
    const RunResult ref = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout, at::kDouble);
    const RunResult base = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout, dt);
    const RunResult fast = run_qkv(Via::kQkv, qkv64, H, opts, dout, dt);
    EXPECT_TRUE(fast_path_ran(fast.fn)) << fast.fn;
    ASSERT_TRUE(fast.dqkv.defined());
    const PartErr e = errors_vs(fast, ref, H, 10.0), be = errors_vs(base, ref, H, 10.0);
    const double floor = dtype_eps(dt) / 4;
    EXPECT_LE(e.dq, 2 * be.dq + floor) << e << " | plain " << be;
    EXPECT_LE(e.dk, 2 * be.dk + floor) << e << " | plain " << be;
    EXPECT_LE(e.dv, 2 * be.dv + floor) << e << " | plain " << be;
    EXPECT_TRUE(at::isfinite(fast.dqkv).all().item<bool>());
  }
}

// k equal to q: every per-group cosine on the diagonal is 1, so q.k = groups there and the logit
// scale (q.k - 1) reaches scale (groups - 1) > 0 (with one group the logits stay <= 0). The fast
// path and the general path through the fused kernels must stay finite and right.
TEST_P(QkvAttentionCudaMisc, KeysEqualToQueriesWithGroups) {
  const at::ScalarType dt = GetParam();
  const int64_t B = 2, T = 63, H = 2, D = 64;
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  const double floor = dtype_eps(dt) / 4;
  for (int64_t groups : {1, 2, 4}) {
    SCOPED_TRACE("groups " + std::to_string(groups));
    at::manual_seed(74 + groups);
    at::Tensor qkv64 = at::randn({B, T, 3 * H * D}, o64).to(dt).to(at::kDouble);
    qkv64.view({B, T, 3, H, D}).select(2, 1).copy_(qkv64.view({B, T, 3, H, D}).select(2, 0));
    const at::Tensor dout64 = at::randn({B, T, H * D}, o64).to(dt).to(at::kDouble);
    const auto opts = AttentionOptions().causal(true).groups(groups);
    const auto plain = AttentionOptions(opts).backend(Backend::kPlain);
    const auto fused = AttentionOptions(opts).backend(Backend::kFused);
    const RunResult ref = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, at::kDouble);
    const PartErr be = errors_vs(run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, dt), ref, H, 10.0);
    for (Via via : {Via::kQkv, Via::kViewsApi}) {
      SCOPED_TRACE(via == Via::kQkv ? "packed (fast path)" : "views through cosine_sim_attention (fused)");
      const RunResult run = run_qkv(via, qkv64, H, fused, dout64, dt);
      EXPECT_EQ(fast_path_ran(run.fn), via == Via::kQkv) << run.fn;
      EXPECT_TRUE(at::isfinite(run.o).all().item<bool>()) << "NaN / inf in o";
      ASSERT_TRUE(run.dqkv.defined());
      EXPECT_TRUE(at::isfinite(run.dqkv).all().item<bool>()) << "NaN / inf in dqkv";
      const PartErr e = errors_vs(run, ref, H, 10.0);
      EXPECT_LE(e.o, 2 * be.o + floor) << e << " | plain " << be;
      EXPECT_LE(e.dq, 2 * be.dq + floor) << e << " | plain " << be;
      EXPECT_LE(e.dk, 2 * be.dk + floor) << e << " | plain " << be;
      EXPECT_LE(e.dv, 2 * be.dv + floor) << e << " | plain " << be;
    }
  }
}

// The result behaves as the general path's (a plain tensor): an in-place op on it before the
// backward is allowed and the qkv gradient accounts for it.
TEST_P(QkvAttentionCudaMisc, InPlaceOpOnTheOutput) {
  // The fast path saves its output for the backward (as libtorch ops that save their result do):
  // an in-place op on it is allowed, and a backward through the modified result is refused with
  // libtorch's version-counter error; without grad, in-place ops just work.
  const at::ScalarType dt = GetParam();
  const int64_t B = 2, T = 127, H = 2, D = 64;
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  at::manual_seed(75);
  const at::Tensor qkv64 = at::randn({B, T, 3 * H * D}, o64).to(dt).to(at::kDouble);
  const at::Tensor qkv = leaf(qkv64, dt);
  const at::Tensor o = flashcos::cosine_sim_attention_qkv(qkv, H, AttentionOptions().backend(Backend::kFused));
  EXPECT_TRUE(fast_path_ran(grad_fn_name(o))) << grad_fn_name(o);
  const at::Tensor o_before = o.detach().clone();
  o.mul_(2.0);
  EXPECT_TRUE(at::equal(o.detach(), o_before * 2));
  try {
    o.sum().backward();
    ADD_FAILURE() << "a backward through the in-place modified output did not throw";
  } catch (const c10::Error& err) {
    EXPECT_NE(std::string(err.what_without_backtrace()).find("inplace operation"), std::string::npos)
        << err.what_without_backtrace();
  }
  {
    at::NoGradGuard no_grad;
    const at::Tensor o2 = flashcos::cosine_sim_attention_qkv(qkv, H, AttentionOptions().backend(Backend::kFused));
    o2.mul_(2.0);
    EXPECT_TRUE(at::equal(o2, o_before * 2));
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, QkvAttentionCudaMisc, ::testing::Values(at::kBFloat16, at::kHalf),
                         [](const ::testing::TestParamInfo<at::ScalarType>& i) { return dtype_name(i.param); });

}  // namespace
