// flashcos Fastmax: linear-time polynomial attention (FAST, arXiv 2402.07901), public API.
//
// Definition (per batch b, query head h; k, v of the kv head that h reads):
//   s_ij = (q_i . k_j) / temperature
//   f(x) = a0 + a1 x              (p = 1)
//   f(x) = a0 + a1 x + a2 x^2     (p = 2)
//   o_i  = sum_j f(s_ij) v_j / sum_j f(s_ij)
// summed over all keys j, or with `causal` over j <= i + (J - I) (bottom-right aligned, as the
// cosine attention). A query row with no visible key (causal, I > J) gets o_i = 0 and zero grads.
//
// `normalize`: before the above, q and k are rescaled PER TOKEN onto the sphere of radius `lim`,
//   q_i <- lim * q_i / max(|q_i|, eps),   k_j <- lim * k_j / max(|k_j|, eps)   (eps = 1e-12),
// so |s_ij| <= lim^2 / temperature. It uses only the token itself (no max over the sequence, which
// would leak future tokens in causal mode), and its Jacobian is part of the gradient.
//
// Validity: every weight f(s_ij) must stay > 0 so the denominator cannot reach 0. The entry point
// checks min f over the reachable range of s (all reals, or [-lim^2/T, lim^2/T] with `normalize`)
// and refuses the call otherwise: p = 1 needs `normalize` and a0 > |a1| lim^2 / T; p = 2 without
// `normalize` needs a2 > 0 and a1^2 < 4 a0 a2 (the defaults give min f = 0.5).
//
// Cost: sum_j f(s_ij) v_j expands into moments of k and v (sum_j k_j v_j^T for p = 1, and
// sum_j (k_j (x) k_j) v_j^T for p = 2, kept in the symmetric d(d+1)/2 form), so time is
// O(n d^2) for p = 1 and O(n d^3) for p = 2 and memory never holds an (I, J) matrix. Causal is a
// chunked scan: exact f(q k^T) inside a chunk of `chunk_size` tokens, carried moments across.
//
// Shapes (B batch, H heads, Hkv key/value heads, I queries, J keys, D head dim), as DESIGN.md:
//   q (B, H, I, D); k, v (B, Hkv, J, D) with H % Hkv == 0, or (B, J, D) single-headed;
//   or merged q (BH, I, D) with k, v (BH, J, D). The output has q's shape and dtype.
// dtypes: float64 / float32 / bfloat16 / float16. bf16 / fp16 use tensor-core GEMMs with float32
// accumulation; float32 inputs are computed in float64 (the factorised sums cancel, see
// fastmax_chunked.cpp); the output has the input dtype. Any device; CUDA tensors use the CUDA kernels (attention/fastmax/cuda/fastmax*.cu).
//
//   auto o = flashcos::fastmax_attention(q, k, v, flashcos::FastmaxOptions().p(2).causal(true));
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>

namespace flashcos {

enum class FastmaxBackend {
  kAuto,       // CUDA kernels for CUDA tensors (when compiled in), the chunked path otherwise
  kChunked,    // factorised, chunked libtorch ops with an analytic backward; any device
  kCuda,       // the CUDA kernels; an error for CPU tensors or a build without CUDA
  kReference,  // the O(I * J) definition in plain libtorch ops (tests, baseline); autograd backward
};

struct FastmaxOptions {
  /// Polynomial order of the kernel f: 1 (a0 + a1 x) or 2 (a0 + a1 x + a2 x^2).
  TORCH_ARG(int64_t, p) = 2;
  /// Constant coefficient of f.
  TORCH_ARG(double, a0) = 1.0;
  /// Linear coefficient of f.
  TORCH_ARG(double, a1) = 1.0;
  /// Quadratic coefficient of f (used when p = 2). 1, 1, 0.5 is the Taylor expansion of exp.
  TORCH_ARG(double, a2) = 0.5;
  /// s = q.k / temperature; must be > 0.
  TORCH_ARG(double, temperature) = 1.0;
  /// Causal masking, bottom-right aligned when I != J: query r sees keys 0 .. r + J - I.
  TORCH_ARG(bool, causal) = false;
  /// Rescale q and k per token to norm `lim` (see above); differentiated through.
  TORCH_ARG(bool, normalize) = false;
  /// Radius for `normalize`: |s| <= lim^2 / temperature. Must be > 0.
  TORCH_ARG(double, lim) = 1.0;
  /// Tokens per chunk of the causal scan (exact quadratic inside a chunk); 0 = automatic
  /// (about sqrt(F (D + 1)) rounded to a power of two in 32 .. 512, F the feature count).
  TORCH_ARG(int64_t, chunk_size) = 0;
  /// Which implementation computes it.
  TORCH_ARG(FastmaxBackend, backend) = FastmaxBackend::kAuto;
};

/// The entry point: validates (c10::Error naming the bad argument), normalises shapes, applies
/// `normalize`, and runs the chosen backend through a torch::autograd::Function.
at::Tensor fastmax_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const FastmaxOptions& options = {});

/// The O(I * J) definition in plain libtorch ops (same shapes and options; autograd backward).
/// Equivalent to fastmax_attention with backend kReference.
at::Tensor fastmax_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const FastmaxOptions& options = {});

/// Throws a c10::Error when the options are invalid (p not 1/2, temperature/lim/chunk_size <= 0,
/// or a kernel f that can reach 0 or below on the reachable range of s). Tensor-free: the model
/// calls it once at start-up.
void check_fastmax_options(const FastmaxOptions& options);

/// min f(s) over the reachable range of s for these options (-inf when unbounded below).
double fastmax_min_weight(const FastmaxOptions& options);

/// True when this build has the Fastmax CUDA kernels compiled in.
bool fastmax_cuda_compiled();

std::string to_string(FastmaxBackend backend);

}  // namespace flashcos
