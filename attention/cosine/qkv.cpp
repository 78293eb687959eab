// cosine_sim_attention_qkv: q, k, v as the three thirds of one projection (B, T, 3 H D).
//
// Every backend gets the same answer as splitting qkv into (B, H, T, D) views and calling
// cosine_sim_attention. The fused CUDA backend with l2norm_qk, no mask and no bias takes a path
// without layout copies, one autograd Function for the whole thing:
//   forward:  fused l2norm (+ rotary positions when asked: the rotation is applied in the same pass)
//             of the q and k views into (B, H, T, D) buffers (attention/l2norm/cuda/l2norm.h),
//             the attention kernel with v read in place and o written in (B, T, H, D) order, so
//             the (B, T, H D) result is a view;
//   backward: the attention backward with dQ kept in its float32 accumulator (where the kernel
//             left the softmax scale out of it, the l2norm backward multiplies it in: dq_factor),
//             then the l2norm backward writes dq and dk straight into the packed (B, T, 3 H D) gradient, the
//             attention kernel writes dv there: one gradient tensor, no zero-filled slices to add up
//             (with rotary the l2norm backward kernel applies R^T to dq, dk first).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <flashcos/attention.h>
#include "attention/cosine/core.h"
#include "attention/l2norm/l2norm_cuda.h"

namespace flashcos {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The (B, H, T, D) view of part `which` (0 q, 1 k, 2 v) of a (B, T, 3 H D) tensor.
at::Tensor part(const at::Tensor& packed, int64_t heads, int64_t which) {
  const int64_t B = packed.size(0), T = packed.size(1), D = packed.size(2) / (3 * heads);
  return packed.view({B, T, 3, heads, D}).select(2, which).permute({0, 2, 1, 3});
}

// The fused core's arguments of the packed path (cosine kind, q, k l2-normalised in `groups`).
detail::CoreArgs qkv_args(bool causal, double scale, int64_t groups, bool deterministic) {
  detail::CoreArgs args;
  args.causal = causal;
  args.deterministic = deterministic;
  args.scale = scale;
  args.qk_max = static_cast<double>(groups);
  return args;
}

class QkvAttentionFunction : public torch::autograd::Function<QkvAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads, bool causal,
                               double scale, int64_t groups, bool rotary, double base, int64_t offset,
                               bool deterministic) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (3 * heads);
    const at::Tensor q = part(qkv, heads, 0), k = part(qkv, heads, 1), v = part(qkv, heads, 2);
    const detail::RotaryArgs rot{base, offset};
    const detail::RotaryArgs* rp = rotary ? &rot : nullptr;
    auto [qn, rq] = detail::l2norm_cuda_forward(q, groups, at::empty({B, heads, T, D}, qkv.options()), rp);
    auto [kn, rk] = detail::l2norm_cuda_forward(k, groups, at::empty({B, heads, T, D}, qkv.options()), rp);
    // o is returned as allocated (a view made inside a custom Function could not be modified in
    // place); the kernel writes it through its (B, H, T, D) view.
    const at::Tensor o = at::empty({B, T, heads * D}, qkv.options());
    const detail::CoreArgs args = qkv_args(causal, scale, groups, deterministic);
    const auto r = detail::fused_forward(qn, kn, v, {}, {}, args, o.view({B, T, heads, D}).permute({0, 2, 1, 3}));
    // o itself is saved (the output; a saved no-grad view of it would break autograd's history
    // rewrite of o), and viewed again in the backward.
    ctx->save_for_backward({qkv, qn, kn, rq, rk, o, r.l});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["rotary"] = rotary;
    ctx->saved_data["base"] = base;
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["deterministic"] = deterministic;
    return {o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const auto &qkv = saved[0], &qn = saved[1], &kn = saved[2], &rq = saved[3], &rk = saved[4], &l = saved[6];
    const int64_t heads = ctx->saved_data["heads"].toInt(), groups = ctx->saved_data["groups"].toInt();
    const detail::CoreArgs args =
        qkv_args(ctx->saved_data["causal"].toBool(), ctx->saved_data["scale"].toDouble(), groups,
                 ctx->saved_data["deterministic"].toBool());
    const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (3 * heads);
    const at::Tensor o = saved[5].view({B, T, heads, D}).permute({0, 2, 1, 3});
    at::Tensor dout = grad_outputs[0];
    if (!dout.defined()) dout = at::zeros({B, T, heads * D}, qkv.options());
    dout = dout.reshape({B, T, heads, D}).permute({0, 2, 1, 3});
    at::Tensor dqkv = at::empty(qkv.sizes(), qkv.options());
    detail::poison_if_requested(dqkv);
    const auto g = detail::fused_backward(dout, qn, kn, part(qkv, heads, 2), o, l, {}, {}, args,
                                          /*dq_float=*/true, /*dv_out=*/part(dqkv, heads, 2));
    const detail::RotaryArgs rot{ctx->saved_data["base"].toDouble(), ctx->saved_data["offset"].toInt()};
    const detail::RotaryArgs* rp = ctx->saved_data["rotary"].toBool() ? &rot : nullptr;
    detail::l2norm_cuda_backward(g.dq, part(qkv, heads, 0), rq, groups, part(dqkv, heads, 0), rp, g.dq_factor);
    detail::l2norm_cuda_backward(g.dk, part(qkv, heads, 1), rk, groups, part(dqkv, heads, 1), rp);
    return {dqkv,         at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor cosine_sim_attention_qkv(const at::Tensor& qkv, int64_t heads, const AttentionOptions& options) {
  TORCH_CHECK(qkv.defined() && qkv.dim() == 3, "flashcos cosine_sim_attention_qkv: qkv must be (B, T, 3 * heads * D), got ",
              qkv.defined() ? c10::str(qkv.sizes()) : std::string("an undefined tensor"));
  TORCH_CHECK(heads >= 1 && qkv.size(2) % (3 * heads) == 0 && qkv.size(2) > 0,
              "flashcos cosine_sim_attention_qkv: qkv's last dim ", qkv.size(2), " must be 3 * heads * D with heads = ",
              heads);
  TORCH_CHECK(qkv.stride(2) == 1 || qkv.size(2) == 1,
              "flashcos cosine_sim_attention_qkv: qkv needs a contiguous last dim, got strides ", qkv.strides());
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (3 * heads);
  Backend backend = options.backend();
  if (backend == Backend::kAuto) backend = qkv.is_cuda() ? Backend::kFused : Backend::kTiled;
  const bool fast = backend == Backend::kFused && qkv.is_cuda() && fused_kernels_compiled() &&
                    options.kind() == AttentionKind::kCosine && options.l2norm_qk() && !options.mask().defined() &&
                    !options.attn_bias().defined() && at::isReducedFloatingType(qkv.scalar_type()) &&
                    detail::fused_supports_head_dim(D) && B * T > 0 &&
                    detail::l2norm_cuda_supported(part(qkv, heads, 0), options.groups()) &&
                    detail::l2norm_cuda_supported(part(qkv, heads, 1), options.groups());
  if (!fast) {
    // The general path: three views, the public entry point (validation, every backend), heads merged.
    const auto o = cosine_sim_attention(part(qkv, heads, 0), part(qkv, heads, 1), part(qkv, heads, 2), options);
    return o.transpose(1, 2).reshape({B, T, heads * D});
  }
  TORCH_CHECK(options.groups() >= 1 && D % options.groups() == 0, "flashcos cosine_sim_attention_qkv: groups (",
              options.groups(), ") must divide the head dim ", D);
  if (options.rotary()) {
    rotary_inv_freq(D / options.groups(), options.rotary_base());  // validates the base and the group size
    TORCH_CHECK(options.position_offset() >= 0 && options.position_offset() + T <= (int64_t(1) << 24),
                "flashcos cosine_sim_attention_qkv: positions ", options.position_offset(), " .. ",
                options.position_offset() + T, " must lie in [0, 2^24]");
  }
  return QkvAttentionFunction::apply(qkv, heads, options.causal(), options.scale(), options.groups(), options.rotary(),
                                     options.rotary_base(), options.position_offset(), options.deterministic())[0];
}

}  // namespace flashcos
