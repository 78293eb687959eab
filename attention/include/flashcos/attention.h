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

#include <cstdint>

#include <flashcos/l2norm.h>
#include <flashcos/options.h>
#include <flashcos/rotary.h>

namespace flashcos {

/// The entry point: validates, normalises shapes, l2-normalises, dispatches to the backend.
at::Tensor cosine_sim_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const AttentionOptions& options = {});

/// q, k, v packed in one projection, as a fused QKV linear layer gives them: qkv (B, T, 3 * heads * D)
/// holds [q | k | v] along its last dim, each (B, T, heads, D). Returns o (B, T, heads * D), the
/// heads merged (what an output projection takes). The same result as cosine_sim_attention on the
/// three (B, heads, T, D) views; with the fused backend, l2norm_qk, fp16 / bf16, no mask and no bias
/// it runs without layout copies (fused l2norm kernels, o written in (B, T, H, D) order, the gradient
/// written as one packed (B, T, 3 * heads * D) tensor). Options as for cosine_sim_attention.
at::Tensor cosine_sim_attention_qkv(const at::Tensor& qkv, int64_t heads, const AttentionOptions& options = {});

/// The plain reference: libtorch ops with the whole (I, J) matrix (tests and benchmark baseline).
at::Tensor plain_cosine_sim_attention(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, AttentionOptions options = {});

/// True when this build has the fused CUDA kernels compiled in.
bool fused_kernels_compiled();
/// How many fused-kernel launches (forward or backward) went to the Hopper (wgmma) family in this
/// process; 0 without it. Lets tests and benchmarks check which family ran.
int64_t hopper_kernel_launches();
/// The same count for one direction: forward launches, backward launches (their sum is
/// hopper_kernel_launches()). Every 16-bit case runs on Hopper on a compute capability 9.0 device, an
/// attention bias in both directions (FLASHCOS_HOPPER_BWD_BIAS=0 sends its backward to the sm_80 kernels).
int64_t hopper_forward_kernel_launches();
int64_t hopper_backward_kernel_launches();

}  // namespace flashcos
