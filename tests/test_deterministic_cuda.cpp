// The fused backward's deterministic mode (AttentionOptions::deterministic) on the GPU (skipped
// without one): two backward passes on the same inputs give bit-identical dq, dk, dv, dbias, and
// the gradients agree with the default (atomic) mode up to float32 reassociation. Long key
// sequences (16+ key blocks add into every dq row), on every kernel family: the Hopper kernels
// (bf16 / fp16, d 64 / 128, grouped heads, causal), the sm_80 kernels (d 96, key mask and bias)
// and the float32 kernels (bias with a batch dim), plus the packed QKV entry point the trainer uses.
#include <flashcos/attention.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>
#include <vector>

namespace {

using flashcos::AttentionOptions;
using flashcos::Backend;

bool have_gpu() { return torch::cuda::is_available() && flashcos::fused_kernels_compiled(); }

struct DetCase {
  std::string name;
  at::ScalarType dtype;
  int64_t B, H, Hkv, I, J, D;
  bool causal = false, mask = false, bias_head = false, bias_batch = false;
};

struct Grads {
  std::vector<at::Tensor> g;  // dq, dk, dv[, dbias]
};

Grads run_backward(const DetCase& c, bool deterministic, uint64_t seed) {
  at::manual_seed(seed);  // same inputs for every call with the same seed
  const auto opts = at::TensorOptions().dtype(c.dtype).device(at::kCUDA);
  at::Tensor q = at::randn({c.B, c.H, c.I, c.D}, opts).requires_grad_(true);
  at::Tensor k = at::randn({c.B, c.Hkv, c.J, c.D}, opts).requires_grad_(true);
  at::Tensor v = at::randn({c.B, c.Hkv, c.J, c.D}, opts).requires_grad_(true);
  const at::Tensor dout = at::randn({c.B, c.H, c.I, c.D}, opts);
  auto o = AttentionOptions().causal(c.causal).backend(Backend::kFused).deterministic(deterministic);
  at::Tensor bias;
  if (c.mask) o.mask(at::rand({c.B, c.J}, opts.dtype(at::kFloat)) < 0.8);
  if (c.bias_head || c.bias_batch) {
    bias = (0.5 * at::randn({c.bias_batch ? c.B : c.H, c.I, c.J}, opts.dtype(at::kFloat))).requires_grad_(true);
    o.attn_bias(bias).attn_bias_batch_dim(c.bias_batch);
  }
  const at::Tensor out = flashcos::cosine_sim_attention(q, k, v, o);
  (out * dout).sum().backward();
  Grads r{{q.grad(), k.grad(), v.grad()}};
  if (bias.defined()) r.g.push_back(bias.grad());
  return r;
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  return (ad - bd).norm().item<double>() / std::max(bd.norm().item<double>(), 1e-30);
}

class DeterministicBackward : public ::testing::TestWithParam<DetCase> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
  }
};

TEST_P(DeterministicBackward, BitIdenticalAndMatchesTheAtomicMode) {
  const DetCase& c = GetParam();
  const Grads a = run_backward(c, true, 7), b = run_backward(c, true, 7), ref = run_backward(c, false, 7);
  const char* names[] = {"dq", "dk", "dv", "dbias"};
  ASSERT_EQ(a.g.size(), ref.g.size());
  for (size_t i = 0; i < a.g.size(); ++i) {
    ASSERT_TRUE(a.g[i].defined() && b.g[i].defined()) << names[i];
    EXPECT_FALSE(a.g[i].isnan().any().item<bool>()) << names[i];
    EXPECT_TRUE(at::equal(a.g[i], b.g[i])) << c.name << ": " << names[i] << " differs between two deterministic runs";
    // Only the order of float32 additions differs from the atomic mode (dq: 16-bit output rounding).
    const double tol = c.dtype == at::kFloat ? 1e-5 : 1e-2;
    EXPECT_LE(rel_diff(a.g[i], ref.g[i]), tol) << c.name << ": " << names[i];
  }
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(Gpu, DeterministicBackward, ::testing::Values(
  DetCase{"hopper_bf16_d64_causal",     at::kBFloat16, 2, 4, 4, 2049, 2049, 64, true},
  DetCase{"hopper_bf16_d64_full_gqa",   at::kBFloat16, 1, 4, 2, 1000, 2300, 64},
  DetCase{"hopper_fp16_d128_causal",    at::kHalf,     1, 4, 4, 2048, 2048, 128, true},
  DetCase{"hopper_bf16_d128_full",      at::kBFloat16, 2, 2, 2, 63, 2049, 128},
  // I = 1040: the last 64-row unit has 16 rows, its second column half's counter the head's spare.
  DetCase{"hopper_bf16_d128_full_1040", at::kBFloat16, 2, 3, 3, 1040, 2049, 128},
  // The rotated order (hopper::choose_bwd_order: one band of every key block here), 32 / 94 units per
  // block.
  DetCase{"hopper_bf16_d64_full_4096",  at::kBFloat16, 1, 2, 2, 4096, 4096, 64},
  DetCase{"hopper_fp16_d128_gqa_3000",  at::kHalf,     1, 4, 2, 3000, 3000, 128},
  // Causal in head groups (d128: groups of 2, each block's steps backwards; d64: groups of 16, steps
  // forwards): keys past the rows (J > I), and rows with no key (I > J).
  DetCase{"hopper_bf16_d128_causal_gqa_j_gt_i", at::kBFloat16, 1, 4, 2, 1000, 2300, 128, true},
  DetCase{"hopper_fp16_d64_causal_i_gt_j",      at::kHalf,     2, 2, 2, 1000, 700, 64, true},
  DetCase{"hopper_bf16_d96_causal",     at::kBFloat16, 1, 4, 2, 2049, 2049, 96, true},
  DetCase{"hopper_fp16_d32_mask",       at::kHalf,     2, 2, 2, 1000, 2049, 32, false, true},
  // d 128 with a key mask on the dQ grid (64-row steps): 1000 rows end in a 40-row step (its rows'
  // constants clamped).
  DetCase{"hopper_bf16_d128_mask_1000", at::kBFloat16, 2, 2, 2, 1000, 1500, 128, false, true},
  DetCase{"sm80_bf16_d96_mask_bias",    at::kBFloat16, 2, 2, 2, 1000, 2049, 96, true, true, true},
  DetCase{"sm80_fp16_d64_bias_batch",   at::kHalf,     2, 2, 2, 127, 2049, 64, false, false, false, true},
  DetCase{"f32_d64_bias_batch_causal",  at::kFloat,    2, 2, 2, 300, 1000, 64, true, false, false, true},
  DetCase{"f32_d32_mask_bias_head",     at::kFloat,    1, 3, 3, 257, 700, 32, false, true, true}),
  [](const ::testing::TestParamInfo<DetCase>& info) { return info.param.name; });
// clang-format on

// The trainer's entry point: packed (B, T, 3 H D) qkv, fused l2norm (+ rotary) and attention.
TEST(DeterministicBackwardQkv, PackedPathIsBitIdentical) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
  auto grad = [](bool deterministic) {
    at::manual_seed(11);
    const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
    at::Tensor qkv = at::randn({2, 2048, 3 * 4 * 64}, opts).requires_grad_(true);
    const at::Tensor dout = at::randn({2, 2048, 4 * 64}, opts);
    const auto o = AttentionOptions().causal(true).rotary(true).backend(Backend::kFused).deterministic(deterministic);
    (flashcos::cosine_sim_attention_qkv(qkv, 4, o) * dout).sum().backward();
    return qkv.grad();
  };
  const at::Tensor a = grad(true), b = grad(true), ref = grad(false);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_LE(rel_diff(a, ref), 1e-2);
}

}  // namespace

namespace {

// Off CUDA the option changes nothing: the tiled and plain paths have no atomics (runs in CI).
TEST(DeterministicOption, CpuPathsGiveTheSameGradients) {
  at::manual_seed(5);
  auto grads = [](bool deterministic, flashcos::Backend backend) {
    at::manual_seed(5);
    at::Tensor q = at::randn({1, 2, 37, 16}, at::kDouble).requires_grad_(true);
    at::Tensor k = at::randn({1, 2, 41, 16}, at::kDouble).requires_grad_(true);
    at::Tensor v = at::randn({1, 2, 41, 16}, at::kDouble).requires_grad_(true);
    const auto o = flashcos::AttentionOptions().causal(true).backend(backend).tile_size(16).deterministic(deterministic);
    flashcos::cosine_sim_attention(q, k, v, o).sum().backward();
    return std::vector<at::Tensor>{q.grad(), k.grad(), v.grad()};
  };
  for (auto backend : {flashcos::Backend::kTiled, flashcos::Backend::kPlain}) {
    const auto a = grads(true, backend), b = grads(false, backend);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << i;
  }
}

}  // namespace
