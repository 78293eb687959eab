// The byte-level GPT (the seed's model) as torch::nn modules.
//   tokens (B, T) int64 -> embedding (256 -> C) + learned positions (max_seq_len)
//   -> depth x [x + Attention(LayerNorm(x)), x + FeedForward(LayerNorm(x))]
//   -> LayerNorm -> logits (B, T, 256)
// Attention: to_q, to_k, to_v (C -> NH * HS, no bias), the attention, to_out (NH * HS -> C, no bias).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "model/config.h"

namespace flashcos::model {

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C), causal

 private:
  ModelConfig cfg_;
  torch::nn::Linear to_q_{nullptr}, to_k_{nullptr}, to_v_{nullptr}, to_out_{nullptr};
};
TORCH_MODULE(Attention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& cfg);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::LayerNorm norm_attn_{nullptr}, norm_ff_{nullptr};
  Attention attn_{nullptr};
  torch::nn::Linear ff_in_{nullptr}, ff_out_{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& tokens);  // (B, T) int64 -> (B, T, vocab) logits
  // Mean cross entropy (nats) of predicting window[:, 1:] from window[:, :-1]; window (B, T + 1).
  torch::Tensor loss(const torch::Tensor& window);
  const ModelConfig& config() const { return cfg_; }

 private:
  // The residual stream after the last block, before the final norm: (B, T) -> (B, T, C).
  torch::Tensor trunk(const torch::Tensor& tokens);
  ModelConfig cfg_;
  torch::nn::Embedding token_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm norm_out_{nullptr};
  torch::nn::Linear to_logits_{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace flashcos::model
