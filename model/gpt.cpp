#include "model/gpt.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>


#include <ATen/SDPBackend.h>
#include <ATen/ops/_fused_sdp_choice.h>

#include <mutex>
#include <stdexcept>
#include <tuple>

#include <flashcos/attention.h>
#include <flashcos/fastmax.h>
#include "common/log.h"
#include "model/fused/add_layer_norm.h"
#include "model/fused/bias_gelu.h"
#include "model/fused/classifier_cross_entropy.h"
#include "model/fused/embedding.h"
#include "model/fused/linear.h"
#include "model/fused/switch.h"

namespace flashcos::model {
namespace F = torch::nn::functional;

namespace {

// --attention-impl sdpa: names, once per process, the backend libtorch picks for the model's
// actual q, k, v (shapes, strides, dtype), so that the trainer's speed can be read against the
// right bar (`./train bench` times each backend).
void log_sdpa_backend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale) {
  static std::once_flag once;
  std::call_once(once, [&] {
    if (!q.is_cuda()) return;
    const auto backend = static_cast<at::SDPBackend>(at::_fused_sdp_choice(q, k, v, {}, 0.0, true, scale));
    const char* name = backend == at::SDPBackend::cudnn_attention       ? "cudnn"
                       : backend == at::SDPBackend::flash_attention     ? "flash"
                       : backend == at::SDPBackend::efficient_attention ? "efficient"
                       : backend == at::SDPBackend::math                ? "math"
                                                                        : "other";
    log::info(std::string("  sdpa        libtorch picked the ") + name + " backend for q " +
              c10::str(q.sizes()) + " " + c10::toString(q.scalar_type()));
  });
}

// sum = x + (pending + pending_bias) (either undefined: left out) and LayerNorm(sum): on CUDA one
// fused kernel each way that writes the norm in the next GEMM's dtype (model/fused/
// add_layer_norm.h), else libtorch ops.
fused::AddLayerNormOut add_norm(const Residual& in, torch::nn::LayerNorm& norm) {
  const torch::Tensor &x = in.x, &r = in.pending, &bias = in.pending_bias;
  if (fused::fused_op_enabled(x, "norm")) {
    return fused::add_layer_norm(x, r, bias, norm->weight, norm->bias, norm->options.eps(), fused::activation_dtype(x));
  }
  // A bias comes only from the fused path (FLASHCOS_FUSED_OPS changed in between): r + bias first,
  // as the fused op adds it.
  auto sum = r.defined() ? x + (bias.defined() ? r + bias : r) : x;
  return {sum, norm(sum)};
}

// A Linear or Embedding as libtorch builds it (initialise), or with its parameters allocated but
// not initialised: libtorch's constructors always run their default init (kaiming_uniform_ and
// normal_, one core, ~0.1 s over the default model's 25M parameters), which a model about to take
// a checkpoint's weights does not need. Built at 1 x 1 (an init of one number), then given the
// real options and empty tensors of the real shapes in place (the registered parameters are the
// same tensors).
torch::nn::Linear make_linear(const torch::nn::LinearOptions& options, bool initialise) {
  if (initialise) return torch::nn::Linear(options);
  torch::nn::Linear layer(torch::nn::LinearOptions(1, 1).bias(options.bias()));
  torch::NoGradGuard no_grad;
  layer->options = options;
  layer->weight.set_(torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) layer->bias.set_(torch::empty({options.out_features()}));
  return layer;
}

// The training forward's attention options: causal, the scale, the deterministic backward; the
// cosine kind also its l2norm groups and rotary positions.
AttentionOptions training_attention_options(const ModelConfig& cfg) {
  auto opts = AttentionOptions().causal(true).scale(cfg.attn_scale).deterministic(cfg.deterministic);
  if (cfg.attention == "cosine") opts.groups(cfg.l2norm_groups).rotary(cfg.pos == "rope").rotary_base(cfg.rope_base);
  return opts;
}

torch::nn::Embedding make_embedding(int64_t count, int64_t dim, bool initialise) {
  if (initialise) return torch::nn::Embedding(count, dim);
  torch::nn::Embedding layer(1, 1);
  torch::NoGradGuard no_grad;
  layer->options.num_embeddings(count).embedding_dim(dim);
  layer->weight.set_(torch::empty({count, dim}));
  return layer;
}

// x cat(weights, 0)^T. On the fused path, for half-precision x (autocast's dtype, which the fused
// norms already write) and float32 weights, from `copy` (made once per optimiser step) with the
// weights' gradients accumulated by the weight-gradient GEMM (model/fused/linear.h); else
// libtorch's linear (under autocast, a cast of the weights on every call).
torch::Tensor project(const torch::Tensor& x, fused::WeightCopy& copy, const std::vector<torch::Tensor>& weights) {
  const bool half = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  if (x.is_cuda() && half && weights[0].scalar_type() == at::kFloat && fused::fused_op_enabled(x, "copies")) {
    return fused::linear_from_copy(x, copy.get(weights, x.scalar_type()), weights);
  }
  return F::linear(x, weights.size() == 1 ? weights[0] : torch::cat(weights, 0));
}

}  // namespace

AttentionImpl::AttentionImpl(const ModelConfig& cfg, bool initialise) : cfg_(cfg) {
  const int64_t inner = cfg.heads * cfg.dim_head;
  auto linear = [&](int64_t in, int64_t out) {
    return make_linear(torch::nn::LinearOptions(in, out).bias(false), initialise);
  };
  to_q_ = register_module("to_q", linear(cfg.dim, inner));
  to_k_ = register_module("to_k", linear(cfg.dim, inner));
  to_v_ = register_module("to_v", linear(cfg.dim, inner));
  to_out_ = register_module("to_out", linear(inner, cfg.dim));
}

std::pair<torch::Tensor, torch::Tensor> AttentionImpl::prepare_qk(torch::Tensor q, torch::Tensor k, int64_t pos) const {
  const bool rope = cfg_.pos == "rope";
  const int64_t G = cfg_.l2norm_groups;
  if (cfg_.attention == "cosine" || cfg_.attention == "exp") {
    if (rope) return {l2norm_rotary(q, G, cfg_.rope_base, pos), l2norm_rotary(k, G, cfg_.rope_base, pos)};
    return {l2norm(q, G), l2norm(k, G)};
  }
  // softmax / fastmax: q and k as projected, rotated in l2norm-group pairs all the same.
  if (rope) return {rotary(q, G, cfg_.rope_base, pos), rotary(k, G, cfg_.rope_base, pos)};
  return {q, k};
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), NH = cfg_.heads, HS = cfg_.dim_head;
  auto split_heads = [&](const torch::Tensor& t) { return t.view({B, T, NH, HS}).transpose(1, 2); };
  // One GEMM for q, k, v (the three Linears' weights stacked): under autocast x is cast to bf16
  // once instead of three times, and autograd keeps one bf16 copy of x, not three (64 MiB per
  // layer on the default model at seq 8192, batch 4). q, k, v are views into the (B, T, 3 inner)
  // result (last dim contiguous).
  const int64_t inner = NH * HS;
  const bool rope = cfg_.pos == "rope";
  auto qkv = project(x, qkv_copy_, {to_q_->weight, to_k_->weight, to_v_->weight});
  if (cfg_.attention == "cosine" && cfg_.attention_impl == "fused") {
    // The QKV entry point: the fused kernels read q, k, v in place from the projection, write o
    // in (B, T, heads, dim_head) order and return one packed gradient for it (attention.h); the
    // rotation runs inside its l2norm kernels.
    return project(cosine_sim_attention_qkv(qkv, NH, training_attention_options(cfg_).backend(Backend::kFused)),
                   out_copy_, {to_out_->weight});
  }
  auto q = split_heads(qkv.narrow(-1, 0, inner));  // (B, NH, T, HS)
  auto k = split_heads(qkv.narrow(-1, inner, inner));
  auto v = split_heads(qkv.narrow(-1, 2 * inner, inner));
  // Under autocast the projections already share one dtype; keep it explicit for the kernels.
  k = k.to(q.scalar_type());
  v = v.to(q.scalar_type());
  torch::Tensor o;
  if (cfg_.attention == "cosine") {
    auto opts = training_attention_options(cfg_);
    if (cfg_.attention_impl == "sdpa") {
      // Softmax is shift-invariant, so softmax(scale * q.k) on l2-normalised q, k is exactly the
      // cosine-sim attention (no key mask here, so no row is ever empty). q, k are normalised by
      // RMSNorm (one fused pass each way on CUDA) on their contiguous (B, T, heads, groups, gs)
      // projections: rms_norm(x) = sqrt(gs) x / |x| per group, so the scale becomes scale / gs.
      // The rotation commutes with that factor sqrt(gs).
      const int64_t G = cfg_.l2norm_groups, gs = HS / G;
      auto rms = [&](const torch::Tensor& t) {
        auto n = rms_normalize(t.view({B, T, NH * G, gs})).view({B, T, NH, HS}).transpose(1, 2);
        return rope ? rotary(n, G, cfg_.rope_base, 0) : n;
      };
      q = rms(q.transpose(1, 2));
      k = rms(k.transpose(1, 2));
      const double scale = cfg_.attn_scale / static_cast<double>(gs);
      log_sdpa_backend(q, k, v, scale);
      o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale);
    } else if (cfg_.attention_impl == "plain") {
      o = plain_cosine_sim_attention(q, k, v, opts);
    } else {
      o = cosine_sim_attention(q, k, v, opts.backend(cfg_.attention_impl == "fused" ? Backend::kFused : Backend::kTiled));
    }
  } else if (cfg_.attention == "exp") {
    // The unnormalised exp kind, o_i = sum_j exp(scale q_i.k_j) v_j, on l2-normalised (and rotated)
    // q, k, so that its logits stay in [-scale, scale] (attention/README.md: finite range).
    auto [qn, kn] = prepare_qk(q, k, 0);
    auto opts = training_attention_options(cfg_).kind(AttentionKind::kExp);
    if (cfg_.attention_impl == "plain") {
      o = plain_cosine_sim_attention(qn, kn, v, opts);
    } else {
      o = cosine_sim_attention(qn, kn, v, opts.backend(cfg_.attention_impl == "fused" ? Backend::kFused : Backend::kTiled));
    }
  } else if (cfg_.attention == "softmax") {
    std::tie(q, k) = prepare_qk(q, k, 0);
    if (cfg_.attention_impl == "sdpa") {
      log_sdpa_backend(q, k, v, 1.0 / std::sqrt(static_cast<double>(HS)));
      o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    } else {
      auto sim = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(HS));
      auto causal = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
      o = torch::matmul(sim.masked_fill(causal, -std::numeric_limits<double>::infinity()).softmax(-1), v);
    }
  } else {  // fastmax
    std::tie(q, k) = prepare_qk(q, k, 0);
    auto opts = FastmaxOptions()
                    .p(cfg_.fastmax_p)
                    .a0(cfg_.fastmax_a0)
                    .a1(cfg_.fastmax_a1)
                    .a2(cfg_.fastmax_a2)
                    .temperature(cfg_.fastmax_temperature)
                    .normalize(cfg_.fastmax_normalize)
                    .causal(true);
    if (cfg_.attention_impl == "plain") opts.backend(FastmaxBackend::kReference);
    o = fastmax_attention(q, k, v, opts);
  }
  return project(o.transpose(1, 2).reshape({B, T, NH * HS}), out_copy_, {to_out_->weight});
}

void AttentionImpl::refresh_weight_copies() {
  qkv_copy_.refresh();
  out_copy_.refresh();
}

torch::Tensor AttentionImpl::attend_prepared(const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& v) const {
  // q (1, NH, n, HS) against the cached k, v (1, NH, L, HS), L >= n, causal bottom-right aligned
  // (query i sits at key L - n + i). Plain libtorch ops: at one query row the work is two
  // matrix-vector products per head.
  if (cfg_.attention == "cosine" || cfg_.attention == "exp") {
    auto opts = AttentionOptions().causal(true).scale(cfg_.attn_scale).groups(cfg_.l2norm_groups).l2norm_qk(false);
    if (cfg_.attention == "exp") opts.kind(AttentionKind::kExp);
    return plain_cosine_sim_attention(q, k, v, opts);
  }
  TORCH_CHECK(cfg_.attention == "softmax", "cached attention: --attention ", cfg_.attention, " has no cached path");
  const int64_t n = q.size(2), L = k.size(2);
  auto sim = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(cfg_.dim_head));
  auto rows = torch::arange(n, q.options().dtype(torch::kLong)).unsqueeze(1) + (L - n);
  auto cols = torch::arange(L, q.options().dtype(torch::kLong)).unsqueeze(0);
  return torch::matmul(sim.masked_fill(cols > rows, -std::numeric_limits<double>::infinity()).softmax(-1), v);
}

torch::Tensor AttentionImpl::forward_cached(const torch::Tensor& x, LayerCache& cache, int64_t pos) {
  const int64_t B = x.size(0), n = x.size(1), NH = cfg_.heads, HS = cfg_.dim_head, inner = NH * HS;
  auto split_heads = [&](const torch::Tensor& t) { return t.view({B, n, NH, HS}).transpose(1, 2); };
  auto qkv = F::linear(x, torch::cat({to_q_->weight, to_k_->weight, to_v_->weight}, 0));
  auto q = split_heads(qkv.narrow(-1, 0, inner));
  auto k = split_heads(qkv.narrow(-1, inner, inner)).to(q.scalar_type());
  auto v = split_heads(qkv.narrow(-1, 2 * inner, inner)).to(q.scalar_type());
  auto [qp, kp] = prepare_qk(q, k, pos);
  cache.k = cache.k.defined() ? torch::cat({cache.k, kp.to(cache.k.scalar_type())}, 2) : kp.contiguous();
  cache.v = cache.v.defined() ? torch::cat({cache.v, v.to(cache.v.scalar_type())}, 2) : v.contiguous();
  // The window of the uncached model: the last max_seq_len keys (only rope / no positions get
  // here with more; their keys carry their own positions, so the cache just drops the oldest).
  const int64_t L = cache.k.size(2), keep = cfg_.max_seq_len;
  if (L > keep) {
    cache.k = cache.k.narrow(2, L - keep, keep);
    cache.v = cache.v.narrow(2, L - keep, keep);
  }
  auto o = attend_prepared(qp.to(cache.k.scalar_type()), cache.k, cache.v);
  return to_out_(o.to(x.scalar_type()).transpose(1, 2).reshape({B, n, inner}));
}

BlockImpl::BlockImpl(const ModelConfig& cfg, bool initialise) {
  norm_attn_ = register_module("norm_attn", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
  attn_ = register_module("attn", Attention(cfg, initialise));
  norm_ff_ = register_module("norm_ff", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
  ff_in_ = register_module("ff_in", make_linear(torch::nn::LinearOptions(cfg.dim, 4 * cfg.dim), initialise));
  ff_out_ = register_module("ff_out", make_linear(torch::nn::LinearOptions(4 * cfg.dim, cfg.dim), initialise));
}

Residual BlockImpl::forward(const Residual& in) {
  auto a = add_norm(in, norm_attn_);
  auto f = add_norm({a.sum, attn_(a.normed), {}}, norm_ff_);
  if (!fused::fused_op_enabled(f.normed, "gelu")) return {f.sum, ff_out_(F::gelu(ff_in_(f.normed))), {}};
  // Both feed-forward GEMMs without their biases: ff_in's joins its GELU in one op each way
  // (model/fused/bias_gelu.h, whose backward also sums its gradient), ff_out's rides along to the
  // next add + LayerNorm, which adds it and sums its gradient (model/fused/add_layer_norm.h).
  auto h = fused::bias_gelu(project(f.normed, ff_in_copy_, {ff_in_->weight}), ff_in_->bias);
  return {f.sum, project(h, ff_out_copy_, {ff_out_->weight}), ff_out_->bias};
}

void BlockImpl::refresh_weight_copies() {
  attn_->refresh_weight_copies();
  ff_in_copy_.refresh();
  ff_out_copy_.refresh();
}

torch::Tensor BlockImpl::forward_cached(torch::Tensor x, LayerCache& cache, int64_t pos) {
  x = x + attn_->forward_cached(norm_attn_(x), cache, pos);
  return x + ff_out_(F::gelu(ff_in_(norm_ff_(x))));
}

GPTImpl::GPTImpl(const ModelConfig& cfg, bool initialise) : cfg_(cfg) {
  cfg.validate();
  token_emb_ = register_module("token_emb", make_embedding(cfg.vocab, cfg.dim, initialise));
  if (cfg.pos == "learned") pos_emb_ = register_module("pos_emb", make_embedding(cfg.max_seq_len, cfg.dim, initialise));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.depth; ++i) blocks_->push_back(Block(cfg, initialise));
  norm_out_ = register_module("norm_out", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
  to_logits_ = register_module("to_logits", make_linear(torch::nn::LinearOptions(cfg.dim, cfg.vocab), initialise));
  // GPT-style init: N(0, 0.02) weights, zero biases; the initial loss is then ~ln(256).
  if (!initialise) return;
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    if (p.key().find("norm") != std::string::npos) continue;  // LayerNorms keep 1 / 0
    if (p.key().size() >= 4 && p.key().compare(p.key().size() - 4, 4, "bias") == 0) {
      p.value().zero_();
    } else {
      torch::nn::init::normal_(p.value(), 0.0, 0.02);
    }
  }
}

void GPTImpl::refresh_weight_copies() {
  for (const auto& block : *blocks_) block->as<Block>()->refresh_weight_copies();
}

void GPTImpl::set_attention_impl(const std::string& impl) {
  ModelConfig next = cfg_;
  next.attention_impl = impl;
  next.validate();
  cfg_ = next;
  for (const auto& block : *blocks_) block->as<Block>()->set_attention_impl(impl);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens) {
  const auto r = trunk(tokens);
  return to_logits_(add_norm(r, norm_out_).normed);
}

Residual GPTImpl::trunk(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  // On the fused path the table's gradient comes from two kernels (model/fused/embedding.h).
  auto x = fused::fused_op_enabled(tokens, "embedding") ? fused::embedding(tokens, token_emb_->weight) : token_emb_(tokens);
  if (cfg_.pos == "learned") {
    TORCH_CHECK(T <= cfg_.max_seq_len, "GPT: sequence of ", T, " tokens is longer than max_seq_len ",
                cfg_.max_seq_len, " (learned positions)");
    x = x + pos_emb_(torch::arange(T, tokens.options())).unsqueeze(0);
  }
  Residual r{x, {}, {}};
  for (const auto& block : *blocks_) r = block->as<Block>()->forward(r);
  return r;
}

bool GPTImpl::can_cache(int64_t next_pos, int64_t n) const {
  if (cfg_.attention == "fastmax") return false;
  if (cfg_.pos == "learned") return next_pos + n <= cfg_.max_seq_len;
  return next_pos + n <= (int64_t(1) << 24);  // rotary angles take exact float32 positions
}

torch::Tensor GPTImpl::forward_cached(const torch::Tensor& tokens, KVCache& cache) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == 1 && tokens.size(1) >= 1, "GPT forward_cached: tokens must be ",
              "(1, n), n >= 1, got ", tokens.sizes());
  const int64_t n = tokens.size(1);
  if (!can_cache(cache.next_pos, n)) {
    throw std::invalid_argument("GPT forward_cached: " + std::to_string(n) + " tokens at position " +
                                std::to_string(cache.next_pos) + " cannot be cached (attention " + cfg_.attention +
                                ", positions " + cfg_.pos + ", max_seq_len " + std::to_string(cfg_.max_seq_len) + ")");
  }
  TORCH_CHECK(n <= cfg_.max_seq_len && (n == 1 || cache.next_pos == 0), "GPT forward_cached: ", n, " tokens at ",
              "position ", cache.next_pos, ": a prefill of at most max_seq_len (", cfg_.max_seq_len,
              ") tokens into an empty cache, then one token at a time");
  if (cache.layers.empty()) cache.layers.resize(static_cast<size_t>(cfg_.depth));
  auto x = token_emb_(tokens);
  if (cfg_.pos == "learned") {
    x = x + pos_emb_(torch::arange(cache.next_pos, cache.next_pos + n, tokens.options())).unsqueeze(0);
  }
  size_t i = 0;
  for (const auto& block : *blocks_) x = block->as<Block>()->forward_cached(x, cache.layers[i++], cache.next_pos);
  cache.next_pos += n;
  return to_logits_(norm_out_(x));
}

torch::Tensor GPTImpl::loss(const torch::Tensor& window) {
  auto input = window.slice(1, 0, window.size(1) - 1);
  auto target = window.slice(1, 1, window.size(1));
  const auto r = trunk(input);
  const auto h = add_norm(r, norm_out_).normed;  // in the classifier's dtype
  if (fused::fused_op_enabled(h, "classifier")) {
    // The chunked classifier + cross-entropy: the float32 (B T, 256) logits are never written.
    return fused::classifier_cross_entropy(h, to_logits_->weight, to_logits_->bias, target.reshape({-1}),
                                           h.scalar_type());
  }
  auto logits = to_logits_(h);
  return F::cross_entropy(logits.reshape({-1, cfg_.vocab}).to(torch::kFloat), target.reshape({-1}));
}

}  // namespace flashcos::model
