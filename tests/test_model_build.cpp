// GPT construction for a checkpoint's weights (initialise = false: parameters allocated, not
// initialised) and the attention implementation switched on a built model (sample / eval).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "model/gpt.h"
#include "tests/model_test_util.h"

using flashcos::model::GPT;

TEST(ModelBuild, UninitialisedModelHasTheSameLayoutAndComputesTheSame) {
  for (const std::string pos : {"rope", "learned"}) {
    torch::manual_seed(3);
    GPT a(flashcos::test::small_ctx64(pos), /*initialise=*/true);
    GPT b(flashcos::test::small_ctx64(pos), /*initialise=*/false);
    const auto pa = a->named_parameters(), pb = b->named_parameters();
    ASSERT_EQ(pa.size(), pb.size()) << pos;
    for (const auto& p : pa) {
      const auto* q = pb.find(p.key());
      ASSERT_NE(q, nullptr) << pos << " " << p.key();
      EXPECT_EQ(p.value().sizes(), q->sizes()) << pos << " " << p.key();
      EXPECT_EQ(p.value().requires_grad(), q->requires_grad()) << pos << " " << p.key();
      torch::NoGradGuard no_grad;
      q->copy_(p.value());
    }
    // Same weights, same logits and loss: the layers' options (shapes) came out right.
    const auto tokens = torch::randint(256, {2, 9}, torch::kLong);
    EXPECT_TRUE(torch::equal(a->forward(tokens), b->forward(tokens))) << pos;
    EXPECT_TRUE(torch::equal(a->loss(tokens), b->loss(tokens))) << pos;
  }
}

TEST(ModelBuild, SetAttentionImplSwitchesEveryBlockAndValidates) {
  torch::manual_seed(4);
  GPT model(flashcos::test::small_ctx64("rope"));
  model->eval();
  const auto tokens = torch::randint(256, {1, 17}, torch::kLong);
  torch::NoGradGuard no_grad;
  const auto plain = model->forward(tokens);
  model->set_attention_impl("tiled");
  EXPECT_EQ(model->config().attention_impl, "tiled");
  EXPECT_TRUE(torch::allclose(model->forward(tokens), plain, 1e-4, 1e-5));
  EXPECT_THROW(model->set_attention_impl("bogus"), std::invalid_argument);
  EXPECT_EQ(model->config().attention_impl, "tiled");  // unchanged after the refusal
}
