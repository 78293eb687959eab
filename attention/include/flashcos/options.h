// flashcos attention: the options and enums every attention entry point takes (libtorch's
// TORCH_ARG builder style). A low header: the public API (attention.h) and the internal shape
// checks (cosine/canonical.h) both include it, nothing here includes them.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>

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
  /// Rotary positions (flashcos/rotary.h): q and k rotated after their l2norm, pair (2m, 2m + 1) of
  /// each of the `groups` chunks by the angle position * rotary_base^(-2m / group size). Fused into
  /// the l2norm kernels on the packed CUDA path; libtorch ops elsewhere.
  TORCH_ARG(bool, rotary) = false;
  TORCH_ARG(double, rotary_base) = 10000.0;
  /// Position of key 0; query i sits at position_offset + (J - I) + i (bottom-right aligned, as the
  /// causal mask), so a decode step with one query against J cached keys passes the cache's start.
  TORCH_ARG(int64_t, position_offset) = 0;
  /// Bit-identical gradients from run to run: instead of racing float atomics, the fused backward
  /// makes dq's sum independent of the order of its per-key-block parts (the Hopper kernels, cosine
  /// kind: each part rounded to a per-row grid on which every float32 add is exact, dq then exact to
  /// about 2^-11 of its row's largest element; otherwise the parts are added in a fixed order, each
  /// CUDA block waiting for the one before it), and writes dbias per (batch, head) before summing it
  /// over the broadcast dim. Costs backward time (`./train bench --deterministic` measures it) and,
  /// with a bias, B x H x I x J floats. The tiled and plain paths are deterministic anyway.
  TORCH_ARG(bool, deterministic) = false;
};

std::string to_string(AttentionKind kind);
std::string to_string(Backend backend);

}  // namespace flashcos
