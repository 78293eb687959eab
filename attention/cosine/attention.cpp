// The public entry point: validate, canonicalise shapes, l2-normalise (plain libtorch ops, so
// autograd handles its Jacobian), then dispatch to the fused kernel, the tiled path or the plain
// reference.
#include <flashcos/attention.h>

#include <ATen/ATen.h>

#include "attention/cosine/autograd.h"
#include "attention/cosine/canonical.h"
#include "attention/cosine/core.h"

#ifdef FLASHCOS_WITH_CUDA
#include "attention/cosine/cuda/params.h"
#endif

namespace flashcos {

bool fused_kernels_compiled() {
#ifdef FLASHCOS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int64_t hopper_kernel_launches() {
#ifdef FLASHCOS_WITH_CUDA
  return cuda::hopper_launches();
#else
  return 0;
#endif
}

int64_t hopper_forward_kernel_launches() {
#ifdef FLASHCOS_WITH_CUDA
  return cuda::hopper_fwd_launches();
#else
  return 0;
#endif
}

int64_t hopper_backward_kernel_launches() {
#ifdef FLASHCOS_WITH_CUDA
  return cuda::hopper_bwd_launches();
#else
  return 0;
#endif
}

std::string to_string(AttentionKind kind) { return kind == AttentionKind::kExp ? "exp" : "cosine"; }

std::string to_string(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kFused: return "fused";
    case Backend::kTiled: return "tiled";
    case Backend::kPlain: return "plain";
  }
  return "?";
}

at::Tensor cosine_sim_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const AttentionOptions& options) {
  auto c = detail::canonicalize(q, k, v, options);
  Backend backend = options.backend();
  if (backend == Backend::kAuto) backend = q.is_cuda() ? Backend::kFused : Backend::kTiled;
  if (backend == Backend::kFused) {
    TORCH_CHECK(q.is_cuda(), "flashcos attention: the fused backend needs CUDA tensors, got q on ", q.device(),
                " (use Backend::kTiled on the CPU)");
    TORCH_CHECK(fused_kernels_compiled(),
                "flashcos attention: this build has no CUDA kernels (nvcc was not found at build time)");
    TORCH_CHECK(detail::fused_supports_head_dim(c.D), "flashcos attention: the fused kernel supports head dims ",
                "16, 32, 64, 80, 96, 128; got D = ", c.D, " (use Backend::kTiled)");
  }
  detail::prepare_qk(c, options);
  if (backend == Backend::kPlain) return c.restore(detail::plain_attention_core(c, options));

  detail::CoreArgs args;
  args.causal = options.causal();
  args.scale = options.scale();
  args.exp_kind = options.kind() == AttentionKind::kExp;
  args.bias_batch_dim = options.attn_bias_batch_dim();
  args.deterministic = options.deterministic();
  args.tile_size = options.tile_size();
  // With l2norm off the cosine kind takes q, k as already unit-norm (|q.k| <= 1, e.g. normalised
  // by the caller, as `./train bench` does): the fixed-offset forward stays in use.
  args.qk_max = options.l2norm_qk() ? static_cast<double>(options.groups()) : 1.0;
  return c.restore(detail::attention_autograd(c.q, c.k, c.v, c.mask, c.bias, args, backend == Backend::kFused));
}

}  // namespace flashcos
