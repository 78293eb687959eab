// Shape canonicalisation and validation shared by the entry point and the plain reference.
// Turns every accepted input form into q (B, H, I, D), k / v (B, Hkv, J, D) views and checks
// mask and bias against those sizes; `restore` puts the output back into q's original form.
#pragma once

#include <ATen/core/Tensor.h>

#include <flashcos/options.h>

namespace flashcos::detail {

struct Canonical {
  at::Tensor q, k, v;       // (B, H, I, D), (B, Hkv, J, D), (B, Hkv, J, D)
  at::Tensor mask;          // (B, J) bool or undefined
  at::Tensor bias;          // (H, I, J) / (B, I, J) or undefined
  bool merged = false;      // q was (BH, I, D)
  int64_t B = 0, H = 0, Hkv = 0, I = 0, J = 0, D = 0;

  at::Tensor restore(const at::Tensor& o) const { return merged ? o.squeeze(1) : o; }
};

// Validates shapes, dtypes and devices of q, k, v, mask, attn_bias and options; throws a
// c10::Error naming the argument and what was expected.
Canonical canonicalize(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const AttentionOptions& options);

// q and k as the core takes them: l2-normalised (cosine kind with l2norm_qk), then rotated when
// options.rotary() (keys at position_offset + j, queries at position_offset + J - I + i).
void prepare_qk(Canonical& c, const AttentionOptions& options);

// The attention on canonical tensors with the full (B, H, I, J) matrix (libtorch ops, autograd).
at::Tensor plain_attention_core(const Canonical& c, const AttentionOptions& options);

// (B, H, I, J) bool: true where query i may attend key j (mask and causal), or undefined when
// every pair is allowed. Bottom-right aligned causal for I != J.
at::Tensor keep_matrix(const at::Tensor& mask, bool causal, int64_t I, int64_t J, int64_t i0,
                       int64_t i1, int64_t j0, int64_t j1, const at::TensorOptions& device);

}  // namespace flashcos::detail
