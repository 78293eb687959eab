// fused::embedding (model/fused/embedding.h): the lookup, and the table's gradient from the two
// kernels against a float64 reference (repeated tokens, odd sizes, tables the kernels do not take),
// added into an existing .grad or handed to autograd, and bit-identical from one backward to the
// next on the same inputs. CPU cases (libtorch's path) run everywhere.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>
#include <tuple>

#include "model/fused/embedding.h"
#include "model/fused/switch.h"
#include "tests/fused_ops_test_util.h"

namespace {

namespace fused = flashcos::model::fused;
namespace ft = flashcos::test;

// Two backward passes through fused::embedding; the table's gradient against float64 sums.
void check_embedding(const at::Device& device, int64_t N, int64_t V, int64_t C, bool preset, double tol) {
  const auto o = at::TensorOptions().device(device);
  at::Tensor w = at::randn({V, C}, o.dtype(at::kFloat)).requires_grad_(true);
  at::Tensor want;
  if (preset) {
    w.mutable_grad() = at::randn({V, C}, o.dtype(at::kFloat));
    want = w.grad().to(at::kDouble).cpu().clone();
  } else {
    want = at::zeros({V, C}, at::kDouble);
  }
  for (int pass = 0; pass < 2; ++pass) {
    // Skewed token counts: row 0 takes about a third of the tokens, many rows none.
    at::Tensor idx = at::randint(0, V, {N}, o.dtype(at::kLong));
    idx = at::where(at::rand({N}, o) < 0.3, at::zeros_like(idx), idx);
    const at::Tensor out = fused::embedding(idx.view({1, N}), w);
    ASSERT_EQ(out.sizes(), at::IntArrayRef({1, N, C}));
    EXPECT_EQ(ft::max_abs_diff(out.view({N, C}), w.detach().index_select(0, idx)), 0.0);
    const at::Tensor dout = at::randn({1, N, C}, o.dtype(at::kFloat));
    out.backward(dout);
    want.index_add_(0, idx.cpu(), dout.view({N, C}).to(at::kDouble).cpu());
    ASSERT_TRUE(w.grad().defined());
    EXPECT_LE(ft::max_abs_diff(w.grad(), want), tol * (1 + ft::max_abs(want))) << "pass " << pass;
  }
}

TEST(FusedEmbedding, CpuMatchesFloat64Sums) {
  for (int64_t N : {1, 63, 1000}) {
    check_embedding(at::kCPU, N, 256, 8, false, 1e-5);
    check_embedding(at::kCPU, N, 7, 6, true, 1e-5);
  }
}

TEST(FusedEmbedding, BadInputsNameTheProblem) {
  const at::Tensor w = at::randn({4, 3});
  EXPECT_THROW(fused::embedding(at::zeros({2}, at::kFloat), w), c10::Error);
  EXPECT_THROW(fused::embedding(at::zeros({2}, at::kLong), at::randn({4})), c10::Error);
}

class FusedEmbeddingCuda : public ft::PoisonedGpuTest<std::tuple<int64_t, int64_t, int64_t, bool>> {};

TEST_P(FusedEmbeddingCuda, GradMatchesFloat64Sums) {
  const auto [N, V, C, preset] = GetParam();
  at::manual_seed(N * 7 + V + C);
  const at::Tensor probe = at::empty({V, C}, at::TensorOptions().device(at::kCUDA).dtype(at::kFloat));
  // V 256 / 100 with an even width take the kernels; V 300 and odd widths libtorch's path.
  EXPECT_EQ(fused::embedding_grad_uses_kernel(probe), V <= 256 && C % 2 == 0);
  check_embedding(at::Device(at::kCUDA), N, V, C, preset, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Cases, FusedEmbeddingCuda,
                         ::testing::Values(std::make_tuple(int64_t(1), int64_t(256), int64_t(512), false),
                                           std::make_tuple(int64_t(63), int64_t(256), int64_t(512), true),
                                           std::make_tuple(int64_t(127), int64_t(100), int64_t(520), false),
                                           std::make_tuple(int64_t(1000), int64_t(256), int64_t(66), true),
                                           std::make_tuple(int64_t(40000), int64_t(256), int64_t(512), true),
                                           std::make_tuple(int64_t(1000), int64_t(300), int64_t(64), false),
                                           std::make_tuple(int64_t(1000), int64_t(256), int64_t(7), true)),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) + "_v" +
                                  std::to_string(std::get<1>(info.param)) + "_c" +
                                  std::to_string(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) ? "_accumulate" : "_fresh");
                         });

// The same backward twice, on the same inputs: bit-identical gradients (the kernels add in a fixed
// order), fresh and added into a .grad. Skewed tokens: about 90% of them one byte, the rest uniform.
class FusedEmbeddingCudaRepeat : public ft::PoisonedGpuTest<int64_t> {};

TEST_P(FusedEmbeddingCudaRepeat, GradIsBitIdenticalAcrossRuns) {
  const int64_t N = GetParam(), V = 256, C = 512;
  at::manual_seed(N + 11);
  const auto o = at::TensorOptions().device(at::kCUDA);
  at::Tensor idx = at::randint(0, V, {N}, o.dtype(at::kLong));
  idx = at::where(at::rand({N}, o) < 0.9, at::full_like(idx, 32), idx);
  const at::Tensor w0 = at::randn({V, C}, o.dtype(at::kFloat));
  const at::Tensor preset = at::randn({V, C}, o.dtype(at::kFloat));
  const at::Tensor dout = at::randn({1, N, C}, o.dtype(at::kFloat));
  ASSERT_TRUE(fused::embedding_grad_uses_kernel(w0));
  const at::Tensor want = at::zeros({V, C}, at::kDouble).index_add_(0, idx.cpu(), dout.view({N, C}).to(at::kDouble).cpu());
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "fresh");
    at::Tensor grads[2];
    for (at::Tensor& g : grads) {
      at::Tensor w = w0.clone().requires_grad_(true);
      if (accumulate) w.mutable_grad() = preset.clone();
      fused::embedding(idx.view({1, N}), w).backward(dout);
      ASSERT_TRUE(w.grad().defined());
      g = w.grad().clone();
    }
    EXPECT_TRUE(at::equal(grads[0], grads[1]));
    const at::Tensor ref = accumulate ? want + preset.to(at::kDouble).cpu() : want;
    EXPECT_LE(ft::max_abs_diff(grads[0], ref), 1e-5 * (1 + ft::max_abs(ref)));
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, FusedEmbeddingCudaRepeat, ::testing::Values(int64_t(40000), int64_t(1), int64_t(63),
                                                                             int64_t(127), int64_t(1000)),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
