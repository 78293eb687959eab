// The byte-level GPT (the seed's model) as torch::nn modules.
//   tokens (B, T) int64 -> embedding (256 -> C) (+ learned positions (max_seq_len) with --pos learned)
//   -> depth x [x + Attention(LayerNorm(x)), x + FeedForward(LayerNorm(x))]
//   -> LayerNorm -> logits (B, T, 256)
// Attention: to_q, to_k, to_v (C -> NH * HS, no bias), the attention, to_out (NH * HS -> C, no bias).
// With --pos rope, q and k are rotated after their l2norm (flashcos/rotary.h): fused into the l2norm
// kernels on the packed CUDA path, libtorch ops under every other --attention-impl.
//
// Cached decoding (model/generate.cpp): forward_cached runs new tokens against each block's cache
// of keys and values, the keys stored as the attention takes them (normalised, rotated at their
// absolute positions). With rope or no positions the cache slides (keeps the last max_seq_len keys);
// with learned positions it holds at most max_seq_len tokens.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <utility>
#include <vector>

#include "model/config.h"
#include "model/fused/weight_copy.h"

namespace flashcos::model {

// One block's cached keys and values, (1, NH, L, HS) each (undefined while empty).
struct LayerCache {
  torch::Tensor k, v;
};
struct KVCache {
  std::vector<LayerCache> layers;
  int64_t next_pos = 0;  // absolute position of the next token
};

class AttentionImpl : public torch::nn::Module {
 public:
  // initialise false: the projections' weights are allocated, not initialised (GPTImpl).
  explicit AttentionImpl(const ModelConfig& cfg, bool initialise = true);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C), causal
  // x (1, n, C): n new tokens at absolute positions pos .. pos + n - 1, appended to `cache`
  // (which must then hold the tokens before pos, or be empty); inference only.
  torch::Tensor forward_cached(const torch::Tensor& x, LayerCache& cache, int64_t pos);
  void set_attention_impl(const std::string& impl) { cfg_.attention_impl = impl; }
  // Re-copies the projections' half-precision weight copies (fused::WeightCopy::refresh).
  void refresh_weight_copies();

 private:
  // q, k (B, NH, T, HS) as the attention core takes them, in torch ops: l2-normalised (cosine, exp)
  // and rotated (rope) with positions starting at pos.
  std::pair<torch::Tensor, torch::Tensor> prepare_qk(torch::Tensor q, torch::Tensor k, int64_t pos) const;
  torch::Tensor attend_prepared(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const;
  ModelConfig cfg_;
  torch::nn::Linear to_q_{nullptr}, to_k_{nullptr}, to_v_{nullptr}, to_out_{nullptr};
  fused::WeightCopy qkv_copy_, out_copy_;  // the fused path's GEMM copies (gpt.cpp, project)
};
TORCH_MODULE(Attention);

// The residual stream between blocks: x, plus the last block's feed-forward output `pending`
// (undefined when none) that the next LayerNorm adds in the same pass as it normalises (one
// fused add + LayerNorm kernel on CUDA, model/fused/add_layer_norm.h) instead of a separate
// float32 add over the whole stream. With the fused operators, `pending` comes from ff_out's GEMM
// run without its bias and `pending_bias` is that bias (ff_out.bias itself), which the same kernel
// adds (in float32) and whose gradient its backward sums; on the composite path (CPU,
// FLASHCOS_FUSED_OPS=0) pending already holds the bias (libtorch's linear) and pending_bias is
// undefined. The stream itself is x + (pending + pending_bias).
struct Residual {
  torch::Tensor x, pending, pending_bias;
};

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& cfg, bool initialise = true);
  // x + attn(norm_attn(x)), then + ff(norm_ff(.)), with x = in.x + in.pending; the feed-forward's
  // output is returned as `pending`, not yet added.
  Residual forward(const Residual& in);
  torch::Tensor forward_cached(torch::Tensor x, LayerCache& cache, int64_t pos);
  void set_attention_impl(const std::string& impl) { attn_->set_attention_impl(impl); }
  void refresh_weight_copies();

 private:
  torch::nn::LayerNorm norm_attn_{nullptr}, norm_ff_{nullptr};
  Attention attn_{nullptr};
  torch::nn::Linear ff_in_{nullptr}, ff_out_{nullptr};
  fused::WeightCopy ff_in_copy_, ff_out_copy_;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  // initialise false skips the GPT-style init (~0.1 s on a CPU at dim 512 / depth 8) and libtorch's
  // own default init of the Linear and Embedding layers (another ~0.1 s) for a model whose weights
  // are about to be replaced (loading a checkpoint): their parameters are allocated, of the right
  // shapes, with undefined contents (the LayerNorms keep their 1 / 0).
  explicit GPTImpl(const ModelConfig& cfg, bool initialise = true);
  torch::Tensor forward(const torch::Tensor& tokens);  // (B, T) int64 -> (B, T, vocab) logits
  // Mean cross entropy (nats) of predicting window[:, 1:] from window[:, :-1]; window (B, T + 1).
  torch::Tensor loss(const torch::Tensor& window);
  // tokens (1, n) -> logits (1, n, vocab) of n new tokens after those already in `cache` (an empty
  // KVCache: a prefill). Throws std::invalid_argument when the model cannot cache (fastmax) or a
  // learned-position model would pass max_seq_len.
  torch::Tensor forward_cached(const torch::Tensor& tokens, KVCache& cache);
  // Whether forward_cached can take `n` more tokens after cache.next_pos.
  bool can_cache(int64_t next_pos, int64_t n) const;
  const ModelConfig& config() const { return cfg_; }
  // Another attention implementation for the same weights (sample / eval pick it once the device
  // is known); throws std::invalid_argument (ModelConfig::validate's words) when the config
  // cannot run it.
  void set_attention_impl(const std::string& impl);
  // On the fused CUDA path the projections (q / k / v, out, the feed-forward's two) run their GEMMs
  // from half-precision weight copies made once per optimiser step (fused::WeightCopy): they are
  // re-copied when a weight's version counter moves, and by this call, which a caller that replays
  // a captured forward after changing the weights must make (the trainer: after every optimiser
  // step). Nothing to do where no copy was made.
  void refresh_weight_copies();

 private:
  // The residual stream after the last block, before the final norm: (B, T) -> (B, T, C).
  Residual trunk(const torch::Tensor& tokens);
  ModelConfig cfg_;
  torch::nn::Embedding token_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm norm_out_{nullptr};
  torch::nn::Linear to_logits_{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace flashcos::model
