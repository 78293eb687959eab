// AttentionFunction: one torch::autograd::Function for the tiled path and the fused kernels.
// Saved for backward: q, k, v, mask, bias, o and l (the per-row sums): O(n) beyond the inputs.
#include "attention/cosine/autograd.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace flashcos::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const std::optional<at::Tensor>& bias_opt,
                               const std::optional<at::Tensor>& mask_opt, bool causal, double scale,
                               bool exp_kind, bool bias_batch_dim, int64_t tile_size, double qk_max, bool deterministic,
                               bool fused) {
    // bias / mask come as optionals: Function::apply cannot take undefined at::Tensor inputs.
    const at::Tensor bias = bias_opt.value_or(at::Tensor()), mask = mask_opt.value_or(at::Tensor());
    CoreArgs args{causal, scale, exp_kind, bias_batch_dim, tile_size, qk_max, deterministic};
    // Autocast must not re-cast inside the kernels' libtorch glue: dtypes are fixed at the entry.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    ForwardResult r = fused ? fused_forward(q, k, v, mask, bias, args) : tiled_forward(q, k, v, mask, bias, args);
    ctx->save_for_backward({q, k, v, bias, mask, r.o, r.l});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["exp_kind"] = exp_kind;
    ctx->saved_data["bias_batch_dim"] = bias_batch_dim;
    ctx->saved_data["tile_size"] = tile_size;
    ctx->saved_data["qk_max"] = qk_max;
    ctx->saved_data["deterministic"] = deterministic;
    ctx->saved_data["fused"] = fused;
    return {r.o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &bias = saved[3], &mask = saved[4], &o = saved[5],
               &l = saved[6];
    CoreArgs args{ctx->saved_data["causal"].toBool(), ctx->saved_data["scale"].toDouble(),
                  ctx->saved_data["exp_kind"].toBool(), ctx->saved_data["bias_batch_dim"].toBool(),
                  ctx->saved_data["tile_size"].toInt(), ctx->saved_data["qk_max"].toDouble(),
                  ctx->saved_data["deterministic"].toBool()};
    const bool fused = ctx->saved_data["fused"].toBool();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    at::Tensor dout = grad_outputs[0];
    if (!dout.defined()) dout = at::zeros_like(o);
    BackwardResult g = fused ? fused_backward(dout, q, k, v, o, l, mask, bias, args)
                             : tiled_backward(dout, q, k, v, o, l, mask, bias, args);
    at::Tensor dbias = bias.defined() && ctx->needs_input_grad(3) ? g.dbias : at::Tensor();
    return {g.dq,         g.dk,         g.dv,         dbias,        at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                              const at::Tensor& bias, const CoreArgs& args, bool fused) {
  return AttentionFunction::apply(q, k, v, std::optional<at::Tensor>(bias), std::optional<at::Tensor>(mask),
                                  args.causal, args.scale, args.exp_kind, args.bias_batch_dim, args.tile_size,
                                  args.qk_max, args.deterministic, fused)[0];
}

}  // namespace flashcos::detail
