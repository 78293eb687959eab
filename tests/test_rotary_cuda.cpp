// Rotary positions on the GPU (skipped without a CUDA device): the fused l2norm + rotary kernels
// forward and backward against float64 loops (strided views of a packed projection, odd T, T = 1,
// decode-style position offsets, groups 1 / 2 / 4, bf16 / fp16 / fp32, outputs poisoned first);
// the packed QKV attention with rotary against float64; shift invariance; and one model giving the
// same logits under --use-cuda-kernel, sdpa and plain.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdlib>

#include <flashcos/attention.h>

#include "attention/l2norm/l2norm_cuda.h"
#include "model/autocast.h"
#include "model/gpt.h"
#include "tests/attention_test_util.h"
#include "tests/rotary_test_util.h"

namespace {

using flashcos::AttentionOptions;
using flashcos::Backend;
using flashcos::test::dtype_eps;
using flashcos::test::dtype_name;
using flashcos::test::l2norm64;
using flashcos::test::l2norm64_backward;
using flashcos::test::rel_err;
using flashcos::test::rotary_loop;

bool have_gpu() { return torch::cuda::is_available() && flashcos::fused_kernels_compiled(); }

// Output rounding of the dtype plus fp32 sincosf (a few ulp): relative Frobenius bounds.
double tol(at::ScalarType dtype) { return dtype == at::kFloat ? 1e-5 : 2.0 * dtype_eps(dtype); }

struct NormCase {
  int64_t T, groups, offset;
  at::ScalarType dtype;
};

class RotaryL2NormCuda : public ::testing::TestWithParam<NormCase> {};

TEST_P(RotaryL2NormCuda, FusedForwardBackwardMatchFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
  setenv("FLASHCOS_POISON", "1", 1);
  const NormCase c = GetParam();
  const int64_t B = 2, H = 3, D = 64;
  torch::manual_seed(31 + c.T * 3 + c.groups * 7 + c.offset);
  // q as the (B, H, T, D) strided view of a packed (B, T, 3, H, D) projection, as the model has it.
  const auto packed = torch::randn({B, c.T, 3, H, D}, torch::dtype(c.dtype).device(torch::kCUDA)).requires_grad_(true);
  const auto x = packed.select(2, 0).permute({0, 2, 1, 3});
  ASSERT_TRUE(flashcos::detail::l2norm_cuda_supported(x, c.groups)) << "the fused kernels must take this view";
  const auto y = flashcos::l2norm_rotary(x, c.groups, 10000.0, c.offset);
  ASSERT_EQ(y.scalar_type(), c.dtype);
  const auto xc = x.detach().cpu();
  const auto y_ref = rotary_loop(l2norm64(xc, c.groups), c.groups, 10000.0, c.offset);
  const std::string what = dtype_name(c.dtype) + " T " + std::to_string(c.T) + " groups " + std::to_string(c.groups) +
                           " offset " + std::to_string(c.offset);
  EXPECT_LT(rel_err(y.cpu(), y_ref), tol(c.dtype)) << what;
  const auto dy = torch::randn_like(y);
  y.backward(dy);
  const auto dx = packed.grad().select(2, 0).permute({0, 2, 1, 3}).cpu();
  const auto dx_ref = l2norm64_backward(xc, rotary_loop(dy.cpu(), c.groups, 10000.0, c.offset, /*transpose=*/true), c.groups);
  EXPECT_LT(rel_err(dx, dx_ref), 2.0 * tol(c.dtype)) << what;
  // Only q got a gradient: the k and v thirds stay zero.
  EXPECT_EQ(packed.grad().select(2, 1).abs().max().item<double>(), 0.0);
  unsetenv("FLASHCOS_POISON");
}

std::vector<NormCase> norm_cases() {
  std::vector<NormCase> out;
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (int64_t T : {1, 63, 127, 1000}) {
      for (int64_t groups : {1, 2, 4}) {
        for (int64_t offset : {int64_t(0), int64_t(4097)}) out.push_back({T, groups, offset, dtype});
      }
    }
    // Angles past ~1e5 rad take sincosf's slow argument reduction.
    out.push_back({63, 1, 200000, dtype});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, RotaryL2NormCuda, ::testing::ValuesIn(norm_cases()));

// The packed QKV entry point with rotary (fused l2norm + rotary, then the attention kernel) against
// float64 (the plain backend in double, whose rotary path the CPU tests check against loops); the
// same computation in plain libtorch ops in the dtype sets the bar (at most 2x its error + a floor).
TEST(RotaryQkvCuda, FusedPackedMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
  const int64_t B = 2, H = 2, D = 64;
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (int64_t T : {1, 63, 1000}) {
      for (int64_t groups : {1, 2, 4}) {
        for (int64_t offset : {int64_t(0), int64_t(777)}) {
          torch::manual_seed(T + groups * 11 + offset);
          const auto qkv64 = torch::randn({B, T, 3 * H * D}, torch::kDouble);
          auto opts = AttentionOptions().causal(true).scale(10.0).groups(groups).rotary(true).position_offset(offset);
          const auto dout64 = torch::randn({B, T, H * D}, torch::kDouble);
          auto run = [&](const at::Tensor& base, Backend backend, at::ScalarType dt, c10::Device dev) {
            auto in = base.to(dt).to(dev).detach().requires_grad_(true);
            auto o = flashcos::cosine_sim_attention_qkv(in, H, AttentionOptions(opts).backend(backend));
            o.backward(dout64.to(dt).to(dev));
            return std::make_pair(o.detach().cpu(), in.grad().cpu());
          };
          const auto qkv_r = qkv64.to(dtype).to(at::kDouble);  // the dtype-rounded inputs
          const auto [o_ref, g_ref] = run(qkv_r, Backend::kPlain, at::kDouble, torch::kCPU);
          const auto [o_f, g_f] = run(qkv_r, Backend::kFused, dtype, torch::kCUDA);
          const auto [o_p, g_p] = run(qkv_r, Backend::kPlain, dtype, torch::kCUDA);
          const std::string what = dtype_name(dtype) + " T " + std::to_string(T) + " groups " + std::to_string(groups) +
                                   " offset " + std::to_string(offset);
          EXPECT_LE(rel_err(o_f, o_ref), 2 * rel_err(o_p, o_ref) + 4 * dtype_eps(dtype)) << what;
          // dq, dk vanish at T = 1 (one key): compare v's third there, the whole gradient otherwise.
          const auto part = [&](const at::Tensor& g) { return T == 1 ? g.narrow(2, 2 * H * D, H * D) : g; };
          EXPECT_LE(rel_err(part(g_f), part(g_ref)), 2 * rel_err(part(g_p), part(g_ref)) + 8 * dtype_eps(dtype)) << what;
        }
      }
    }
  }
}

// Adding the same offset to every position leaves the fused attention unchanged (to the dtype's
// rounding and float32 angles), while dropping the rotation does not.
TEST(RotaryQkvCuda, ShiftInvariance) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
  torch::manual_seed(5);
  const auto qkv = torch::randn({2, 257, 3 * 4 * 64}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  auto opts = AttentionOptions().causal(true).scale(10.0).groups(2).rotary(true).backend(Backend::kFused);
  const auto o0 = flashcos::cosine_sim_attention_qkv(qkv, 4, opts);
  for (int64_t offset : {1, 1000, 8191}) {
    const auto o1 = flashcos::cosine_sim_attention_qkv(qkv, 4, AttentionOptions(opts).position_offset(offset));
    EXPECT_LT(rel_err(o1, o0), 2e-2) << "offset " << offset;
  }
  const auto plain = flashcos::cosine_sim_attention_qkv(qkv, 4, AttentionOptions(opts).rotary(false));
  EXPECT_GT(rel_err(plain, o0), 5e-2);
}

// One rope checkpoint, the same logits under every --attention-impl (bf16 autocast against an fp32
// plain run of the same weights).
TEST(RotaryModelCuda, SameLogitsUnderEveryImpl) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
  using flashcos::model::GPT;
  flashcos::model::ModelConfig cfg;
  cfg.dim = 128, cfg.depth = 2, cfg.heads = 4, cfg.dim_head = 64, cfg.max_seq_len = 512, cfg.pos = "rope";
  for (int64_t groups : {1, 2}) {
    cfg.l2norm_groups = groups;
    torch::manual_seed(3);
    cfg.attention_impl = "plain";
    GPT ref(cfg);
    ref->to(torch::kCUDA);
    ref->eval();
    const auto tokens = torch::randint(0, 256, {2, 300}, torch::dtype(torch::kLong).device(torch::kCUDA));
    torch::NoGradGuard no_grad;
    const auto logits_ref = ref->forward(tokens).to(torch::kDouble);
    for (const char* impl : {"fused", "sdpa", "plain", "tiled"}) {
      cfg.attention_impl = impl;
      GPT m(cfg);
      m->to(torch::kCUDA);
      m->eval();
      auto dst = m->parameters(), src = ref->parameters();
      ASSERT_EQ(dst.size(), src.size());
      for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
      at::Tensor logits;
      {
        flashcos::model::AutocastScope autocast(true, torch::kCUDA, torch::kBFloat16);
        logits = m->forward(tokens).to(torch::kDouble);
      }
      EXPECT_LT(rel_err(logits, logits_ref), 2e-2) << impl << " groups " << groups;
    }
  }
}

}  // namespace
