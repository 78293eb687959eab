// ModelConfig::parameters_at_least (the trainer's up-front memory check refuses a model whose
// weights, gradients and Adam state alone pass the device's memory): a lower bound on the parameters
// the model really has, and a close one, so that the check never refuses a model that fits and still
// catches one that cannot.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "model/config.h"
#include "model/gpt.h"

namespace {

TEST(ModelSizeBound, IsACloseLowerBoundOfTheParameters) {
  struct Case {
    int64_t dim, depth, heads, dim_head;
    const char* pos;
  };
  for (const Case& c : {Case{32, 2, 4, 8, "rope"}, Case{48, 3, 2, 32, "learned"}, Case{64, 1, 8, 16, "none"},
                        Case{96, 2, 3, 40, "rope"}}) {
    flashcos::model::ModelConfig cfg;
    cfg.dim = c.dim, cfg.depth = c.depth, cfg.heads = c.heads, cfg.dim_head = c.dim_head, cfg.pos = c.pos;
    cfg.max_seq_len = 64;
    cfg.validate();
    flashcos::model::GPT gpt(cfg);
    double actual = 0;
    for (const auto& p : gpt->parameters()) actual += static_cast<double>(p.numel());
    const double bound = cfg.parameters_at_least();
    EXPECT_LE(bound, actual) << "dim " << c.dim << " depth " << c.depth;
    EXPECT_GE(bound, 0.85 * actual) << "dim " << c.dim << " depth " << c.depth;
  }
}

}  // namespace
