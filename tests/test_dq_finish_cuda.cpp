// The 16-bit backward's dq conversion (attention/cosine/cuda/dq_finish.cuh) on the GPU (skipped
// without one). dq in the inputs' type is written by the launcher's last kernel from the float32
// accumulator, on the Hopper kernels overlapped with the backward's last wave (it waits for each
// head's counts). In the deterministic mode the accumulator's sums do not depend on the order of
// the adds, so the 16-bit dq must be exactly the float32 dq (dq_float, the packed entry point's
// route, no conversion) rounded once: every element, on every shape, with dq poisoned first.
// Shapes: odd lengths (1, 63, 127, 1000), grouped heads, causal with I < J and I > J, enough heads
// and rows for several waves of CTAs (so that the conversion starts while the backward runs), both
// head-dim tiles; and no keys (dq = 0, 16-bit and float32).
#include <flashcos/attention.h>
#include "attention/cosine/core.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

namespace fd = flashcos::detail;

bool have_gpu() { return torch::cuda::is_available() && flashcos::fused_kernels_compiled(); }

struct FinishCase {
  std::string name;
  at::ScalarType dtype;
  int64_t B, H, Hkv, I, J, D;
  bool causal;
};

std::string dtype_name(at::ScalarType t) { return t == at::kHalf ? "fp16" : t == at::kBFloat16 ? "bf16" : "fp32"; }

class DqFinishCuda : public ::testing::TestWithParam<FinishCase> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
    setenv("FLASHCOS_POISON", "1", 1);  // dq, dk, dv filled with NaN before the kernels run
  }
};

TEST_P(DqFinishCuda, SixteenBitDqIsTheFloatAccumulatorRoundedOnce) {
  const FinishCase& c = GetParam();
  at::manual_seed(1234 + c.I + 7 * c.J + 31 * c.D);
  const auto opts = at::TensorOptions().dtype(c.dtype).device(at::kCUDA);
  const at::Tensor q = flashcos::l2norm(at::randn({c.B, c.H, c.I, c.D}, opts));
  const at::Tensor k = flashcos::l2norm(at::randn({c.B, c.Hkv, c.J, c.D}, opts));
  const at::Tensor v = at::randn({c.B, c.Hkv, c.J, c.D}, opts);
  const at::Tensor dout = at::randn({c.B, c.H, c.I, c.D}, opts);
  fd::CoreArgs args;
  args.causal = c.causal;
  args.deterministic = true;
  const fd::ForwardResult f = fd::fused_forward(q, k, v, {}, {}, args);
  const fd::BackwardResult half = fd::fused_backward(dout, q, k, v, f.o, f.l, {}, {}, args, /*dq_float=*/false);
  const fd::BackwardResult full = fd::fused_backward(dout, q, k, v, f.o, f.l, {}, {}, args, /*dq_float=*/true);
  ASSERT_EQ(half.dq.scalar_type(), c.dtype);
  ASSERT_EQ(full.dq.scalar_type(), at::kFloat);
  ASSERT_EQ(half.dq.sizes(), q.sizes());
  EXPECT_FALSE(half.dq.isnan().any().item<bool>()) << c.name << ": dq has elements no kernel wrote";
  // The float32 route's gradient is dq times dq_factor: 1, or the softmax scale the kernel left out.
  const float scale = float(args.scale);
  EXPECT_TRUE(full.dq_factor == 1.f || full.dq_factor == scale)
      << c.name << ": dq_factor " << full.dq_factor << ", expected 1 or the scale " << scale;
  EXPECT_EQ(half.dq_factor, 1.f) << c.name << ": the 16-bit dq carries its scale";
  const at::Tensor rounded = (full.dq * full.dq_factor).to(c.dtype);
  const int64_t differ = half.dq.ne(rounded).sum().item<int64_t>();
  EXPECT_EQ(differ, 0) << c.name << ": " << differ << " of " << half.dq.numel()
                       << " dq elements differ from the float32 accumulator rounded";
  // dk, dv do not depend on the route.
  EXPECT_TRUE(at::equal(half.dk, full.dk)) << c.name;
  EXPECT_TRUE(at::equal(half.dv, full.dv)) << c.name;
  // And dq is not trivially zero (the check above would pass on two zero tensors).
  EXPECT_GT(full.dq.abs().max().item<float>(), 0.f) << c.name;
}

std::vector<FinishCase> cases() {
  std::vector<FinishCase> v;
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    const std::string t = dtype_name(dt);
    for (int64_t D : {64, 128}) {
      const std::string d = "_d" + std::to_string(D);
      v.push_back({t + d + "_waves", dt, 4, 8, 8, 2048, 2048, D, false});
      v.push_back({t + d + "_waves_causal", dt, 4, 8, 8, 2048, 2048, D, true});
      v.push_back({t + d + "_i1", dt, 2, 4, 4, 1, 300, D, false});
      v.push_back({t + d + "_i63_j127_gqa", dt, 1, 6, 2, 63, 127, D, false});
      v.push_back({t + d + "_i1000_j1000_causal", dt, 1, 4, 4, 1000, 1000, D, true});
    }
    v.push_back({t + "_d96_i127_j63_causal", dt, 2, 4, 2, 127, 63, 96, true});  // I > J: rows with no key
    v.push_back({t + "_d32_i1000_j700_causal_mqa", dt, 1, 8, 1, 700, 1000, 32, true});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, DqFinishCuda, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// No keys (J = 0): every row attends to nothing, so dq = 0, in 16 bits (the conversion of the
// zeroed accumulator) and in float32 (no kernel runs).
TEST(DqFinishCudaNoKeys, DqIsZero) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
  setenv("FLASHCOS_POISON", "1", 1);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat}) {
    const auto opts = at::TensorOptions().dtype(dt).device(at::kCUDA);
    const at::Tensor q = flashcos::l2norm(at::randn({2, 3, 17, 64}, opts));
    const at::Tensor k = at::empty({2, 3, 0, 64}, opts), v = at::empty({2, 3, 0, 64}, opts);
    const at::Tensor dout = at::randn({2, 3, 17, 64}, opts);
    fd::CoreArgs args;
    const fd::ForwardResult f = fd::fused_forward(q, k, v, {}, {}, args);
    const fd::BackwardResult g = fd::fused_backward(dout, q, k, v, f.o, f.l, {}, {}, args);
    ASSERT_EQ(g.dq.sizes(), q.sizes()) << dtype_name(dt);
    EXPECT_TRUE(at::equal(g.dq, at::zeros_like(q))) << dtype_name(dt) << ": dq must be 0 without keys";
    EXPECT_EQ(g.dk.numel(), 0) << dtype_name(dt);
  }
}

}  // namespace
