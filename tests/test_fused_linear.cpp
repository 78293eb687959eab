// fused::linear_from_copy and fused::WeightCopy (model/fused/linear.h, weight_copy.h): forward and
// gradients against float64 references, the weight gradient accumulated into .grad (or handed to
// autograd where something hooks it, or where autograd::grad asks for it), the copy's refresh
// rules. CPU cases run everywhere; the CUDA cases (the cuBLAS float32-output GEMM) skip without a
// device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>

#include <string>
#include <tuple>
#include <vector>

#include "model/fused/grad_accumulate.h"
#include "model/fused/linear.h"
#include "model/fused/switch.h"
#include "model/fused/weight_copy.h"
#include "model/optim.h"
#include "tests/fused_ops_test_util.h"

namespace {

namespace fused = flashcos::model::fused;
namespace ft = flashcos::test;

std::vector<at::Tensor> make_weights(const std::vector<int64_t>& rows, int64_t in, const at::TensorOptions& o) {
  std::vector<at::Tensor> ws;
  for (int64_t r : rows) ws.push_back((at::randn({r, in}, o.dtype(at::kFloat)) * 0.1).requires_grad_(true));
  return ws;
}

// One case: x (N, in) in x_dtype, the weights' rows, on `device`; checks y, dx and every dW against
// float64 on the rounded inputs, the dW added to a random pre-existing .grad (or set where none).
void check_case(const at::Device& device, at::ScalarType x_dtype, int64_t N, int64_t in,
                const std::vector<int64_t>& rows, bool preset_grads, double tol) {
  const auto o = at::TensorOptions().device(device);
  auto ws = make_weights(rows, in, o);
  std::vector<at::Tensor> g0(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    if (preset_grads) {
      g0[i] = at::randn(ws[i].sizes(), o.dtype(at::kFloat));
      ws[i].mutable_grad() = g0[i].clone();
    }
  }
  fused::WeightCopy copy;
  int64_t out = 0;
  for (int64_t r : rows) out += r;
  std::vector<at::Tensor> dw_ref(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    if (preset_grads) dw_ref[i] = g0[i].to(at::kDouble);
  }
  // Two passes: the second adds to the gradients the first wrote (or set up).
  for (int pass = 0; pass < 2; ++pass) {
    const at::Tensor x = at::randn({N, in}, o.dtype(at::kFloat)).to(x_dtype).requires_grad_(true);
    const at::Tensor& c = copy.get(ws, x_dtype);
    const at::Tensor y = fused::linear_from_copy(x, c, ws);
    ASSERT_EQ(y.sizes(), at::IntArrayRef({N, out}));
    ASSERT_EQ(y.scalar_type(), x_dtype);
    const at::Tensor dy = at::randn({N, out}, o.dtype(at::kFloat)).to(x_dtype);
    y.backward(dy);

    const at::Tensor xd = x.detach().to(at::kDouble), cd = c.to(at::kDouble), dyd = dy.to(at::kDouble);
    const at::Tensor y_ref = at::mm(xd, cd.t()), dx_ref = at::mm(dyd, cd);
    EXPECT_LE(ft::max_abs_diff(y, y_ref), tol * (1 + ft::max_abs(y_ref))) << "y, pass " << pass;
    ASSERT_TRUE(x.grad().defined());
    EXPECT_LE(ft::max_abs_diff(x.grad(), dx_ref), tol * (1 + ft::max_abs(dx_ref))) << "dx, pass " << pass;
    int64_t row = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
      const at::Tensor dw = at::mm(dyd.narrow(1, row, rows[i]).t(), xd);
      row += rows[i];
      dw_ref[i] = dw_ref[i].defined() ? dw_ref[i] + dw : dw;
      ASSERT_TRUE(ws[i].grad().defined()) << "weight " << i;
      EXPECT_EQ(ws[i].grad().scalar_type(), at::kFloat);
      EXPECT_EQ(ws[i].grad().sizes(), ws[i].sizes());
      // dW accumulates in float32 from exactly rounded products: float32 tolerance on the rounded inputs.
      EXPECT_LE(ft::max_abs_diff(ws[i].grad(), dw_ref[i]), 1e-5 * (1 + ft::max_abs(dw_ref[i])) * std::sqrt(double(N)))
          << "dW " << i << ", pass " << pass;
    }
  }
}

TEST(LinearFromCopy, CpuFloat64AndFloat32MatchReference) {
  for (auto dt : {at::kDouble, at::kFloat}) {
    for (int64_t N : {1, 63, 127, 1000}) {
      for (bool preset : {false, true}) {
        check_case(at::kCPU, dt, N, 40, {24}, preset, dt == at::kDouble ? 1e-12 : 1e-5);
        check_case(at::kCPU, dt, N, 16, {8, 8, 8}, preset, dt == at::kDouble ? 1e-12 : 1e-5);
      }
    }
  }
}

// x whose last dim is not contiguous (a transposed view): the Function keeps a unit-stride copy.
TEST(LinearFromCopy, TransposedInputMatchesReference) {
  auto ws = make_weights({6}, 9, at::TensorOptions());
  fused::WeightCopy copy;
  const at::Tensor base = at::randn({9, 11}).requires_grad_(true);
  const at::Tensor x = base.t();  // (11, 9), strides (1, 11)
  const at::Tensor y = fused::linear_from_copy(x, copy.get(ws, at::kFloat), ws);
  const at::Tensor dy = at::randn({11, 6});
  y.backward(dy);
  EXPECT_LE(ft::max_abs_diff(y, at::mm(x.detach(), ws[0].detach().t())), 1e-5);
  EXPECT_LE(ft::max_abs_diff(base.grad().t(), at::mm(dy, ws[0].detach())), 1e-5);
  EXPECT_LE(ft::max_abs_diff(ws[0].grad(), at::mm(dy.t(), x.detach())), 1e-5);
}

TEST(LinearFromCopy, HookedWeightGetsItsGradientThroughAutograd) {
  auto ws = make_weights({6, 10}, 5, at::TensorOptions());
  int calls = 0;
  at::Tensor seen;
  ws[1].register_hook([&](const at::Tensor& g) {
    ++calls;
    seen = g.clone();
    return g;
  });
  fused::WeightCopy copy;
  const at::Tensor x = at::randn({7, 5}).requires_grad_(true);
  const at::Tensor y = fused::linear_from_copy(x, copy.get(ws, at::kFloat), ws);
  const at::Tensor dy = at::randn({7, 16});
  y.backward(dy);
  EXPECT_EQ(calls, 1);
  const at::Tensor dw1 = at::mm(dy.narrow(1, 6, 10).t(), x.detach());
  ASSERT_TRUE(seen.defined());
  EXPECT_LE(ft::max_abs_diff(seen, dw1), 1e-5);
  EXPECT_LE(ft::max_abs_diff(ws[1].grad(), dw1), 1e-5);
  EXPECT_LE(ft::max_abs_diff(ws[0].grad(), at::mm(dy.narrow(1, 0, 6).t(), x.detach())), 1e-5);
}

// Data parallel's Reducer hooks each parameter's gradient accumulator (a post hook that all-reduces
// what was accumulated): the hook must run once per backward and find the gradient in .grad (the
// Function then hands the gradient to autograd's accumulation, grad_accumulate.h).
struct CountingPostHook : torch::autograd::FunctionPostHook {
  explicit CountingPostHook(int* calls, const at::Tensor* w, at::Tensor* grad_seen, bool* input_defined = nullptr)
      : calls_(calls), w_(w), grad_seen_(grad_seen), input_defined_(input_defined) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& inputs) override {
    ++*calls_;
    *grad_seen_ = w_->grad().clone();
    if (input_defined_) *input_defined_ = !inputs.empty() && inputs[0].defined();
    return outputs;
  }
  int* calls_;
  const at::Tensor* w_;
  at::Tensor* grad_seen_;
  bool* input_defined_;
};

TEST(LinearFromCopy, AccumulatorPostHookSeesTheAccumulatedGradient) {
  auto ws = make_weights({6, 10}, 5, at::TensorOptions());
  int calls = 0;
  at::Tensor seen;
  // Held for the test, as the Reducer holds its accumulators (the variable keeps only a weak one).
  const auto accumulator = torch::autograd::impl::grad_accumulator(ws[0]);
  accumulator->add_post_hook(std::make_unique<CountingPostHook>(&calls, &ws[0], &seen));
  fused::WeightCopy copy;
  const at::Tensor x = at::randn({7, 5}).requires_grad_(true);
  const at::Tensor dy = at::randn({7, 16});
  fused::linear_from_copy(x, copy.get(ws, at::kFloat), ws).backward(dy);
  EXPECT_EQ(calls, 1) << "the accumulator's post hook did not run once";
  const at::Tensor dw0 = at::mm(dy.narrow(1, 0, 6).t(), x.detach());
  ASSERT_TRUE(seen.defined());
  EXPECT_LE(ft::max_abs_diff(seen, dw0), 1e-5);
  EXPECT_LE(ft::max_abs_diff(ws[1].grad(), at::mm(dy.narrow(1, 6, 10).t(), x.detach())), 1e-5);
}

// The trainer's no_sync micro-steps: inside IdleAccumulatorPostHooks the weight gradient is added
// into .grad by the Function itself, and autograd's accumulator gets no gradient (its post hook
// still runs, with an undefined input: the Reducer's returns at once then); after the scope, the
// next backward hands the gradient to autograd's accumulation again and the hook sees the sum of
// both micro-steps.
TEST(LinearFromCopy, IdlePostHooksLetTheFunctionAddIntoGradThenTheHookSeesTheSum) {
  auto ws = make_weights({6, 10}, 5, at::TensorOptions());
  int calls = 0;
  at::Tensor seen;
  const auto accumulator = torch::autograd::impl::grad_accumulator(ws[0]);
  bool hook_input_defined = false;
  accumulator->add_post_hook(std::make_unique<CountingPostHook>(&calls, &ws[0], &seen, &hook_input_defined));
  for (auto& w : ws) w.mutable_grad() = at::randn(w.sizes());  // accumulated by earlier micro-steps
  const at::Tensor g0 = ws[0].grad().clone(), g1 = ws[1].grad().clone();
  const void* storage = ws[0].grad().data_ptr();
  fused::WeightCopy copy;
  const at::Tensor xa = at::randn({7, 5}).requires_grad_(true), xb = at::randn({3, 5}).requires_grad_(true);
  const at::Tensor dya = at::randn({7, 16}), dyb = at::randn({3, 16});
  {
    fused::IdleAccumulatorPostHooks idle;
    {
      at::NoGradGuard no_grad;  // as in a backward
      EXPECT_TRUE(fused::grad_accumulates_here(ws[0]));
    }
    fused::linear_from_copy(xa, copy.get(ws, at::kFloat), ws).backward(dya);
  }
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(hook_input_defined) << "the Function handed the hooked gradient to autograd inside the idle scope";
  EXPECT_EQ(ws[0].grad().data_ptr(), storage) << ".grad was replaced instead of added into";
  {
    at::NoGradGuard no_grad;
    EXPECT_FALSE(fused::grad_accumulates_here(ws[0])) << "the scope is closed: the hook must be honoured";
  }
  fused::linear_from_copy(xb, copy.get(ws, at::kFloat), ws).backward(dyb);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(hook_input_defined) << "outside the scope the gradient must go through the hooked accumulator";
  const auto dw = [&](const at::Tensor& dy, const at::Tensor& x, int64_t row, int64_t rows) {
    return at::mm(dy.narrow(1, row, rows).t(), x.detach());
  };
  const at::Tensor want0 = g0 + dw(dya, xa, 0, 6) + dw(dyb, xb, 0, 6);
  ASSERT_TRUE(seen.defined());
  EXPECT_LE(ft::max_abs_diff(seen, want0), 1e-5) << "the hook did not see both micro-steps' sum";
  EXPECT_LE(ft::max_abs_diff(ws[0].grad(), want0), 1e-5);
  EXPECT_LE(ft::max_abs_diff(ws[1].grad(), g1 + dw(dya, xa, 6, 10) + dw(dyb, xb, 6, 10)), 1e-5);
}

TEST(LinearFromCopy, AutogradGradReturnsWeightGradsAndLeavesDotGradAlone) {
  auto ws = make_weights({4}, 3, at::TensorOptions());
  fused::WeightCopy copy;
  const at::Tensor x = at::randn({5, 3}).requires_grad_(true);
  const at::Tensor y = fused::linear_from_copy(x, copy.get(ws, at::kFloat), ws);
  const at::Tensor dy = at::randn({5, 4});
  const auto g = torch::autograd::grad({y}, {ws[0]}, {dy});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_LE(ft::max_abs_diff(g[0], at::mm(dy.t(), x.detach())), 1e-5);
  EXPECT_FALSE(ws[0].grad().defined());
  EXPECT_FALSE(x.grad().defined());
}

TEST(LinearFromCopy, BadInputsNameTheProblem) {
  auto ws = make_weights({4}, 3, at::TensorOptions());
  const at::Tensor x = at::randn({5, 3});
  try {
    fused::linear_from_copy(x, at::randn({4, 2}), ws);
    FAIL() << "a copy of the wrong width was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be (out, in)"), std::string::npos) << e.what();
  }
  try {
    fused::linear_from_copy(x, at::randn({5, 3}), ws);
    FAIL() << "a copy with more rows than the weights was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows must be the copy's"), std::string::npos) << e.what();
  }
  try {
    fused::linear_from_copy(x, at::randn({4, 3}, at::kDouble), ws);
    FAIL() << "a copy of another dtype was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must match x"), std::string::npos) << e.what();
  }
}

TEST(WeightCopy, FollowsInPlaceWritesAndKeepsItsStorage) {
  auto ws = make_weights({3, 2}, 4, at::TensorOptions());
  fused::WeightCopy copy;
  const at::Tensor first = copy.get(ws, at::kDouble);
  const void* storage = first.data_ptr();
  EXPECT_EQ(ft::max_abs_diff(first, at::cat({ws[0], ws[1]}, 0)), 0.0);
  {
    at::NoGradGuard no_grad;
    ws[1].add_(1.0);  // an in-place write moves the version counter
  }
  const at::Tensor& second = copy.get(ws, at::kDouble);
  EXPECT_EQ(second.data_ptr(), storage);
  EXPECT_EQ(ft::max_abs_diff(second, at::cat({ws[0], ws[1]}, 0)), 0.0);
  // refresh() re-copies without asking the version counters (a write they do not see).
  {
    at::NoGradGuard no_grad;
    ws[0].data().mul_(3.0);
  }
  copy.refresh();
  EXPECT_EQ(copy.copy().data_ptr(), storage);
  EXPECT_EQ(ft::max_abs_diff(copy.copy(), at::cat({ws[0], ws[1]}, 0)), 0.0);
  // Another dtype: a new copy.
  EXPECT_EQ(copy.get(ws, at::kFloat).scalar_type(), at::kFloat);
}

TEST(WeightCopy, TheTrainersAdamStepMovesTheVersionCounter) {
  // The trainer refreshes after every step anyway; this is the safety net for eager forwards.
  auto ws = make_weights({3}, 4, at::TensorOptions());
  flashcos::model::FusedAdam adam(ws, torch::optim::AdamOptions(0.1));
  fused::WeightCopy copy;
  const at::Tensor before = copy.get(ws, at::kDouble).clone();
  ws[0].mutable_grad() = at::ones_like(ws[0]);
  adam.step();
  const at::Tensor& after = copy.get(ws, at::kDouble);
  EXPECT_GT(ft::max_abs_diff(after, before), 0.01);
  EXPECT_EQ(ft::max_abs_diff(after, ws[0]), 0.0);
}

class LinearFromCopyCuda : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, bool>> {
 protected:
  void SetUp() override {
    if (!ft::fused_kernels_on_gpu()) GTEST_SKIP() << "needs a CUDA device and a build with the CUDA kernels";
  }
};

TEST_P(LinearFromCopyCuda, ForwardAndGradsVsFp64) {
  const auto [dt, N, preset] = GetParam();
  at::manual_seed(1000 + N);
  check_case(at::Device(at::kCUDA), dt, N, 520, {512}, preset, 1e-2);
  check_case(at::Device(at::kCUDA), dt, N, 72, {64, 64, 64}, preset, 1e-2);
  check_case(at::Device(at::kCUDA), dt, N, 24, {40}, preset, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Cases, LinearFromCopyCuda,
                         ::testing::Combine(::testing::Values(at::kBFloat16, at::kHalf),
                                            ::testing::Values<int64_t>(1, 63, 127, 1000),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == at::kHalf ? "fp16" : "bf16") + "_n" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_accumulate" : "_fresh");
                         });

}  // namespace
