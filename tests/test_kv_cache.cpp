// Cached generation and positions in the model, on the CPU in float32: forward_cached (prefill +
// one token at a time) gives the logits of the full forward; the sliding cache (rope / none) gives
// the logits of the re-run window; generate() with and without the cache gives the same bytes
// (greedy and seeded temperature sampling, lengths past max_seq_len); one rope model gives the same
// logits under plain, tiled and sdpa; --pos is recorded in the config and old configs load as learned.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "model/generate.h"
#include "model/gpt.h"
#include "tests/attention_test_util.h"
#include "tests/model_test_util.h"

namespace {

using flashcos::model::GPT;
using flashcos::model::KVCache;
using flashcos::model::ModelConfig;
using flashcos::test::rel_err;
using flashcos::test::small;
using flashcos::test::make_model;

struct ModelCase {
  std::string pos, attention;
  int64_t groups;
};

std::vector<ModelCase> model_cases() {
  std::vector<ModelCase> out;
  for (const char* pos : {"rope", "learned", "none"}) {
    for (const char* att : {"cosine", "exp", "softmax"}) out.push_back({pos, att, 1});
  }
  out.push_back({"rope", "cosine", 2});
  out.push_back({"rope", "exp", 4});
  return out;
}

class KvCache : public ::testing::TestWithParam<ModelCase> {};

TEST_P(KvCache, CachedForwardEqualsFullForward) {
  const auto mc = GetParam();
  auto m = make_model(small(mc.pos, mc.attention, mc.groups), 17);
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(0, 256, {1, 24}, torch::kLong);
  const auto full = m->forward(tokens);
  KVCache cache;
  std::vector<at::Tensor> parts{m->forward_cached(tokens.narrow(1, 0, 9), cache)};
  for (int64_t t = 9; t < 24; ++t) parts.push_back(m->forward_cached(tokens.narrow(1, t, 1), cache));
  EXPECT_EQ(cache.next_pos, 24);
  EXPECT_LT(rel_err(at::cat(parts, 1), full), 1e-5) << mc.pos << " " << mc.attention;
}

// Identical bytes while the context fits max_seq_len (24 here: prime 7 + 17 bytes). Past it the
// sliding cache keeps keys that were computed with their own full context, which a re-run of the
// truncated window does not see from layer 2 on: the two agree past max_seq_len only for one
// block (checked with 60 bytes) and for learned positions (which fall back to the window).
TEST_P(KvCache, GenerateCachedEqualsUncached) {
  const auto mc = GetParam();
  struct Run {
    int64_t depth, length;
  };
  std::vector<Run> runs{{2, 17}, {1, 60}};
  if (mc.pos == "learned") runs.push_back({2, 60});
  for (const Run run : runs) {
    auto m = make_model(small(mc.pos, mc.attention, mc.groups, run.depth), 23);
    const auto prime = torch::randint(0, 256, {1, 7}, torch::kLong);
    for (double thres : {0.999, 0.9}) {  // greedy (top 1), then top-26 sampling at temperature 0.8
      flashcos::model::SampleOptions so;
      so.length = run.length;
      so.filter_thres = thres;
      so.temperature = 0.8;
      so.seed = 99;
      so.use_cache = true;
      const auto cached = flashcos::model::generate(m, prime, so);
      so.use_cache = false;
      const auto uncached = flashcos::model::generate(m, prime, so);
      ASSERT_EQ(cached.numel(), run.length);
      EXPECT_TRUE(at::equal(cached, uncached))
          << mc.pos << " " << mc.attention << " depth " << run.depth << " length " << run.length << " thres " << thres;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KvCache, ::testing::ValuesIn(model_cases()));

// With rope (or none) the cache keeps the last max_seq_len keys at their absolute positions: for one
// block (where a key depends on its own token only) the logits at step t equal the last row of the
// forward over the window tokens[t - 23 .. t]; the cache never grows past max_seq_len.
TEST(KvCacheSliding, EqualsTheReRunWindow) {
  for (const char* pos : {"rope", "none"}) {
    auto m = make_model(small(pos, "cosine", 2, /*depth=*/1), 5);
    torch::NoGradGuard no_grad;
    const int64_t L = 24;
    const auto tokens = torch::randint(0, 256, {1, 70}, torch::kLong);
    KVCache cache;
    m->forward_cached(tokens.narrow(1, 0, 10), cache);
    for (int64_t t = 10; t < 70; ++t) {
      const auto step = m->forward_cached(tokens.narrow(1, t, 1), cache).select(1, 0);
      const int64_t start = std::max<int64_t>(0, t + 1 - L);
      const auto window = m->forward(tokens.narrow(1, start, t + 1 - start));
      ASSERT_LT(rel_err(step, window.select(1, window.size(1) - 1)), 1e-4) << pos << " step " << t;
      ASSERT_LE(cache.layers[0].k.size(2), L);
    }
  }
}

TEST(KvCacheErrors, LearnedPositionsStopAtMaxSeqLenAndFastmaxDoesNotCache) {
  auto m = make_model(small("learned", "cosine"), 3);
  torch::NoGradGuard no_grad;
  KVCache cache;
  m->forward_cached(torch::randint(0, 256, {1, 24}, torch::kLong), cache);
  EXPECT_FALSE(m->can_cache(cache.next_pos, 1));
  EXPECT_THROW(m->forward_cached(torch::zeros({1, 1}, torch::kLong), cache), std::invalid_argument);
  auto f = make_model(small("rope", "fastmax"), 3);
  EXPECT_FALSE(f->can_cache(0, 1));
  // Still samples (the windowed path).
  flashcos::model::SampleOptions so;
  so.length = 5;
  EXPECT_EQ(flashcos::model::generate(f, torch::zeros({1, 3}, torch::kLong), so).numel(), 5);
}

// One rope model, the same logits under plain, tiled (the CPU path) and sdpa.
TEST(RopeModelCpu, SameLogitsUnderEveryImpl) {
  for (int64_t groups : {1, 2}) {
    for (const char* att : {"cosine", "exp"}) {
      auto cfg = small("rope", att, groups);
      cfg.max_seq_len = 80;
      auto ref = make_model(cfg, 41);
      torch::NoGradGuard no_grad;
      const auto tokens = torch::randint(0, 256, {2, 77}, torch::kLong);
      const auto logits = ref->forward(tokens);
      for (const char* impl : {"tiled", "sdpa"}) {
        if (std::string(att) == "exp" && std::string(impl) == "sdpa") continue;  // sdpa cannot do exp
        cfg.attention_impl = impl;
        GPT m(cfg);
        m->eval();
        auto dst = m->parameters(), src = ref->parameters();
        ASSERT_EQ(dst.size(), src.size());
        for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
        EXPECT_LT(rel_err(m->forward(tokens), logits), 1e-5) << impl << " " << att << " groups " << groups;
      }
    }
  }
}

TEST(PosConfig, RecordedInJsonAndOldConfigsLoadAsLearned) {
  auto c = small("rope", "cosine");
  c.rope_base = 500.0;
  const auto back = ModelConfig::from_json(c.to_json());
  EXPECT_EQ(back.pos, "rope");
  EXPECT_EQ(back.rope_base, 500.0);
  // A config written before the field existed.
  const std::string old =
      R"({"vocab":256,"dim":32,"depth":1,"heads":2,"dim_head":16,"max_seq_len":64,"attn_scale":10.0,)"
      R"("l2norm_groups":1,"attention":"cosine","attention_impl":"plain"})";
  EXPECT_EQ(ModelConfig::from_json(old).pos, "learned");
  // Learned positions hold a max_seq_len x dim embedding, rope none.
  GPT learned(small("learned", "cosine")), rope(small("rope", "cosine"));
  int64_t nl = 0, nr = 0;
  for (auto& p : learned->parameters()) nl += p.numel();
  for (auto& p : rope->parameters()) nr += p.numel();
  EXPECT_EQ(nl - nr, 24 * 32);
  EXPECT_EQ(nl, small("learned", "cosine").num_parameters());
  EXPECT_EQ(nr, small("rope", "cosine").num_parameters());
  auto bad = small("rope", "cosine");
  bad.pos = "alibi";
  EXPECT_THROW(bad.validate(), std::invalid_argument);
  bad = small("rope", "cosine", 8);  // group size 2: fine
  EXPECT_NO_THROW(bad.validate());
  bad.dim_head = 24, bad.l2norm_groups = 8;  // group size 3: odd
  EXPECT_THROW(bad.validate(), std::invalid_argument);
  bad = small("rope", "exp");
  bad.attention_impl = "sdpa";
  EXPECT_THROW(bad.validate(), std::invalid_argument);
}

}  // namespace
