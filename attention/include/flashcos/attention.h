// flashcos attention: public API.
//
// Cosine-similarity attention (DESIGN.md):
//   P_ij = exp(scale * (q_i . k_j) - scale + bias_ij)   (masked / non-causal j: P_ij = 0)
//   o_i  = sum_j P_ij v_j / l_i,   l_i = sum_j P_ij     (a row with nothing to attend: o_i = 0)
// q, k are l2-normalised per head (in `groups` chunks of the feature dim) unless l2norm_qk is false.
// The `exp` kind is the unnormalised variant: o_i = sum_j exp(scale * (q_i . k_j) + bias_ij) v_j,
// no l, no l2norm; it overflows once scale * |q.k| passes ~88 in fp32 (see attention/README.md).
//
// Shapes (B batch, H heads, Hkv key/value heads, I queries, J keys, D head dim):
//   q (B, H, I, D); k, v (B, Hkv, J, D) with H % Hkv == 0, or (B, J, D) single-headed;
//   or merged q (BH, I, D) with k, v (BH, J, D).
//   mask (B, J) bool, true = attend.  attn_bias (H, I, J), or (B, I, J) with attn_bias_batch_dim.
//
//   auto o = flashcos::cosine_sim_attention(q, k, v, flashcos::AttentionOptions().causal(true));
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <utility>

namespace flashcos {

enum class AttentionKind {
  kCosine,  // exp(scale * q.k - scale) / l: the normalised cosine-sim attention
  kExp,     // exp(scale * q.k) unnormalised, q and k used as given
};

enum class Backend {
  kAuto,   // fused CUDA kernel for CUDA tensors, tiled path for CPU tensors
  kFused,  // the fused CUDA kernel; an error for CPU tensors or a build without CUDA
  kTiled,  // chunked libtorch ops, O(n * chunk) memory, any device
  kPlain,  // plain libtorch ops with the full (I, J) matrix: the reference / baseline
};

struct AttentionOptions {
  /// Causal masking, bottom-right aligned when I != J: query r sees keys 0 .. r + J - I.
  TORCH_ARG(bool, causal) = false;
  /// Multiplies q.k; cosine kind subtracts it again so the logits stay <= 0.
  TORCH_ARG(double, scale) = 10.0;
  /// Key mask (B, J), bool, true = attend. Undefined tensor: no mask.
  TORCH_ARG(at::Tensor, mask) = {};
  /// Additive bias on the logits: (H, I, J), or (B, I, J) with attn_bias_batch_dim. Gets a gradient.
  TORCH_ARG(at::Tensor, attn_bias) = {};
  /// attn_bias has a batch dimension (B, I, J) instead of a head dimension (H, I, J).
  TORCH_ARG(bool, attn_bias_batch_dim) = false;
  /// l2-normalise q and k before the attention (cosine kind only). When false, the cosine kind takes
  /// q, k as given and expects them unit-norm (|q.k| <= 1; fp16 overflows past that).
  TORCH_ARG(bool, l2norm_qk) = true;
  /// Number of groups of the feature dim that are l2-normalised separately.
  TORCH_ARG(int64_t, groups) = 1;
  /// Which attention: normalised cosine-sim (default) or the unnormalised exp variant.
  TORCH_ARG(AttentionKind, kind) = AttentionKind::kCosine;
  /// Which implementation computes it.
  TORCH_ARG(Backend, backend) = Backend::kAuto;
  /// Query / key chunk of the tiled path (memory is O(chunk^2) per batch-head).
  TORCH_ARG(int64_t, tile_size) = 512;
};

/// The entry point: validates, normalises shapes, l2-normalises, dispatches to the backend.
at::Tensor cosine_sim_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const AttentionOptions& options = {});

/// q, k, v packed in one projection, as a fused QKV linear layer gives them: qkv (B, T, 3 * heads * D)
/// holds [q | k | v] along its last dim, each (B, T, heads, D). Returns o (B, T, heads * D), the
/// heads merged (what an output projection takes). The same result as cosine_sim_attention on the
/// three (B, heads, T, D) views; with the fused backend, l2norm_qk, fp16 / bf16, no mask and no bias
/// it runs without layout copies (fused l2norm kernels, o written in (B, T, H, D) order, the gradient
/// written as one packed (B, T, 3 * heads * D) tensor). Options as for cosine_sim_attention.
at::Tensor cosine_sim_attention_packed(const at::Tensor& qkv, int64_t heads, const AttentionOptions& options = {});

/// The plain reference: libtorch ops with the whole (I, J) matrix (tests and benchmark baseline).
at::Tensor plain_cosine_sim_attention(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, AttentionOptions options = {});

/// l2-normalise the last dim of t in `groups` equal chunks.
at::Tensor l2norm(const at::Tensor& t, int64_t groups = 1);
// The same through libtorch's RMSNorm (y = rms_norm(x) / sqrt(group size)), any device; l2norm
// takes it for fp16 / bf16 CUDA tensors.
at::Tensor rms_l2norm(const at::Tensor& t, int64_t groups = 1);
/// y = out_scale * x / rms(x) over the last dim (rms(x) = sqrt(mean(x^2))) by libtorch's RMSNorm
/// (fused kernels on CUDA). Its autograd keeps x and 1 / rms.
at::Tensor rms_normalize(const at::Tensor& x, double out_scale = 1.0);

/// True when this build has the fused CUDA kernels compiled in.
bool fused_kernels_compiled();
/// How many fused-kernel launches (forward or backward) went to the Hopper (wgmma) family in this
/// process; 0 without it. Lets tests and benchmarks check which family ran.
int64_t hopper_kernel_launches();

std::string to_string(AttentionKind kind);
std::string to_string(Backend backend);

}  // namespace flashcos
