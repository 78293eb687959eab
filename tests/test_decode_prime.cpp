// The prime through the static decode step instead of the prefill (model/generate.cpp,
// prime_through_decode; on CUDA for primes of at most kDecodePrimeMax bytes): which path a prime
// takes, a decoder from empty rings against forward_cached step by step from position 0, and on the
// CPU in float32 the same bytes as the prefill and as the uncached path (greedy and seeded top-k),
// forced with SampleOptions::Prime::kDecode. On CUDA (skipped without a device): the automatic
// choice decodes a 128-byte prime and gives the prefill's bytes in float32.
#include <gtest/gtest.h>

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

using flashcos::model::KVCache;
using flashcos::model::SampleOptions;
using flashcos::model::StaticDecoder;
using flashcos::test::make_model;
using flashcos::test::rel_err;
using flashcos::test::small;

}  // namespace

TEST(DecodePrime, PathChoice) {
  auto cfg = small("rope", "cosine");
  cfg.max_seq_len = 8192;
  const at::Device cpu(at::kCPU), cuda(at::kCUDA, 0);
  SampleOptions so;
  using flashcos::model::prime_through_decode;
  EXPECT_TRUE(prime_through_decode(so, cfg, cuda, 128));
  EXPECT_TRUE(prime_through_decode(so, cfg, cuda, flashcos::model::kDecodePrimeMax));
  EXPECT_FALSE(prime_through_decode(so, cfg, cuda, flashcos::model::kDecodePrimeMax + 1));
  EXPECT_FALSE(prime_through_decode(so, cfg, cpu, 128));  // the CPU prefills
  auto short_ctx = cfg;
  short_ctx.max_seq_len = 24;  // the prime is cropped to the context first
  EXPECT_TRUE(prime_through_decode(so, short_ctx, cuda, 100000));
  auto learned = cfg;
  learned.pos = "learned";  // no static step
  EXPECT_FALSE(prime_through_decode(so, learned, cuda, 128));
  so.prime = SampleOptions::Prime::kDecode;
  EXPECT_TRUE(prime_through_decode(so, cfg, cpu, 4096));
  EXPECT_FALSE(prime_through_decode(so, learned, cpu, 128));
  so.prime = SampleOptions::Prime::kPrefill;
  EXPECT_FALSE(prime_through_decode(so, cfg, cuda, 128));
  so.prime = SampleOptions::Prime::kAuto;
  so.use_cache = false;
  EXPECT_FALSE(prime_through_decode(so, cfg, cuda, 128));
  so.use_cache = true, so.static_decode = false;
  EXPECT_FALSE(prime_through_decode(so, cfg, cuda, 128));
}

// From empty rings, step by step the logits equal forward_cached's (position 0 on), past max_seq_len.
TEST(DecodePrime, EmptyDecoderMatchesForwardCached) {
  for (const char* att : {"cosine", "exp", "softmax"}) {
    auto m = make_model(small("rope", att), 5);
    torch::NoGradGuard no_grad;
    const auto tokens = torch::randint(0, 256, {1, 60}, torch::kLong);
    KVCache ref;
    StaticDecoder dec(m, at::kFloat);
    EXPECT_EQ(dec.next_pos(), 0);
    for (int64_t t = 0; t < tokens.size(1); ++t) {
      const auto want = m->forward_cached(tokens.narrow(1, t, 1), ref).select(1, 0);
      const auto got = dec.step(tokens[0][t].item<int64_t>());
      ASSERT_LT(rel_err(got, want), 1e-5) << att << " position " << t;
    }
  }
}

// generate() with the prime decoded: the bytes of the prefill and of the uncached path (CPU, fp32),
// for primes of 1, 9 and 24 (= max_seq_len) bytes and one longer than the context (cropped).
TEST(DecodePrime, SameBytesAsPrefillAndUncached) {
  for (const char* pos : {"rope", "none"}) {
    for (const char* att : {"cosine", "exp", "softmax"}) {
      auto m = make_model(small(pos, att), 47);
      for (int64_t n : {1, 9, 24, 40}) {
        const auto prime = torch::randint(0, 256, {1, n}, torch::kLong);
        for (double thres : {0.999, 0.9}) {  // greedy (top 1), and top-k at temperature 0.8
          SampleOptions so;
          so.length = 30;
          so.filter_thres = thres;
          so.temperature = 0.8;
          so.seed = 7;
          flashcos::model::GenerateInfo di, pi, wi;
          so.prime = SampleOptions::Prime::kDecode;
          const auto a = flashcos::model::generate(m, prime, so, nullptr, &di);
          so.prime = SampleOptions::Prime::kPrefill;
          const auto b = flashcos::model::generate(m, prime, so, nullptr, &pi);
          so.use_cache = false;
          const auto c = flashcos::model::generate(m, prime, so, nullptr, &wi);
          EXPECT_EQ(di.prime, "decode step");
          EXPECT_EQ(pi.prime, "prefill");
          EXPECT_EQ(wi.prime, "window");
          EXPECT_EQ(di.decode, "static");
          const std::string what = std::string(pos) + " " + att + " prime " + std::to_string(n) + " thres " +
                                   std::to_string(thres);
          EXPECT_TRUE(at::equal(a, b)) << what;
          if (n + so.length <= 24) {  // within one context
            EXPECT_TRUE(at::equal(a, c)) << what;
          }
        }
      }
    }
  }
}

// CUDA: kAuto decodes a 128-byte prime there and gives the prefill's bytes in float32.
TEST(DecodePrimeCuda, AutoDecodesShortPrimesWithThePrefillsBytes) {
  if (!torch::cuda::is_available() || !flashcos::model::decode_graph_compiled()) {
    GTEST_SKIP() << "needs a CUDA device and a CUDA build";
  }
  flashcos::model::ModelConfig cfg;
  cfg.dim = 512, cfg.depth = 2, cfg.heads = 8, cfg.dim_head = 64, cfg.max_seq_len = 1024;
  cfg.pos = "rope", cfg.attention = "cosine", cfg.attention_impl = "plain";
  auto m = make_model(cfg, 3);
  m->to(torch::kCUDA);
  const auto prime = torch::randint(0, 256, {1, 128}, torch::kLong).to(torch::kCUDA);
  SampleOptions so;
  so.length = 200;
  so.temperature = 0.9;
  so.seed = 99;
  flashcos::model::GenerateInfo ai, pi;
  const auto a = flashcos::model::generate(m, prime, so, nullptr, &ai);
  so.prime = SampleOptions::Prime::kPrefill;
  const auto b = flashcos::model::generate(m, prime, so, nullptr, &pi);
  EXPECT_EQ(ai.prime, "decode step");
  EXPECT_EQ(pi.prime, "prefill");
  EXPECT_TRUE(at::equal(a, b));
}
