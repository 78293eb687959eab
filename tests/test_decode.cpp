// The static-shape decode step (model/decode_step.h) against the concatenating cached path
// (GPT::forward_cached), on the CPU in float32: the same logits at every step (within 1e-5), past
// max_seq_len for a one-block model (where both equal the re-run window), from a one-token prime,
// and the same bytes through generate(). On CUDA (skipped without a device): the CUDA-graph decoder
// gives the bytes of the uncaptured step for a seed, and logits within tolerance of it.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "model/decode_graph.h"
#include "model/decode_step.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "tests/attention_test_util.h"
#include "tests/model_test_util.h"

namespace {

using flashcos::model::GPT;
using flashcos::model::KVCache;
using flashcos::model::ModelConfig;
using flashcos::model::StaticDecoder;
using flashcos::test::rel_err;
using flashcos::test::small;
using flashcos::test::make_model;

struct DecodeCase {
  std::string pos, attention;
  int64_t groups, depth, prime;
};

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> out;
  for (const char* pos : {"rope", "none"}) {
    for (const char* att : {"cosine", "exp", "softmax"}) {
      out.push_back({pos, att, 1, 2, 9});
      out.push_back({pos, att, 1, 1, 1});  // T = 1 prime, one block, far past max_seq_len
    }
  }
  out.push_back({"rope", "cosine", 2, 2, 5});
  out.push_back({"rope", "exp", 4, 1, 24});  // a prefill of exactly max_seq_len
  out.push_back({"rope", "softmax", 2, 3, 1});
  return out;
}

std::string name_of(const DecodeCase& c) {
  return c.pos + " " + c.attention + " groups " + std::to_string(c.groups) + " depth " + std::to_string(c.depth) +
         " prime " + std::to_string(c.prime);
}

class StaticDecode : public ::testing::TestWithParam<DecodeCase> {};

// Step by step the static decoder's logits equal forward_cached's (which slides its cache the same
// way), through 3 x max_seq_len positions: every ring slot is overwritten twice.
TEST_P(StaticDecode, SameLogitsAsTheCachedPath) {
  const auto c = GetParam();
  auto m = make_model(small(c.pos, c.attention, c.groups, c.depth), 31);
  torch::NoGradGuard no_grad;
  const int64_t total = 3 * 24 + 5;
  const auto tokens = torch::randint(0, 256, {1, total}, torch::kLong);
  KVCache ref;
  auto first = m->forward_cached(tokens.narrow(1, 0, c.prime), ref);
  StaticDecoder dec(m, ref, at::kFloat);
  EXPECT_EQ(dec.next_pos(), c.prime);
  for (int64_t t = c.prime; t < total; ++t) {
    const auto want = m->forward_cached(tokens.narrow(1, t, 1), ref).select(1, 0);
    const auto got = dec.step(tokens[0][t].item<int64_t>());
    ASSERT_EQ(got.sizes(), want.sizes());
    ASSERT_EQ(got.scalar_type(), at::kFloat);
    ASSERT_LT(rel_err(got, want), 1e-5) << name_of(c) << " position " << t;
    if (c.depth == 1) {  // one block: also the re-run window's last row
      const int64_t start = std::max<int64_t>(0, t + 1 - 24);
      const auto window = m->forward(tokens.narrow(1, start, t + 1 - start));
      ASSERT_LT(rel_err(got, window.select(1, window.size(1) - 1)), 1e-4) << name_of(c) << " position " << t;
    }
  }
  EXPECT_EQ(dec.next_pos(), total);
}

// generate(): the static step gives the bytes of the cached path (greedy and seeded top-k at
// temperature 0.8), past max_seq_len.
TEST_P(StaticDecode, GenerateSameBytesAsTheCachedPath) {
  const auto c = GetParam();
  auto m = make_model(small(c.pos, c.attention, c.groups, c.depth), 47);
  const auto prime = torch::randint(0, 256, {1, c.prime}, torch::kLong);
  for (double thres : {0.999, 0.9}) {
    flashcos::model::SampleOptions so;
    so.length = 61;
    so.filter_thres = thres;
    so.temperature = 0.8;
    so.seed = 7;
    flashcos::model::GenerateInfo fast, slow;
    so.static_decode = true;
    const auto a = flashcos::model::generate(m, prime, so, nullptr, &fast);
    so.static_decode = false;
    const auto b = flashcos::model::generate(m, prime, so, nullptr, &slow);
    EXPECT_EQ(fast.decode, "static");
    EXPECT_EQ(slow.decode, "cached");
    ASSERT_EQ(a.numel(), 61);
    EXPECT_TRUE(at::equal(a, b)) << name_of(c) << " thres " << thres;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, StaticDecode, ::testing::ValuesIn(decode_cases()));

// Writing a key into the ring must not disturb the other slots, and a bf16 decoder stays close to
// the float32 one (the autocast dtype of the trainer's samples).
TEST(StaticDecodeDtype, Bf16CloseToFloat32) {
  auto m = make_model(small("rope", "cosine", 1, 2), 5);
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(0, 256, {1, 40}, torch::kLong);
  KVCache a, b;
  m->forward_cached(tokens.narrow(1, 0, 3), a);
  m->forward_cached(tokens.narrow(1, 0, 3), b);
  StaticDecoder f32(m, a, at::kFloat), bf16(m, b, at::kBFloat16);
  for (int64_t t = 3; t < 40; ++t) {
    const int64_t tok = tokens[0][t].item<int64_t>();
    const auto x = f32.step(tok).clone();
    const auto y = bf16.step(tok);
    EXPECT_EQ(y.scalar_type(), at::kFloat);
    ASSERT_LT(rel_err(y, x), 5e-2) << "position " << t;
  }
}

TEST(StaticDecodeErrors, UnsupportedModelsAndCaches) {
  EXPECT_FALSE(StaticDecoder::supports(small("learned", "cosine", 1, 1)));
  EXPECT_FALSE(StaticDecoder::supports(small("rope", "fastmax", 1, 1)));
  EXPECT_TRUE(StaticDecoder::supports(small("none", "softmax", 1, 1)));
  auto learned = make_model(small("learned", "cosine", 1, 1), 3);
  KVCache cache;
  {
    torch::NoGradGuard no_grad;
    learned->forward_cached(torch::zeros({1, 2}, torch::kLong), cache);
  }
  EXPECT_THROW(StaticDecoder(learned, cache, at::kFloat), std::invalid_argument);
  auto rope = make_model(small("rope", "cosine", 1, 1), 3);
  EXPECT_THROW(StaticDecoder(rope, KVCache(), at::kFloat), std::invalid_argument);  // no prefill
  {  // a token outside the vocabulary is refused before anything runs
    KVCache one;
    torch::NoGradGuard no_grad;
    rope->forward_cached(torch::zeros({1, 2}, torch::kLong), one);
    StaticDecoder dec(rope, one, at::kFloat);
    EXPECT_THROW(dec.step(256), std::invalid_argument);
    EXPECT_THROW(dec.step(-1), std::invalid_argument);
    EXPECT_EQ(dec.next_pos(), 2);
    EXPECT_EQ(dec.device_position(), 2);
    EXPECT_EQ(dec.step(255).size(1), 256);
    EXPECT_EQ(dec.device_position(), 3);
  }
  // Learned positions keep the cached path in generate().
  flashcos::model::SampleOptions so;
  so.length = 4;
  flashcos::model::GenerateInfo info;
  flashcos::model::generate(learned, torch::zeros({1, 2}, torch::kLong), so, nullptr, &info);
  EXPECT_EQ(info.decode, "cached");
}

// CUDA: the graph decoder against the uncaptured static step on the same device, the default
// model's shape (dim 512, 8 heads x 64) at a short max_seq_len so the ring wraps; float32 and bf16.
TEST(GraphDecodeCuda, SameBytesAsUncaptured) {
  if (!torch::cuda::is_available() || !flashcos::model::decode_graph_compiled()) {
    GTEST_SKIP() << "needs a CUDA device and a CUDA build";
  }
  ModelConfig cfg;
  cfg.dim = 512, cfg.depth = 4, cfg.heads = 8, cfg.dim_head = 64, cfg.max_seq_len = 256;
  cfg.pos = "rope", cfg.attention = "cosine", cfg.attention_impl = "plain";
  auto m = make_model(cfg, 11);
  m->to(torch::kCUDA);
  torch::NoGradGuard no_grad;
  const auto prime = torch::randint(0, 256, {1, 37}, torch::kLong).to(torch::kCUDA);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    // Logits step by step over a fixed token stream (600 positions: the ring wraps twice).
    KVCache a, b;
    m->forward_cached(prime, a);
    m->forward_cached(prime, b);
    auto graph = flashcos::model::make_graph_decoder(m, a, dtype);
    StaticDecoder eager(m, b, dtype);
    const auto stream = torch::randint(0, 256, {600}, torch::kLong);
    for (int64_t t = 0; t < 600; ++t) {
      const int64_t tok = stream[t].item<int64_t>();
      const auto x = eager.step(tok).cpu();
      const auto y = graph->step(tok).cpu();
      ASSERT_LT(rel_err(y, x), dtype == at::kFloat ? 1e-5 : 1e-2) << "step " << t;
    }
    EXPECT_EQ(graph->name(), "cuda graph");
    // Bytes through generate() for a seed, graph on / off.
    flashcos::model::SampleOptions so;
    so.length = 700;
    so.temperature = 0.9;
    so.seed = 1234;
    flashcos::model::GenerateInfo gi, ei;
    torch::Tensor with_graph, without;
    {
      at::autocast::set_autocast_enabled(at::kCUDA, dtype != at::kFloat);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      so.cuda_graph = true;
      with_graph = flashcos::model::generate(m, prime, so, nullptr, &gi);
      so.cuda_graph = false;
      without = flashcos::model::generate(m, prime, so, nullptr, &ei);
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
    }
    EXPECT_EQ(gi.decode, "cuda graph");
    EXPECT_EQ(ei.decode, "static");
    EXPECT_TRUE(at::equal(with_graph, without)) << c10::toString(dtype);
  }
}

// CUDA: the graph decoder with the fused step (one-row linears with the embedding lookup folded
// into the first launch and the position advance into the last, fused attention; programmatic
// dependent launch between them on sm_90) against the same step run eagerly: the same kernels on
// the same inputs, so the same logits bit for bit, and one position per step on the device; in
// float32 also against the torch-op step (within 1e-5). 100 steps at max_seq_len 40: the ring wraps.
TEST(GraphDecodeCuda, FusedStepSameAsEagerStep) {
  if (!torch::cuda::is_available() || !flashcos::model::decode_graph_compiled()) {
    GTEST_SKIP() << "needs a CUDA device and a CUDA build";
  }
  ModelConfig cfg;
  cfg.dim = 64, cfg.depth = 3, cfg.heads = 2, cfg.dim_head = 32, cfg.max_seq_len = 40;
  cfg.pos = "rope", cfg.attention = "cosine", cfg.attention_impl = "plain";
  auto m = make_model(cfg, 19);
  m->to(torch::kCUDA);
  torch::NoGradGuard no_grad;
  const auto prime = torch::randint(0, 256, {1, 5}, torch::kLong).to(torch::kCUDA);
  const auto stream = torch::randint(0, 256, {100}, torch::kLong);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    KVCache a, b, c;
    m->forward_cached(prime, a);
    m->forward_cached(prime, b);
    m->forward_cached(prime, c);
    auto graph = flashcos::model::make_graph_decoder(m, a, dtype);
    StaticDecoder eager(m, b, dtype), ops(m, c, dtype);
    if (!eager.fused_linear()) GTEST_SKIP() << "the fused decode step is switched off (FLASHCOS_DECODE_*=0)";
    ASSERT_TRUE(graph->fused_linear());
    ops.set_fused_attention(false);
    for (int64_t t = 0; t < stream.size(0); ++t) {
      const int64_t tok = stream[t].item<int64_t>();
      const auto y = graph->step(tok).cpu();
      const auto x = eager.step(tok).cpu();
      const auto r = ops.step(tok).cpu();
      ASSERT_TRUE(at::equal(y, x)) << c10::toString(dtype) << " step " << t << ", rel err " << rel_err(y, x);
      if (dtype == at::kFloat) {
        ASSERT_LT(rel_err(x, r), 1e-5) << "step " << t;
      }
      ASSERT_EQ(graph->device_position(), 5 + t + 1) << c10::toString(dtype) << " step " << t;
      ASSERT_EQ(graph->next_pos(), 5 + t + 1);
    }
    EXPECT_EQ(graph->name(), "cuda graph");
  }
}

}  // namespace
