// CUDA tests of the fused attention beside the float64 grid of test_attention_cuda.cpp (skipped
// without a GPU): rms_normalize, the forward's determinism and row sums (fixed offset and online
// max), both directions on a new host thread, the Hopper forward's and backward's split tails, bias
// strides and a long sequence's memory.
// Each compares with a float64 formula or asserts bit-identity; FLASHCOS_POISON=1 is set
// (tests/fused_attention_gpu.h).
#include <flashcos/attention.h>
#include "attention/cosine/core.h"
#include "tests/attention_test_util.h"
#include "tests/fused_attention_gpu.h"
#ifdef FLASHCOS_WITH_CUDA
#include "attention/cosine/cuda/params.h"  // run_fwd_split_slots, run_bwd_split_slots
#endif

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using flashcos::AttentionOptions;
using flashcos::Backend;
using namespace flashcos::test;

// rms_normalize / l2norm on CUDA (libtorch's fused RMSNorm): values and gradients against the
// float64 formula, for output scales that go in as the norm's weight (1/8) or not (1, 1/sqrt(32)),
// on a non-contiguous input, per dtype.
TEST_F(FusedAttentionMisc, RmsNormalizeMatchesFloat64) {
  at::manual_seed(44);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (double out_scale : {1.0, 0.125, 1.0 / std::sqrt(32.0)}) {
      const auto opts = at::TensorOptions().dtype(dt).device(at::kCUDA);
      const at::Tensor base = at::randn({3, 37, 4, 64}, opts);
      const at::Tensor x = base.transpose(1, 2).detach().requires_grad_(true);  // strided
      const at::Tensor dy = at::randn(x.sizes(), opts);
      const at::Tensor y = flashcos::rms_normalize(x, out_scale);
      ASSERT_EQ(y.sizes(), x.sizes());
      y.backward(dy);
      const at::Tensor xd = x.detach().to(at::kDouble).requires_grad_(true);
      const at::Tensor yd = xd * out_scale / xd.pow(2).mean(-1, true).sqrt();
      yd.backward(dy.to(at::kDouble));
      const double tol = dt == at::kFloat ? 1e-6 : dtype_eps(dt);
      EXPECT_LE(rel_err(y, yd), tol) << dtype_name(dt) << " scale " << out_scale;
      EXPECT_LE(rel_err(x.grad(), xd.grad()), 4 * tol) << dtype_name(dt) << " scale " << out_scale;
    }
  }
  // l2norm takes this path for 16-bit CUDA tensors: unit norm per group.
  const at::Tensor q = at::randn({2, 3, 5, 128}, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
  const at::Tensor n = flashcos::l2norm(q, 2).to(at::kDouble).view({2, 3, 5, 2, 64}).norm(2, -1);
  EXPECT_LE((n - 1).abs().max().item<double>(), 1e-2);
}

// Same inputs twice: bit-identical forward (no atomics, no order dependence in the forward).
TEST_F(FusedAttentionMisc, ForwardIsDeterministic) {
  at::manual_seed(41);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat}) {
    const auto opts = at::TensorOptions().dtype(dt).device(at::kCUDA);
    const at::Tensor q = at::randn({2, 4, 1000, 64}, opts), k = at::randn({2, 2, 777, 64}, opts);
    const at::Tensor v = at::randn({2, 2, 777, 64}, opts);
    const at::Tensor mask = at::rand({2, 777}, opts.dtype(at::kFloat)) < 0.8;
    const at::Tensor bias = at::randn({4, 1000, 777}, opts);
    auto o = AttentionOptions().causal(true).mask(mask).attn_bias(bias).backend(Backend::kFused);
    const at::Tensor a = flashcos::cosine_sim_attention(q, k, v, o);
    const at::Tensor b = flashcos::cosine_sim_attention(q, k, v, o);
    EXPECT_TRUE(at::equal(a, b)) << dtype_name(dt);
  }
}

// The forward and backward as the first CUDA work of a new host thread (the autograd engine's
// backward thread is one): on a compute capability 9.0 GPU both run the Hopper kernels there, as on
// this thread (their TMA maps once failed there without a current context, and the sm_80 kernels
// ran), and give this thread's o bit for bit and its gradients within rounding.
TEST_F(FusedAttentionMisc, NewHostThreadRunsTheSameKernels) {
  at::manual_seed(49);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    const auto opts = at::TensorOptions().dtype(dt).device(at::kCUDA);
    const at::Tensor q = flashcos::l2norm(at::randn({1, 2, 300, 64}, opts));
    const at::Tensor k = flashcos::l2norm(at::randn({1, 2, 300, 64}, opts));
    const at::Tensor v = at::randn({1, 2, 300, 64}, opts), dout = at::randn({1, 2, 300, 64}, opts);
    flashcos::detail::CoreArgs args;
    args.causal = true;
    const auto here = flashcos::detail::fused_forward(q, k, v, {}, {}, args);
    const auto grads = flashcos::detail::fused_backward(dout, q, k, v, here.o, here.l, {}, {}, args);
    c10::cuda::device_synchronize();  // nothing of this thread's work left when the other starts
    flashcos::detail::ForwardResult there;
    flashcos::detail::BackwardResult there_grads;
    int64_t fwd_runs = -1, bwd_runs = -1;
    std::thread fresh([&] {
      const int64_t fwd_before = flashcos::hopper_forward_kernel_launches();
      there = flashcos::detail::fused_forward(q, k, v, {}, {}, args);
      fwd_runs = flashcos::hopper_forward_kernel_launches() - fwd_before;
      const int64_t bwd_before = flashcos::hopper_backward_kernel_launches();
      there_grads = flashcos::detail::fused_backward(dout, q, k, v, here.o, here.l, {}, {}, args);
      bwd_runs = flashcos::hopper_backward_kernel_launches() - bwd_before;
      c10::cuda::device_synchronize();
    });
    fresh.join();
    if (hopper_family_expected()) {
      EXPECT_EQ(fwd_runs, 1) << dtype_name(dt) << ": Hopper forwards on the new thread";
      EXPECT_EQ(bwd_runs, 1) << dtype_name(dt) << ": Hopper backwards on the new thread";
    }
    EXPECT_TRUE(at::equal(there.o, here.o)) << dtype_name(dt);
    EXPECT_LE(rel_err(there_grads.dq, grads.dq), 1e-3) << dtype_name(dt);
    EXPECT_LE(rel_err(there_grads.dk, grads.dk), 1e-3) << dtype_name(dt);
    EXPECT_LE(rel_err(there_grads.dv, grads.dv), 1e-3) << dtype_name(dt);
  }
}

// The core contract directly: l is the row sum (float32), 0 on empty rows; exp kind: no l.
TEST_F(FusedAttentionMisc, CoreReturnsRowSums) {
  at::manual_seed(42);
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const at::Tensor q = flashcos::l2norm(at::randn({1, 2, 70, 32}, opts));
  const at::Tensor k = flashcos::l2norm(at::randn({1, 2, 50, 32}, opts));
  const at::Tensor v = at::randn({1, 2, 50, 32}, opts);
  flashcos::detail::CoreArgs args;
  args.causal = true;
  const auto r = flashcos::detail::fused_forward(q, k, v, {}, {}, args);
  ASSERT_TRUE(r.l.defined());
  EXPECT_EQ(r.l.scalar_type(), at::kFloat);
  const at::Tensor s = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-1, -2));
  const at::Tensor i = at::arange(70, at::TensorOptions().device(at::kCUDA)).view({70, 1});
  const at::Tensor j = at::arange(50, at::TensorOptions().device(at::kCUDA)).view({1, 50});
  const at::Tensor l = (at::exp(s * 10 - 10) * (j <= i - 20)).sum(-1);
  EXPECT_LE(rel_err(r.l, l), 1e-5);
  EXPECT_EQ(r.l.index({0, 0, at::indexing::Slice(0, 20)}).abs().max().item<float>(), 0.f);
  args.exp_kind = true;
  EXPECT_FALSE(flashcos::detail::fused_forward(q, k, v, {}, {}, args).l.defined());
}

// The online-max forward's l (fp16 with a bias, both Hopper tiles when on an H100): the row sums of
// exp(scale (q.k - 1) + bias) over 3 key blocks (the running max grows), what the fixed-offset
// forward saves too (the backward of either family reads them).
TEST_F(FusedAttentionMisc, CoreRowSumsOnlineWithBias) {
  at::manual_seed(45);
  for (int64_t D : {64, 128}) {
    const auto opts = at::TensorOptions().dtype(at::kHalf).device(at::kCUDA);
    const at::Tensor q = flashcos::l2norm(at::randn({1, 2, 70, D}, opts));
    const at::Tensor k = flashcos::l2norm(at::randn({1, 2, 300, D}, opts));
    const at::Tensor v = at::randn({1, 2, 300, D}, opts);
    const at::Tensor bias = at::randn({2, 70, 300}, opts.dtype(at::kFloat)) * 2;
    flashcos::detail::CoreArgs args;
    args.causal = true;  // diag 230: rows see 231 .. 300 keys
    const int64_t hopper_before = flashcos::hopper_forward_kernel_launches();
    const auto r = flashcos::detail::fused_forward(q, k, v, {}, bias, args);
    if (hopper_family_expected()) {
      EXPECT_EQ(flashcos::hopper_forward_kernel_launches() - hopper_before, 1);
    }
    ASSERT_TRUE(r.l.defined());
    const at::Tensor s = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-1, -2));
    const at::Tensor i = at::arange(70, at::TensorOptions().device(at::kCUDA)).view({70, 1});
    const at::Tensor j = at::arange(300, at::TensorOptions().device(at::kCUDA)).view({1, 300});
    const at::Tensor l = (at::exp(s * 10 - 10 + bias.to(at::kDouble)) * (j <= i + 230)).sum(-1);
    EXPECT_LE(rel_err(r.l, l), 1e-5) << "d " << D;
  }
}

// The Hopper forward's split tail (hopper/split_tail.h; d 64 tiles, no causal mask, no bias, the fixed
// offset): on a grid of 36 .. 48 CTAs of 12 key blocks the plan runs every block as pieces (asserted
// on an H100; d 128 does not split), whose unnormalised O and row sums the last piece adds. o and l
// against float64, with a key mask that empties batch 1's rows (o and l exactly 0 there), and
// bit-identical twice.
TEST_F(FusedAttentionMisc, ForwardSplitTailMatchesFloat64) {
  at::manual_seed(47);
  const int64_t B = 2, H = 3, I = 1000, J = 1500;
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    for (int64_t D : {32, 64, 128}) {
      const auto opts = at::TensorOptions().dtype(dt).device(at::kCUDA);
      const at::Tensor q = flashcos::l2norm(at::randn({B, H, I, D}, opts));
      const at::Tensor k = flashcos::l2norm(at::randn({B, H, J, D}, opts));
      const at::Tensor v = at::randn({B, H, J, D}, opts);
      at::Tensor mask = at::rand({B, J}, opts.dtype(at::kFloat)) < 0.7;
      mask.select(0, 1).fill_(false);  // batch 1 sees no key
#ifdef FLASHCOS_WITH_CUDA
      if (hopper_family_expected()) {
        flashcos::cuda::FwdParams p;
        p.dtype = dt == at::kHalf ? flashcos::cuda::DType::kHalf : flashcos::cuda::DType::kBFloat16;
        p.B = int(B), p.H = int(H), p.Hkv = int(H), p.I = int(I), p.J = int(J), p.D = int(D);
        p.mask = reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>());  // a key mask (any pointer)
        int slot_floats = 0;
        const int64_t slots = flashcos::cuda::run_fwd_split_slots(p, &slot_floats);
        if (D <= 64) {
          EXPECT_GT(slots, 0) << "no split planned, d " << D;
          EXPECT_GT(slot_floats, 0);
        } else {
          EXPECT_EQ(slots, 0) << "d 128 planned a split";
        }
      }
#endif
      flashcos::detail::CoreArgs args;
      const auto r = flashcos::detail::fused_forward(q, k, v, mask, {}, args);
      const auto again = flashcos::detail::fused_forward(q, k, v, mask, {}, args);
      ASSERT_TRUE(r.l.defined());
      EXPECT_TRUE(at::equal(r.o, again.o) && at::equal(r.l, again.l)) << dtype_name(dt) << " d " << D << ": not repeatable";
      const at::Tensor keep = mask.to(at::kDouble).view({B, 1, 1, J});
      const at::Tensor s = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-1, -2));
      const at::Tensor pr = at::exp(s * 10 - 10) * keep;
      const at::Tensor l = pr.sum(-1);
      const at::Tensor o = at::matmul(pr, v.to(at::kDouble)) / l.clamp_min(1e-300).unsqueeze(-1);
      const at::Tensor seen = r.o.select(0, 0), empty_o = r.o.select(0, 1), empty_l = r.l.select(0, 1);
      EXPECT_LE(rel_err(seen, o.select(0, 0)), dtype_eps(dt)) << dtype_name(dt) << " d " << D << " o";
      EXPECT_LE(rel_err(r.l.select(0, 0), l.select(0, 0)), 1e-5) << dtype_name(dt) << " d " << D << " l";
      EXPECT_EQ(empty_o.abs().max().item<float>(), 0.f) << "rows without keys: o not 0";
      EXPECT_EQ(empty_l.abs().max().item<float>(), 0.f) << "rows without keys: l not 0";
    }
  }
}

// The backward's split tail is planned where it applies (the grid's non-causal cases run it and the
// float64 grid checks their gradients): without a causal mask slots of 256 x D floats, with one none.
TEST_F(FusedAttentionMisc, BackwardSplitTailPlannedWithoutCausalMask) {
#ifdef FLASHCOS_WITH_CUDA
  if (!hopper_family_expected()) GTEST_SKIP() << "the split tail is the Hopper kernels'";
  for (const bool causal : {false, true}) {
    for (const int D : {64, 128}) {
      flashcos::cuda::BwdParams p;
      p.B = 1, p.H = 2, p.Hkv = 2, p.I = 1000, p.J = 1500, p.D = D, p.causal = causal;  // 24 key blocks
      int slot_floats = 0;
      const int64_t slots = flashcos::cuda::run_bwd_split_slots(p, &slot_floats);
      if (causal) {
        EXPECT_EQ(slots, 0) << "causal d " << D << " planned a split";
      } else {
        EXPECT_GT(slots, 0) << "no split planned, d " << D;
        EXPECT_EQ(slot_floats, 256 * D);
      }
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Any bias strides on the forward (the Hopper forward's float2 loads need j stride 1, an even J and
// 8-byte aligned rows; its other loads take any strides): a transposed, a broadcast and a misaligned
// bias give bit for bit the forward of the same values in a contiguous bias.
TEST_F(FusedAttentionMisc, ForwardBiasAnyStrides) {
  at::manual_seed(46);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    for (int64_t D : {64, 128}) {
      const auto opts = at::TensorOptions().dtype(dt).device(at::kCUDA);
      const auto f32 = opts.dtype(at::kFloat);
      const at::Tensor q = at::randn({2, 2, 300, D}, opts), k = at::randn({2, 2, 400, D}, opts);
      const at::Tensor v = at::randn({2, 2, 400, D}, opts);
      const std::vector<std::pair<std::string, at::Tensor>> biases = {
          {"transposed", at::randn({2, 400, 300}, f32).transpose(1, 2)},
          {"broadcast", at::randn({1, 300, 400}, f32).expand({2, 300, 400})},
          {"misaligned", at::randn({2, 300, 402}, f32).narrow(2, 1, 400)},
      };
      for (const auto& [name, bias] : biases) {
        auto o = AttentionOptions().causal(true).backend(Backend::kFused);
        const at::Tensor a = flashcos::cosine_sim_attention(q, k, v, AttentionOptions(o).attn_bias(bias));
        const at::Tensor b = flashcos::cosine_sim_attention(q, k, v, AttentionOptions(o).attn_bias(bias.contiguous()));
        EXPECT_TRUE(at::equal(a, b)) << dtype_name(dt) << " d " << D << " " << name << " bias";
      }
    }
  }
}

// Long sequence without n^2 memory: b 1, h 8, n 65536, d 64 bf16 causal, forward + backward.
TEST_F(FusedAttentionMisc, LongSequenceLinearMemory) {
  at::manual_seed(43);
  const int64_t n = 65536;
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor q = at::randn({1, 8, n, 64}, opts).requires_grad_(true);
  at::Tensor k = at::randn({1, 8, n, 64}, opts).requires_grad_(true);
  at::Tensor v = at::randn({1, 8, n, 64}, opts).requires_grad_(true);
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const int64_t before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  at::Tensor o = flashcos::cosine_sim_attention(q, k, v, AttentionOptions().causal(true).backend(Backend::kFused));
  o.backward(at::ones_like(o));
  const int64_t peak = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak - before;
  const double input_bytes = 3.0 * q.numel() * 2;
  std::printf("[ memory   ] b1 h8 n65536 d64 bf16 causal fwd+bwd: peak %.1f MiB above the inputs (%.1f MiB)\n",
              peak / 1048576.0, input_bytes / 1048576.0);
  EXPECT_LT(double(peak), 16 * input_bytes) << "an n^2 buffer would be " << 8.0 * n * n * 2 / 1e9 << " GB";
  EXPECT_TRUE(at::isfinite(q.grad()).all().item<bool>());
  EXPECT_TRUE(at::isfinite(o).all().item<bool>());
}

}  // namespace
