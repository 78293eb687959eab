// The captured training micro-step (model/train_graph.h) against eager micro-steps: the same
// gradients accumulated over the same batches, and the capture contract's errors (GPU); when the
// trainer leaves it off and the in-place gradient zeroing it relies on (CPU).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "model/autocast.h"
#include "model/config.h"
#include "model/gpt.h"
#include "model/train_graph.h"
#include "tests/attention_test_util.h"

namespace {

using flashcos::model::AutocastScope;
using flashcos::model::GPT;
using flashcos::model::GraphStreamScope;
using flashcos::model::ModelConfig;
using flashcos::model::TrainStepGraph;
using flashcos::model::train_graph_compiled;
using flashcos::model::train_graph_off_reason;
using flashcos::model::zero_grads_in_place;

// dim 128, 2 heads of 64 (the Hopper kernels' head size on an H100), fused attention and ops.
ModelConfig graph_config() {
  ModelConfig c;
  c.dim = 128, c.depth = 2, c.heads = 2, c.dim_head = 64, c.max_seq_len = 200;
  c.attention_impl = "fused";
  return c;
}

at::Tensor micro_step(GPT& model, const at::Tensor& window, double accum) {
  at::Tensor loss;
  {
    AutocastScope autocast(true, torch::kCUDA, at::kBFloat16);
    loss = model->loss(window) / accum;
  }
  loss.backward();
  return loss.detach();
}

TEST(TrainGraphCuda, ReplaysAccumulateTheGradientsOfEagerMicroSteps) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const auto dev = torch::Device(torch::kCUDA);
  torch::manual_seed(11);
  GPT eager(graph_config());
  eager->to(dev);
  GPT graphed(graph_config());
  graphed->to(dev);
  {
    torch::NoGradGuard ng;
    auto pa = eager->parameters(), pb = graphed->parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  // 2 steps of 3 micro-batches (odd length 127 + 1), fresh random bytes each.
  const int64_t accum = 3;
  std::vector<at::Tensor> batches;
  for (int i = 0; i < 2 * accum; ++i) {
    batches.push_back(torch::randint(0, 256, {2, 128}, torch::TensorOptions().dtype(torch::kLong)).pin_memory());
  }
  std::vector<double> eager_loss, graph_loss;
  for (int step = 0; step < 2; ++step) {
    eager->zero_grad(false);
    for (int m = 0; m < accum; ++m) eager_loss.push_back(micro_step(eager, batches[step * accum + m].to(dev), accum).item<double>());
  }
  std::vector<at::Tensor> eager_grads;
  for (auto& p : eager->parameters()) eager_grads.push_back(p.grad().clone());

  GraphStreamScope scope(dev);
  TrainStepGraph graph([&](const at::Tensor& w) { return micro_step(graphed, w, accum); });
  for (int step = 0; step < 2; ++step) {
    graphed->zero_grad(false);
    for (int m = 0; m < accum; ++m) {
      const at::Tensor& b = batches[step * accum + m];
      // The first micro-step runs eagerly, so that every gradient exists before the capture.
      graph_loss.push_back(step == 0 && m == 0 ? micro_step(graphed, b.to(dev), accum).item<double>()
                                               : graph.run(b).item<double>());
    }
  }
  for (size_t i = 0; i < eager_loss.size(); ++i) {
    EXPECT_NEAR(graph_loss[i], eager_loss[i], 2e-3 * std::abs(eager_loss[i])) << "micro-step " << i;
  }
  auto pb = graphed->parameters();
  ASSERT_EQ(pb.size(), eager_grads.size());
  for (size_t i = 0; i < pb.size(); ++i) {
    ASSERT_TRUE(pb[i].grad().defined()) << "parameter " << i;
    EXPECT_LT(flashcos::test::rel_err(pb[i].grad(), eager_grads[i]), 2e-2) << "parameter " << i << " of shape " << pb[i].sizes();
  }
  // Another batch shape is refused (the graph's input is static).
  EXPECT_THROW(graph.run(torch::zeros({1, 128}, torch::kLong)), std::invalid_argument);
}

// The projections' half-precision weight copies (fused::WeightCopy) are read by the captured
// micro-step: after the weights change (an optimiser step), GPT::refresh_weight_copies() makes
// replays compute with the new weights, as an eager micro-step of the same weights does.
TEST(TrainGraphCuda, ReplaysSeeWeightsRefreshedAfterTheyChange) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const auto dev = torch::Device(torch::kCUDA);
  torch::manual_seed(12);
  GPT eager(graph_config());
  eager->to(dev);
  GPT graphed(graph_config());
  graphed->to(dev);
  auto pa = eager->parameters(), pb = graphed->parameters();
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  auto batch = [] { return torch::randint(0, 256, {2, 128}, torch::TensorOptions().dtype(torch::kLong)).pin_memory(); };
  GraphStreamScope scope(dev);
  TrainStepGraph graph([&](const at::Tensor& w) { return micro_step(graphed, w, 1); });
  (void)micro_step(graphed, batch().to(dev), 1);  // eager: the copies and gradients exist before the capture
  (void)graph.run(batch());                        // capture and first replay
  for (int step = 0; step < 2; ++step) {
    {
      torch::NoGradGuard ng;
      for (size_t i = 0; i < pa.size(); ++i) {
        const at::Tensor delta = 0.05 * torch::randn_like(pa[i]);
        pa[i].add_(delta);
        pb[i].add_(delta);
      }
    }
    graphed->refresh_weight_copies();
    const at::Tensor b = batch();
    const double replayed = graph.run(b).item<double>();
    const double eager_loss = micro_step(eager, b.to(dev), 1).item<double>();
    EXPECT_NEAR(replayed, eager_loss, 2e-3 * std::abs(eager_loss)) << "step " << step;
  }
}

TEST(TrainGraph, OffReasonsNameWhatRulesTheGraphOut) {
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  EXPECT_EQ(train_graph_off_reason("off", cuda, false, false), "--cuda-graph off");
  EXPECT_EQ(train_graph_off_reason("auto", cpu, false, false), "not a CUDA device");
  EXPECT_EQ(train_graph_off_reason("on", cpu, false, false), "not a CUDA device");
  if (!train_graph_compiled()) {
    EXPECT_EQ(train_graph_off_reason("auto", cuda, false, false), "this build has no CUDA");
    return;
  }
  EXPECT_NE(train_graph_off_reason("auto", cuda, true, false).find("--grad-accum 1"), std::string::npos);
  EXPECT_NE(train_graph_off_reason("on", cuda, false, true).find("loss scale"), std::string::npos);
  EXPECT_EQ(train_graph_off_reason("auto", cuda, false, false), "");
  EXPECT_EQ(train_graph_off_reason("on", cuda, false, false), "");
}

TEST(TrainGraph, GradientsAreZeroedInTheirOwnStorage) {
  torch::manual_seed(3);
  auto a = torch::randn({7, 5}, torch::requires_grad()), b = torch::randn({3}, torch::requires_grad()),
       unused = torch::randn({2}, torch::requires_grad());
  (a.sum() * 2 + (b * b).sum()).backward();
  const void* a_storage = a.grad().data_ptr();
  const void* b_storage = b.grad().data_ptr();
  ASSERT_GT(a.grad().abs().sum().item<double>(), 0.0);
  zero_grads_in_place({a, b, unused});
  EXPECT_EQ(a.grad().data_ptr(), a_storage);
  EXPECT_EQ(b.grad().data_ptr(), b_storage);
  EXPECT_EQ(a.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(b.grad().abs().sum().item<double>(), 0.0);
  EXPECT_FALSE(unused.grad().defined());
}

TEST(TrainGraphCuda, CaptureOnTheDefaultStreamIsRefused) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  TrainStepGraph graph([](const at::Tensor& w) { return w.sum(); });
  EXPECT_THROW(graph.run(torch::zeros({2, 8}, torch::kLong)), std::logic_error);
}

}  // namespace
