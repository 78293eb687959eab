// Small GPT models for the generation / decode tests (test_kv_cache, test_decode, test_decode_kernel).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/gpt.h"

namespace flashcos::test {

// dim 32, 2 heads of 16, max_seq_len 24 (or as given), plain attention; exp attention gets scale 2
// (exp(scale q.k) unnormalised stays in range).
inline model::ModelConfig small(const std::string& pos, const std::string& attention, int64_t groups = 1,
                                int64_t depth = 2, int64_t max_seq_len = 24) {
  model::ModelConfig c;
  c.dim = 32, c.depth = depth, c.heads = 2, c.dim_head = 16, c.max_seq_len = max_seq_len;
  c.pos = pos, c.attention = attention, c.l2norm_groups = groups, c.attention_impl = "plain";
  if (attention == "exp") c.attn_scale = 2.0;
  return c;
}

// The checkpoint and model-build tests' model: small() with a context of 64.
inline model::ModelConfig small_ctx64(const std::string& pos) { return small(pos, "cosine", 1, 2, 64); }

// Random weights with more spread than the N(0, 0.02) init, so attention is far from uniform.
inline model::GPT make_model(const model::ModelConfig& cfg, uint64_t seed) {
  torch::manual_seed(seed);
  model::GPT m(cfg);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.add_(torch::randn_like(p) * 0.2);
  m->eval();
  return m;
}

}  // namespace flashcos::test
