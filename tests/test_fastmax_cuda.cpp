// Fastmax on the GPU (skips without CUDA): forward and every gradient of the CUDA backend against
// a float64 reference, bounded by twice the error of the plain O(I J) definition run in the same
// dtype (flash-attention's criterion) plus one ulp of the output scale. Also an opt-in timing
// report (FLASHCOS_FASTMAX_TIMING=1), which asserts nothing.
#include <flashcos/fastmax.h>
#include "tests/fastmax_test_util.h"
#include "attention/fastmax/fastmax_impl.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <c10/core/GradMode.h>

#ifdef FLASHCOS_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

using flashcos::FastmaxBackend;
using flashcos::FastmaxOptions;

bool have_gpu() { return torch::cuda::is_available() && flashcos::fastmax_cuda_compiled(); }

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

double ulp(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return 7.8125e-3;
    case at::kHalf: return 9.765625e-4;
    default: return 1.1920929e-7;
  }
}

using Grads = flashcos::test::FastmaxGrads;
using flashcos::test::fastmax_grads;

struct CudaCase {
  at::ScalarType dtype;
  int64_t d, p;
  bool causal;
  int64_t I, J;
};

class FastmaxCuda : public ::testing::TestWithParam<CudaCase> {};

TEST_P(FastmaxCuda, ForwardAndGradsVsFp64) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and a build with the CUDA kernels";
  const CudaCase c = GetParam();
  at::manual_seed(c.d * 31 + c.p * 7 + c.causal + c.I);
  const auto dev = at::TensorOptions().device(at::kCUDA).dtype(at::kDouble);
  // Grouped heads (4 query heads on 2 kv heads); s = q.k of order 1.
  const int64_t B = 2, H = 4, Hkv = 2;
  const double qk_scale = std::pow(double(c.d), -0.25);
  at::Tensor q = at::randn({B, H, c.I, c.d}, dev) * qk_scale;
  at::Tensor k = at::randn({B, Hkv, c.J, c.d}, dev) * qk_scale;
  at::Tensor v = at::randn({B, Hkv, c.J, c.d}, dev);
  at::Tensor w = at::randn({B, H, c.I, c.d}, dev);
  FastmaxOptions opt = FastmaxOptions().p(c.p).causal(c.causal).chunk_size(64);
  if (c.p == 1) opt.normalize(true).lim(0.9);
  // Round the inputs to the dtype once, so every implementation sees the same numbers.
  at::Tensor qt = q.to(c.dtype), kt = k.to(c.dtype), vt = v.to(c.dtype);
  Grads ref = fastmax_grads(qt.to(at::kDouble), kt.to(at::kDouble), vt.to(at::kDouble), w,
                  FastmaxOptions(opt).backend(FastmaxBackend::kReference));
  Grads plain = fastmax_grads(qt, kt, vt, w, FastmaxOptions(opt).backend(FastmaxBackend::kReference));
  Grads got = fastmax_grads(qt, kt, vt, w, FastmaxOptions(opt).backend(FastmaxBackend::kCuda));
  ASSERT_EQ(got.o.scalar_type(), c.dtype);
  ASSERT_EQ(got.o.sizes(), q.sizes());
  auto check = [&](const at::Tensor& a, const at::Tensor& p, const at::Tensor& r, const char* name) {
    ASSERT_TRUE(a.isfinite().all().item<bool>()) << name;
    const double err = max_abs(a, r), err_plain = max_abs(p, r);
    const double bound = 2 * err_plain + ulp(c.dtype) * r.abs().max().item<double>();
    EXPECT_LE(err, bound) << name << ": err " << err << ", plain same-dtype err " << err_plain;
  };
  check(got.o, plain.o, ref.o, "o");
  check(got.dq, plain.dq, ref.dq, "dq");
  check(got.dk, plain.dk, ref.dk, "dk");
  check(got.dv, plain.dv, ref.dv, "dv");
}

std::vector<CudaCase> cuda_cases() {
  std::vector<CudaCase> out;
  for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf})
    for (int64_t d : {16, 32, 64, 128})
      for (int64_t p : {1, 2})
        for (bool causal : {false, true}) {
          out.push_back({t, d, p, causal, 257, 257});
          out.push_back({t, d, p, causal, 100, 301});
        }
  out.push_back({at::kBFloat16, 64, 2, true, 1, 1});
  // Longer bf16 sequences: many 64-token chunks through the fused moment scan.
  out.push_back({at::kBFloat16, 64, 2, true, 1000, 1000});
  out.push_back({at::kBFloat16, 64, 2, true, 1000, 2049});
  out.push_back({at::kBFloat16, 32, 2, false, 1000, 2049});
  out.push_back({at::kBFloat16, 16, 1, true, 2049, 2049});
  out.push_back({at::kFloat, 32, 2, true, 301, 100});  // rows without keys
  return out;
}

std::string dtype_name(at::ScalarType t) {
  return t == at::kFloat ? "f32" : t == at::kBFloat16 ? "bf16" : t == at::kHalf ? "f16" : "f64";
}

INSTANTIATE_TEST_SUITE_P(Gpu, FastmaxCuda, ::testing::ValuesIn(cuda_cases()),
                         [](const ::testing::TestParamInfo<CudaCase>& info) {
                           const CudaCase& c = info.param;
                           return dtype_name(c.dtype) + "_d" + std::to_string(c.d) + "_p" + std::to_string(c.p) +
                                  (c.causal ? "_causal" : "_full") + "_i" + std::to_string(c.I) + "_j" +
                                  std::to_string(c.J);
                         });

// Merged 3-D inputs and b * h = 1 on the CUDA backend.
TEST(FastmaxCudaShapes, MergedAndSingleHead) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and a build with the CUDA kernels";
  at::manual_seed(9);
  const auto dev = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  for (int64_t bh : {1, 3}) {
    at::Tensor q = at::randn({bh, 129, 32}, dev) * 0.4, k = at::randn({bh, 129, 32}, dev) * 0.4;
    at::Tensor v = at::randn({bh, 129, 32}, dev);
    for (bool causal : {false, true}) {
      FastmaxOptions opt = FastmaxOptions().causal(causal);
      at::Tensor o = flashcos::fastmax_attention(q, k, v, FastmaxOptions(opt).backend(FastmaxBackend::kCuda));
      at::Tensor r = flashcos::fastmax_reference(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), opt);
      EXPECT_LE(max_abs(o, r), 1e-5);
    }
  }
}

// ---- opt-in timing report (no asserts) ----------------------------------------------------------

double time_ms(const std::function<void()>& f, int iters) {
  f();
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

double peak_gib(const std::function<void()>& f) {
#ifdef FLASHCOS_WITH_CUDA
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  f();
  torch::cuda::synchronize();
  auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return double(st.allocated_bytes[0].peak) / double(1 << 30);
#else
  f();
  return 0;
#endif
}

TEST(FastmaxCudaTiming, Report) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device";
  if (!std::getenv("FLASHCOS_FASTMAX_TIMING")) GTEST_SKIP() << "set FLASHCOS_FASTMAX_TIMING=1 to run";
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  // 1. The original README's shape: forward only, p = 2, non-causal.
  for (at::ScalarType t : {at::kFloat, at::kBFloat16}) {
    c10::NoGradGuard ng;
    at::Tensor q = at::randn({64, 8, 10000, 32}, cuda.dtype(t)) * 0.4;
    at::Tensor k = at::randn({64, 8, 10000, 32}, cuda.dtype(t)) * 0.4;
    at::Tensor v = at::randn({64, 8, 10000, 32}, cuda.dtype(t));
    const double ms = time_ms([&] { flashcos::fastmax_attention(q, k, v, FastmaxOptions().p(2)); }, 10);
    std::printf("FASTMAX fwd B64 H8 N10000 D32 p2 %s non-causal: %.2f ms (target <= 21.8 ms)\n",
                dtype_name(t).c_str(), ms);
    // Where the time goes: one feature map of all keys, and the moment GEMM of one block of it.
    const flashcos::detail::FastmaxCoef coef{2, 1.0, 1.0, 0.5};
    at::Tensor kk = k.reshape({512, 10000, 32}).to(t == at::kFloat ? at::kDouble : t);
    const double ms_phi = time_ms([&] { flashcos::detail::fastmax_features_cuda(kk, coef, false); }, 5);
    at::Tensor phi = flashcos::detail::fastmax_features_cuda(kk.narrow(1, 0, 467), coef, false);
    at::Tensor wv = at::cat({v.reshape({512, 10000, 32}).narrow(1, 0, 467).to(phi.scalar_type()),
                             at::ones({512, 467, 1}, phi.options())}, -1);
    const double ms_gemm = time_ms([&] {
      if (t == at::kFloat) at::bmm(phi.transpose(1, 2), wv);
      else at::bmm(phi.transpose(1, 2), wv, at::kFloat);
    }, 5);
    std::printf("FASTMAX   breakdown %s: features of all k %.2f ms (%.1f GB written); one 467-token moment GEMM "
                "%.3f ms x 22 blocks; half GEMM native state %d\n",
                dtype_name(t).c_str(), ms_phi, double(phi.element_size()) * 512 * 10000 * 561 / 1e9, ms_gemm,
                flashcos::detail::fastmax_half_gemm_state());
  }
  // 2. Causal fwd + bwd at b 4, h 8, d 64, bf16: fastmax p 2 / p 1 vs SDPA (cuDNN, flash). The cosine
  //    kernel is compared by `./train bench --attention fastmax` (this test links only Fastmax).
  auto& ctx = at::globalContext();
  for (int64_t n : {16384, 32768, 65536, 131072}) {
    at::Tensor q = at::randn({4, 8, n, 64}, cuda.dtype(at::kBFloat16)) * 0.35;
    at::Tensor k = at::randn({4, 8, n, 64}, cuda.dtype(at::kBFloat16)) * 0.35;
    at::Tensor v = at::randn({4, 8, n, 64}, cuda.dtype(at::kBFloat16));
    at::Tensor dout = at::randn({4, 8, n, 64}, cuda.dtype(at::kBFloat16));
    auto fwd_bwd = [&](const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>& f) {
      at::Tensor qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
                 vv = v.detach().requires_grad_(true);
      at::Tensor o = f(qq, kk, vv);
      torch::autograd::grad({o}, {qq, kk, vv}, {dout});
    };
    struct Row {
      std::string name;
      std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)> f;
    };
    std::vector<Row> rows = {
        {"fastmax p2", [](auto& a, auto& b, auto& c) {
           return flashcos::fastmax_attention(a, b, c, FastmaxOptions().p(2).causal(true));
         }},
        {"fastmax p1 norm", [](auto& a, auto& b, auto& c) {
           return flashcos::fastmax_attention(a, b, c, FastmaxOptions().p(1).normalize(true).lim(0.9).causal(true));
         }},
        {"sdpa cudnn", [&](auto& a, auto& b, auto& c) {
           ctx.setSDPUseFlash(false);
           ctx.setSDPUseMemEfficient(false);
           ctx.setSDPUseMath(false);
           ctx.setSDPUseCuDNN(true);
           return at::scaled_dot_product_attention(a, b, c, {}, 0.0, true);
         }},
        {"sdpa flash", [&](auto& a, auto& b, auto& c) {
           ctx.setSDPUseFlash(true);
           ctx.setSDPUseMemEfficient(false);
           ctx.setSDPUseMath(false);
           ctx.setSDPUseCuDNN(false);
           return at::scaled_dot_product_attention(a, b, c, {}, 0.0, true);
         }},
    };
    for (const Row& r : rows) {
      try {
        const int iters = n >= 65536 ? 3 : 5;
        const double ms = time_ms([&] { fwd_bwd(r.f); }, iters);
        const double gib = peak_gib([&] { fwd_bwd(r.f); });
        std::printf("FASTMAX causal fwd+bwd b4 h8 d64 bf16 n %6ld %-16s %9.2f ms  peak %7.2f GiB\n", long(n),
                    r.name.c_str(), ms, gib);
      } catch (const std::exception& e) {
        std::string msg = e.what();
        std::printf("FASTMAX causal fwd+bwd b4 h8 d64 bf16 n %6ld %-16s unavailable: %s\n", long(n), r.name.c_str(),
                    msg.substr(0, 120).c_str());
      }
    }
    ctx.setSDPUseFlash(true);
    ctx.setSDPUseMemEfficient(true);
    ctx.setSDPUseMath(true);
    ctx.setSDPUseCuDNN(true);
  }
}

// Where the time of the fused path goes: the moment-scan kernel alone vs the whole call.
TEST(FastmaxCudaTiming, Breakdown) {
  if (!have_gpu() || !flashcos::detail::fastmax_fused_scan_available(
                         at::zeros({1, 1, 64}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16))))
    GTEST_SKIP() << "needs a CUDA device and the fused scan";
  if (!std::getenv("FLASHCOS_FASTMAX_TIMING")) GTEST_SKIP() << "set FLASHCOS_FASTMAX_TIMING=1 to run";
  c10::NoGradGuard ng;
  const auto bf = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  for (int64_t p : {2, 1}) {
    const flashcos::detail::FastmaxCoef coef{p, 1.0, 1.0, 0.5};
    const int64_t N = 32, L = 65536, D = 64;
    at::Tensor x = at::randn({N, L, D}, bf) * 0.35, y = at::randn({N, L, D}, bf) * 0.35;
    at::Tensor w = at::randn({N, L, D + 1}, bf.dtype(at::kFloat)), g = at::randn({N, L, D + 1}, bf.dtype(at::kFloat));
    const double ms_out = time_ms([&] { flashcos::detail::fastmax_fused_scan_cuda(x, y, w, {}, coef, true, true); }, 3);
    const double ms_both = time_ms([&] { flashcos::detail::fastmax_fused_scan_cuda(x, y, w, g, coef, true, true); }, 3);
    at::Tensor q = x.view({4, 8, L, D}), k = y.view({4, 8, L, D}), v = at::randn({4, 8, L, D}, bf);
    const double ms_fwd = time_ms([&] { flashcos::fastmax_attention(q, k, v, FastmaxOptions().p(p).causal(true).normalize(p == 1).lim(0.9)); }, 3);
    std::printf("FASTMAX breakdown causal b4 h8 n65536 d64 bf16 p%ld: fused scan call (float32 padding included) "
                "out %.2f ms, out+gx %.2f ms; "
                "whole forward %.2f ms\n", long(p), ms_out, ms_both, ms_fwd);
  }
  {
    const flashcos::detail::FastmaxCoef coef{2, 1.0, 1.0, 0.5};
    at::Tensor x = at::randn({512, 10000, 32}, bf) * 0.4, y = at::randn({512, 10000, 32}, bf) * 0.4;
    at::Tensor w = at::randn({512, 10000, 33}, bf.dtype(at::kFloat));
    const double ms = time_ms([&] { flashcos::detail::fastmax_fused_scan_cuda(x, y, w, {}, coef, false, true); }, 5);
    std::printf("FASTMAX breakdown non-causal B64 H8 N10000 D32 p2: fused scan call out %.2f ms\n", ms);
  }
}

}  // namespace
