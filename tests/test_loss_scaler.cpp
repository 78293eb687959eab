// fp16 dynamic loss scaling (model/loss_scaler.h) on CPU tensors: gradients are unscaled against
// a float64 reference, an overflowing step is skipped (weights untouched, scale halved), the scale
// grows after the clean-step interval, and a checkpoint with a non-finite weight is never written.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <unistd.h>

#include "model/checkpoint.h"
#include "model/gpt.h"
#include "model/loss_scaler.h"

namespace fm = flashcos::model;

namespace {

std::vector<at::Tensor> random_grads(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> g;
  for (int64_t n : {1, 63, 127, 1000}) g.push_back(torch::randn({n}) * 1000);
  return g;
}

TEST(LossScaler, FiniteGradsAreUnscaledAndTheStepIsTaken) {
  auto grads = random_grads(11);
  std::vector<at::Tensor> ref;
  for (auto& g : grads) ref.push_back(g.to(torch::kDouble) / 1024.0);
  double scale = 1024;
  int64_t good = 5;
  ASSERT_TRUE(fm::unscale_grads_and_update_scale(grads, scale, good));
  EXPECT_EQ(scale, 1024);
  EXPECT_EQ(good, 6);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(grads[i].to(torch::kDouble), ref[i], 1e-6, 1e-9)) << "grad " << i;
  }
}

TEST(LossScaler, AnOverflowSkipsTheStepAndHalvesTheScale) {
  for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    auto grads = random_grads(12);
    grads[2][126] = bad;  // the last element of the 127-long gradient
    double scale = 65536;
    int64_t good = 1999;
    EXPECT_FALSE(fm::unscale_grads_and_update_scale(grads, scale, good)) << bad;
    EXPECT_EQ(scale, 32768);
    EXPECT_EQ(good, 0);

    // The trainer's use: an optimiser step only when the scaler allows it, so weights stay finite.
    auto w = torch::randn({127});
    const auto before = w.clone();
    w.mutable_grad() = grads[2];
    torch::optim::Adam opt({w}, torch::optim::AdamOptions(0.1));
    if (fm::unscale_grads_and_update_scale(grads, scale, good)) opt.step();
    EXPECT_TRUE(torch::equal(w, before));
    EXPECT_TRUE(torch::isfinite(w).all().item<bool>());
  }
}

TEST(LossScaler, ScaleGrowsAfterTheIntervalAndNeverDropsBelowOne) {
  auto grads = random_grads(13);
  double scale = 8;
  int64_t good = 0;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(fm::unscale_grads_and_update_scale(grads, scale, good, 4));
  EXPECT_EQ(scale, 8);
  ASSERT_TRUE(fm::unscale_grads_and_update_scale(grads, scale, good, 4));
  EXPECT_EQ(scale, 16);
  EXPECT_EQ(good, 0);
  grads[0][0] = std::numeric_limits<float>::infinity();
  double tiny = 1;
  EXPECT_FALSE(fm::unscale_grads_and_update_scale(grads, tiny, good));
  EXPECT_EQ(tiny, 1);
}

TEST(LossScaler, NonFiniteWeightsAreNeverSaved) {
  fm::ModelConfig mc;
  mc.dim = 16;
  mc.depth = 1;
  mc.heads = 2;
  mc.dim_head = 8;
  mc.max_seq_len = 16;
  fm::GPT gpt(mc);
  const std::string path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/flashcos_nan_" +
                           std::to_string(getpid()) + ".pt";
  fm::TrainState state;
  state.step = 3;
  fm::save_checkpoint(path, gpt, nullptr, mc, state);
  {
    torch::NoGradGuard no_grad;
    gpt->parameters()[1].view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  }
  state.step = 4;
  EXPECT_THROW(fm::save_checkpoint(path, gpt, nullptr, mc, state), std::runtime_error);
  EXPECT_EQ(fm::read_checkpoint_meta(path).state.step, 3);  // the last good checkpoint is kept
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::remove(path.c_str());
}

}  // namespace
