// The static-shape decode step (decode_step.h): torch ops only, on device tensors only, so the
// same code runs eagerly on any device and inside a CUDA graph capture (decode_graph.cpp).
#include "model/decode_step.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include <flashcos/l2norm.h>
#include <flashcos/rotary.h>

#include "model/decode/decode_linear.h"
#include "model/fused/add_layer_norm.h"
#include "model/kernel_tensors.h"

namespace flashcos::model {

bool StaticDecoder::supports(const ModelConfig& cfg) {
  return (cfg.pos == "rope" || cfg.pos == "none") &&
         (cfg.attention == "cosine" || cfg.attention == "exp" || cfg.attention == "softmax");
}

StaticDecoder::StaticDecoder(GPT& model, const KVCache& prefilled, at::ScalarType compute_dtype)
    : StaticDecoder(model, &prefilled, compute_dtype) {}

StaticDecoder::StaticDecoder(GPT& model, at::ScalarType compute_dtype) : StaticDecoder(model, nullptr, compute_dtype) {}

StaticDecoder::StaticDecoder(GPT& model, const KVCache* prefilled, at::ScalarType compute_dtype)
    : cfg_(model->config()), cd_(compute_dtype) {
  if (!supports(cfg_)) {
    throw std::invalid_argument("StaticDecoder: no static decode step for attention " + cfg_.attention +
                                " with positions " + cfg_.pos + " (expected rope or none, cosine / exp / softmax)");
  }
  const int64_t L = cfg_.max_seq_len, NH = cfg_.heads, HS = cfg_.dim_head, depth = cfg_.depth;
  const int64_t n = prefilled ? prefilled->next_pos : 0;  // no cache: empty rings, the first step is position 0
  if (prefilled && (n < 1 || n > L || static_cast<int64_t>(prefilled->layers.size()) != depth)) {
    throw std::invalid_argument("StaticDecoder: expected a KV cache after a prefill of 1 .. max_seq_len (" +
                                std::to_string(L) + ") tokens, got " + std::to_string(n) + " tokens in " +
                                std::to_string(prefilled->layers.size()) + " layers");
  }
  at::NoGradGuard no_grad;
  const auto params = model->named_parameters();
  auto p = [&](const std::string& name) -> at::Tensor {
    const auto* t = params.find(name);
    TORCH_CHECK(t != nullptr, "StaticDecoder: the model has no parameter ", name);
    return t->detach();
  };
  auto w = [&](const std::string& name) { return p(name).to(cd_).contiguous(); };  // GEMM operands
  const auto modules = model->named_modules("", /*include_self=*/false);
  auto eps = [&](const std::string& name) {
    const auto* m = modules.find(name);
    TORCH_CHECK(m != nullptr, "StaticDecoder: the model has no module ", name);
    return (*m)->as<torch::nn::LayerNorm>()->options.eps();
  };
  token_emb_ = p("token_emb.weight");
  const auto device = token_emb_.device();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  for (int64_t i = 0; i < depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    Block blk;
    blk.norm_attn_w = p(b + "norm_attn.weight"), blk.norm_attn_b = p(b + "norm_attn.bias");
    blk.wqkv = at::cat({p(b + "attn.to_q.weight"), p(b + "attn.to_k.weight"), p(b + "attn.to_v.weight")}, 0)
                   .to(cd_)
                   .contiguous();
    blk.wout = w(b + "attn.to_out.weight");
    blk.norm_ff_w = p(b + "norm_ff.weight"), blk.norm_ff_b = p(b + "norm_ff.bias");
    blk.ff_in_w = w(b + "ff_in.weight"), blk.ff_in_b = w(b + "ff_in.bias");
    blk.ff_out_w = w(b + "ff_out.weight"), blk.ff_out_b = w(b + "ff_out.bias");
    blk.k = at::zeros({1, NH, L, HS}, f32.dtype(cd_));
    blk.v = at::zeros({1, NH, L, HS}, f32.dtype(cd_));
    if (prefilled) {  // the prefill's keys and values (positions 0 .. n - 1) fill slots 0 .. n - 1
      const auto& layer = prefilled->layers[static_cast<size_t>(i)];
      TORCH_CHECK(layer.k.defined() && layer.k.size(2) == n && layer.v.size(2) == n,
                  "StaticDecoder: layer ", i, " of the prefilled cache does not hold ", n, " positions");
      blk.k.narrow(2, 0, n).copy_(layer.k);
      blk.v.narrow(2, 0, n).copy_(layer.v);
    }
    blocks_.push_back(std::move(blk));
    if (i == 0) eps_attn_ = eps(b + "norm_attn"), eps_ff_ = eps(b + "norm_ff");
  }
  eps_out_ = eps("norm_out");
  norm_out_w_ = p("norm_out.weight"), norm_out_b_ = p("norm_out.bias");
  logits_w_ = w("to_logits.weight"), logits_b_ = w("to_logits.bias");
  if (cfg_.pos == "rope") {
    const auto inv = rotary_inv_freq(HS / cfg_.l2norm_groups, cfg_.rope_base);
    inv_freq_ = at::tensor(inv, at::TensorOptions().dtype(at::kFloat)).to(device);
  }
  slots_ = at::arange(L, f32.dtype(at::kLong));
  token_ = at::zeros({1, 1}, f32.dtype(at::kLong));
  pos_ = at::full({1}, n, f32.dtype(at::kLong));
  logits_ = at::zeros({1, cfg_.vocab}, f32);
  next_pos_ = n;
  if (fused_decode_attention_available(cfg_, device)) {
    set_fused_attention(true);
    if (fused_linear_applies()) set_fused_linear(true);
  }
}

bool StaticDecoder::fused_linear_applies() const {
  const auto device = token_.device();
  const auto& b = blocks_.front();
  // The first launch reads the embedding row itself (in float32 or the compute dtype).
  const auto et = token_emb_.scalar_type();
  if (!aligned16(token_emb_) || !token_emb_.is_contiguous() || (et != at::kFloat && et != cd_)) return false;
  for (const auto& w : {b.wqkv, b.wout, b.ff_in_w, b.ff_out_w, logits_w_}) {
    if (!decode_linear_available(device, w.size(1))) return false;
  }
  return true;
}

void StaticDecoder::set_fused_linear(bool on) {
  if (on && !fused_linear_) {
    if (!fused_attn_ || !fused_linear_applies()) {
      throw std::invalid_argument("StaticDecoder: the fused decode linears need the fused decode attention, CUDA and"
                                  " layer widths that are multiples of 8 up to 2048 (and FLASHCOS_DECODE_LINEAR not 0)");
    }
    const auto opts = token_.options().dtype(cd_);
    qkv_out_ = at::zeros({1, blocks_.front().wqkv.size(0)}, opts);
    ff_hidden_ = at::zeros({1, blocks_.front().ff_in_w.size(0)}, opts);
    resid_ = at::zeros({1, cfg_.dim}, opts.dtype(at::kFloat));
  }
  fused_linear_ = on;
}

void StaticDecoder::run_step_fused_linear() {
  at::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor none;
  const auto& x = resid_;  // (1, C) residual stream, float32
  DecodeLinearFolds embed, advance;  // the embedding lookup into the first launch, pos_ += 1 into the last
  embed.token = token_, embed.x_store = x;
  advance.pos = pos_;
  for (auto& blk : blocks_) {
    if (&blk == &blocks_.front()) {  // x = float(token_emb_[token_]), stored, and LN + qkv of it
      decode_linear(token_emb_, blk.wqkv, none, qkv_out_, blk.norm_attn_w, blk.norm_attn_b, eps_attn_, false, false,
                    embed);
    } else {
      decode_linear(x, blk.wqkv, none, qkv_out_, blk.norm_attn_w, blk.norm_attn_b, eps_attn_, false, false);
    }
    fused_decode_attention(cfg_, qkv_out_, blk.k, blk.v, attn_out_, pos_, inv_freq_, attn_scratch_);
    decode_linear(attn_out_, blk.wout, none, x, none, none, 0, false, true);
    decode_linear(x, blk.ff_in_w, blk.ff_in_b, ff_hidden_, blk.norm_ff_w, blk.norm_ff_b, eps_ff_, true, false);
    decode_linear(ff_hidden_, blk.ff_out_w, blk.ff_out_b, x, none, none, 0, false, true);
  }
  decode_linear(x, logits_w_, logits_b_, logits_, norm_out_w_, norm_out_b_, eps_out_, false, false, advance);
}

void StaticDecoder::set_fused_attention(bool on) {
  if (on && !fused_attn_) {
    const auto device = token_.device();
    if (!fused_decode_attention_available(cfg_, device)) {
      throw std::invalid_argument("StaticDecoder: no fused decode attention for attention " + cfg_.attention +
                                  ", head size " + std::to_string(cfg_.dim_head) + ", groups " +
                                  std::to_string(cfg_.l2norm_groups) + " on " + device.str() +
                                  " (expected CUDA, cosine / exp, head size 8 * 2^k <= 256, scale * groups <= 40,"
                                  " FLASHCOS_DECODE_KERNEL not 0)");
    }
    attn_scratch_ = make_decode_attention_scratch(cfg_, device);
    attn_out_ = at::zeros({1, cfg_.heads * cfg_.dim_head}, token_.options().dtype(cd_));
  }
  if (!on) fused_linear_ = false;  // the fused linears run only beside the fused attention
  fused_attn_ = on;
}

at::Tensor StaticDecoder::prepare(const at::Tensor& t, const at::Tensor& cs, const at::Tensor& sn) const {
  // t (1, 2, NH, 1, HS): q and k -> float32, l2-normalised per group (cosine, exp), rotated at
  // pos_ (rope): the ops of flashcos::rotary with cos / sin of float(pos) * inv_freq from the device.
  const int64_t G = cfg_.l2norm_groups;
  auto x = t.to(at::kFloat);
  if (cfg_.attention != "softmax") x = l2norm(x, G);
  if (cfg_.pos != "rope") return x;
  const auto xg = x.reshape({1, 2, cfg_.heads, 1, G, cs.size(0), 2});
  const auto a = xg.select(-1, 0), b = xg.select(-1, 1);
  return at::stack({a * cs - b * sn, a * sn + b * cs}, -1).reshape(x.sizes());
}

void StaticDecoder::run_step() {
  if (fused_linear_) return run_step_fused_linear();
  at::NoGradGuard no_grad;
  // The precision is explicit (decode_step.h); autocast must not recast inside the step.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t NH = cfg_.heads, HS = cfg_.dim_head, inner = NH * HS, C = cfg_.dim, L = cfg_.max_seq_len;
  const double inf = std::numeric_limits<double>::infinity();
  // float32: every .to(cd_) below is a no-op and the residual adds fold into the GEMMs (addmm_).
  const bool f32 = cd_ == at::kFloat;
  at::Tensor slot, masked, cs, sn;  // the torch-op attention's slot, mask and cos / sin
  if (!fused_attn_) {
    slot = at::remainder(pos_, L);                     // (1,) int64
    masked = (slots_ > pos_).view({1, 1, 1, L});       // slots not yet written
    if (cfg_.pos == "rope") {  // (P) cos / sin of float(pos) * inv_freq[m], shared by q, k of every block
      const auto angle = pos_.to(at::kFloat) * inv_freq_;
      cs = angle.cos(), sn = angle.sin();
    }
  }
  auto x = at::embedding(token_emb_, token_.view({1})).to(at::kFloat);  // (1, C) residual stream, float32
  // float32 adds each branch into x with addmm_; bf16 / fp16 keep a branch's output (r, compute
  // dtype) pending and add it inside the next LayerNorm (fused::add_layer_norm: x += r, then the norm
  // in float32 statistics, written in compute dtype): one kernel instead of cast, add, norm, cast.
  at::Tensor r;  // the pending branch output (reduced precision only)
  auto norm = [&](const at::Tensor& w, const at::Tensor& b, double eps) {
    if (f32) return at::layer_norm(x, {C}, w, b, eps);
    auto res = fused::add_layer_norm(x, r, w, b, eps, cd_);
    x = res.sum;
    r = at::Tensor();
    return res.normed;
  };
  for (auto& blk : blocks_) {
    auto h = norm(blk.norm_attn_w, blk.norm_attn_b, eps_attn_);
    const auto qkv = at::linear(h, blk.wqkv);  // (1, 3 inner): q, k, v, head-major
    at::Tensor o;                              // (1, inner)
    if (fused_attn_) {
      fused_decode_attention(cfg_, qkv, blk.k, blk.v, attn_out_, pos_, inv_freq_, attn_scratch_);
      o = attn_out_;
    } else {
      const auto heads = qkv.view({1, 3, NH, 1, HS});
      const auto qk = prepare(heads.narrow(1, 0, 2), cs, sn).to(cd_);  // (1, 2, NH, 1, HS)
      const auto q = qk.select(1, 0);                                    // (1, NH, 1, HS)
      blk.k.index_copy_(2, slot, qk.select(1, 1));
      blk.v.index_copy_(2, slot, heads.select(1, 2));
      auto sim = at::matmul(q, blk.k.transpose(-1, -2)).to(at::kFloat);  // (1, NH, 1, L)
      if (cfg_.attention == "exp") {
        auto e = (sim * cfg_.attn_scale).masked_fill(masked, -inf).exp();
        o = at::matmul(e.to(cd_), blk.v);
      } else {
        sim = cfg_.attention == "cosine" ? sim * cfg_.attn_scale - cfg_.attn_scale
                                         : sim / std::sqrt(static_cast<double>(HS));
        o = at::matmul(sim.masked_fill(masked, -inf).softmax(-1).to(cd_), blk.v);
      }
      o = o.view({1, inner});
    }
    if (f32) {
      x.addmm_(o, blk.wout.t());
    } else {
      r = at::linear(o, blk.wout);
    }
    h = norm(blk.norm_ff_w, blk.norm_ff_b, eps_ff_);
    const auto g = at::gelu(at::linear(h, blk.ff_in_w, blk.ff_in_b));
    if (f32) {
      x.addmm_(g, blk.ff_out_w.t()).add_(blk.ff_out_b);
    } else {
      r = at::linear(g, blk.ff_out_w, blk.ff_out_b);
    }
  }
  auto h = norm(norm_out_w_, norm_out_b_, eps_out_);
  if (f32) {
    at::addmm_out(logits_, logits_b_, h, logits_w_.t());
  } else {
    logits_.copy_(at::linear(h, logits_w_, logits_b_));
  }
  pos_.add_(1);
}

int64_t StaticDecoder::device_position() const { return pos_.item<int64_t>(); }

void StaticDecoder::set_input(int64_t token) {
  if (token < 0 || token >= token_emb_.size(0)) {
    throw std::invalid_argument("StaticDecoder: token " + std::to_string(token) + " is not in [0, " +
                                std::to_string(token_emb_.size(0)) + ")");
  }
  token_.fill_(token);
}

at::Tensor StaticDecoder::step(int64_t token) {
  if (next_pos_ >= (int64_t(1) << 24)) {
    throw std::invalid_argument("StaticDecoder: position " + std::to_string(next_pos_) +
                                " is past 2^24 (rotary angles take exact float32 positions)");
  }
  set_input(token);
  run_step();
  ++next_pos_;
  return logits_;
}

}  // namespace flashcos::model
