// A static-shape decode step for cached sampling (model/generate.cpp): one byte through the model
// with no shape, host value or allocation size changing from one byte to the next, so that on CUDA
// the whole step can be captured once in a CUDA graph and replayed (model/decode_graph.h).
//
// Per block a ring buffer of max_seq_len key / value slots, (1, NH, L, HS) each; the token at
// absolute position p writes slot p mod L. Keys are stored as the attention takes them
// (l2-normalised and rotated at their own position for cosine / exp, rotated for softmax), so the
// order of the slots does not matter: with rope each logit depends on its key's own rotation only.
// The one query row attends over all L slots with the unfilled ones masked (slot j is filled once
// p >= j). The token and its position are device tensors (token_, pos_); the step ends with
// pos_ += 1 on the device (with the fused linears, inside the last launch; the first one reads the
// token's embedding row itself).
//   cosine:  o = softmax(scale q.k - scale) v        exp: o = sum_j exp(scale q.k_j) v_j
//   softmax: o = softmax(q.k / sqrt(HS)) v           (masked slots: -inf before the exp)
// On CUDA, cosine / exp attention runs as one fused kernel per block between the qkv and the output
// projections (model/decode/decode_attention.h: l2norm, rope, the ring write and split-KV
// attention over the filled slots only); the torch ops stay the CPU path and the reference.
// Supported: rope or no positions, attention cosine / exp / softmax (learned positions and fastmax
// keep generate.cpp's other paths).
//
// Precision: compute_dtype float32 is the model's own computation; bf16 / fp16 follows autocast's
// rules explicitly (LayerNorm, l2norm, rotation, softmax in float32; matmuls and the cache in
// compute_dtype; the residual stream in float32), with autocast itself switched off inside the step.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/decode/decode_attention.h"
#include "model/gpt.h"

namespace flashcos::model {

class StaticDecoder {
 public:
  // Whether the model's attention / positions have a static step.
  static bool supports(const ModelConfig& cfg);
  // From a model and its KV cache after a prefill of positions 0 .. prefilled.next_pos - 1
  // (GPT::forward_cached; at most max_seq_len tokens). Snapshots the weights in compute_dtype.
  StaticDecoder(GPT& model, const KVCache& prefilled, at::ScalarType compute_dtype);
  // Empty rings: the first step is position 0 (the prime decoded byte by byte instead of a prefill;
  // generate.cpp does so for short primes on CUDA, where the prefill's GEMMs would bring cuBLAS up).
  StaticDecoder(GPT& model, at::ScalarType compute_dtype);
  virtual ~StaticDecoder() = default;
  StaticDecoder(const StaticDecoder&) = delete;
  StaticDecoder& operator=(const StaticDecoder&) = delete;

  // Decodes `token` at position next_pos(): its (1, vocab) float32 logits on the model's device
  // (valid until the next step), and the position advances.
  virtual at::Tensor step(int64_t token);
  int64_t next_pos() const { return next_pos_; }
  // The position the next step reads on the device (pos_; a synchronising read, for tests): equals
  // next_pos() between steps.
  int64_t device_position() const;
  // How the steps run ("static"; the CUDA-graph decoder names itself).
  virtual std::string name() const { return "static"; }
  at::ScalarType compute_dtype() const { return cd_; }
  // Whether the step's attention runs the fused CUDA kernel (model/decode/decode_attention.h; on by
  // default where it applies, FLASHCOS_DECODE_KERNEL=0 turns it off) or the torch ops. Switching
  // it on where it does not apply throws std::invalid_argument; set it before the first step.
  bool fused_attention() const { return fused_attn_; }
  void set_fused_attention(bool on);
  // Whether the step's linear layers run as one-row kernels with their LayerNorm, bias, GELU and
  // residual add folded in (model/decode/decode_linear.h; needs the fused attention; on by default
  // where both apply, FLASHCOS_DECODE_LINEAR=0 turns it off). Set it before the first step.
  bool fused_linear() const { return fused_linear_; }
  void set_fused_linear(bool on);

 protected:
  // prefilled: nullptr for empty rings.
  StaticDecoder(GPT& model, const KVCache* prefilled, at::ScalarType compute_dtype);
  // token_ (1, 1) int64 at position pos_ -> logits_ (1, vocab) float32; writes the token's key and
  // value into slot pos_ mod L of every block, then pos_ += 1. Torch ops on device tensors only
  // (capturable in a CUDA graph).
  void run_step();
  // token_ <- token, after checking it is a byte of the vocabulary (std::invalid_argument if not).
  void set_input(int64_t token);

  struct Block {
    at::Tensor norm_attn_w, norm_attn_b, wqkv, wout, norm_ff_w, norm_ff_b, ff_in_w, ff_in_b, ff_out_w, ff_out_b;
    at::Tensor k, v;  // ring buffers (1, NH, L, HS) in compute_dtype
  };
  ModelConfig cfg_;
  at::ScalarType cd_;
  double eps_attn_ = 1e-5, eps_ff_ = 1e-5, eps_out_ = 1e-5;
  std::vector<Block> blocks_;
  at::Tensor token_emb_, norm_out_w_, norm_out_b_, logits_w_, logits_b_;
  at::Tensor inv_freq_;  // (HS / G / 2) float32 (rope)
  at::Tensor slots_;     // arange(L) int64
  at::Tensor token_;     // (1, 1) int64: the input of the step
  at::Tensor pos_;       // (1,) int64: its absolute position
  at::Tensor logits_;    // (1, vocab) float32: the output of the step
  int64_t next_pos_ = 0;
  bool fused_attn_ = false;
  DecodeAttentionScratch attn_scratch_;  // the fused kernel's split-KV scratch
  at::Tensor attn_out_;                  // (1, NH HS) compute_dtype: its output
  bool fused_linear_ = false;
  at::Tensor qkv_out_, ff_hidden_;  // (1, 3 NH HS), (1, ff) compute_dtype: the fused linears' outputs
  at::Tensor resid_;                // (1, C) float32: their residual stream (allocated before a capture)

 private:
  // run_step with the fused linear layers: per block LN + qkv (the first block's reads the token's
  // embedding row and stores it as x), attention, x += out proj, LN + ff_in + GELU, x += ff_out;
  // then LN + logits and pos_ += 1 in one launch. 41 launches for 8 blocks.
  void run_step_fused_linear();
  bool fused_linear_applies() const;
  // (1, 2, NH, 1, HS) q and k -> normalised / rotated (cs, sn: cos / sin of the angles), float32
  at::Tensor prepare(const at::Tensor& t, const at::Tensor& cs, const at::Tensor& sn) const;
};

}  // namespace flashcos::model
