// The model's full configuration: everything needed to rebuild a GPT from a checkpoint alone.
#pragma once

#include <cstdint>
#include <string>

namespace flashcos::model {

struct ModelConfig {
  int64_t vocab = 256;           // bytes
  int64_t dim = 512;             // C
  int64_t depth = 8;             // blocks
  int64_t heads = 8;             // NH
  int64_t dim_head = 64;         // HS
  int64_t max_seq_len = 8192;    // training context: learned positions, the KV cache's window
  double attn_scale = 10.0;      // cosine-sim attention scale
  int64_t l2norm_groups = 1;     // groups of the l2norm of q and k
  std::string attention = "cosine";     // cosine | exp | softmax | fastmax
  // Positions: rope (rotary, q and k rotated after their l2norm, per l2norm group; DESIGN.md),
  // learned (an absolute position embedding of max_seq_len rows), none. Checkpoints written
  // before this field existed hold learned positions.
  std::string pos = "rope";
  double rope_base = 10000.0;
  std::string attention_impl = "plain"; // plain | sdpa | tiled | fused
  // The fused attention backward in its deterministic mode (AttentionOptions::deterministic): bit-identical
  // gradients from run to run, and with it the whole training step (the other kernels, the embedding
  // table's gradient included, sum in a fixed order); a run-time choice like attention_impl (weights do
  // not depend on it).
  bool deterministic = false;
  // Fastmax (attention == "fastmax"): f(x) = a0 + a1 x (+ a2 x^2 when p = 2), x = q.k / temperature.
  int64_t fastmax_p = 2;
  double fastmax_a0 = 1.0, fastmax_a1 = 1.0, fastmax_a2 = 0.5, fastmax_temperature = 1.0;
  bool fastmax_normalize = true;

  // Throws std::invalid_argument naming the bad field.
  void validate() const;
  // A lower bound on the model's parameter count: the blocks' q, k, v, out and feed-forward weights
  // and the token embedding and classifier (no biases, norms or positions).
  double parameters_at_least() const;
  std::string to_json() const;
  static ModelConfig from_json(const std::string& json);  // throws std::runtime_error
  int64_t num_parameters() const;
};

}  // namespace flashcos::model
