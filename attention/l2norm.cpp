// l2norm as one autograd Function: y = x * r with r = 1 / max(|x_g|, eps) per group g of the
// last dim. Saves only y and the per-group r (a (..., groups, 1) float tensor), instead of the
// float32 intermediates a chain of libtorch ops keeps alive: on the default model at seq 8192
// that chain held several hundred MiB per layer. Norms are taken in float32 (float64 for double).
//   backward: dx = r * (dy - y * sum_g(dy * y))   where the norm exceeds eps, else r * dy.
#include <ATen/ATen.h>

#include <ATen/ops/_fused_rms_norm.h>
#include <ATen/ops/_fused_rms_norm_backward.h>

#include <cmath>
#include <torch/csrc/autograd/custom_function.h>

#include "attention/attention.h"

namespace flashcos {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kEps = 1e-12;

at::Tensor grouped(const at::Tensor& t, int64_t groups) {
  auto sizes = t.sizes().vec();
  sizes.back() = t.size(-1) / groups;
  sizes.insert(sizes.end() - 1, groups);
  return t.reshape(sizes);
}

at::ScalarType compute_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

class L2NormFunction : public torch::autograd::Function<L2NormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, int64_t groups) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto g = grouped(x, groups).to(compute_type(x));
    auto sumsq = g.pow(2).sum(-1, /*keepdim=*/true);
    auto r = sumsq.clamp_min(kEps * kEps).rsqrt();
    auto y = (g * r).reshape(x.sizes()).to(x.scalar_type());
    // Saving the output rather than x: the attention after it keeps y alive anyway.
    ctx->save_for_backward({y, r, sumsq > kEps * kEps});
    ctx->saved_data["groups"] = groups;
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const auto &y_saved = saved[0], &r = saved[1], &above = saved[2];
    const int64_t groups = ctx->saved_data["groups"].toInt();
    auto dy = grouped(grads[0], groups).to(r.scalar_type());
    auto y = grouped(y_saved, groups).to(r.scalar_type());
    auto dx = r * (dy - y * (dy * y).sum(-1, /*keepdim=*/true) * above);
    return {dx.reshape(y_saved.sizes()).to(y_saved.scalar_type()), at::Tensor()};
  }
};

// y = out_scale x / rms(x) over the last dim on CUDA, by libtorch's fused RMSNorm kernels (one pass
// each way), saving only y and rstd like L2NormFunction (at::rms_norm's autograd would keep x as
// well: +0.5 GiB on the default model at seq 8192). The backward recovers x = y / (rstd out_scale)
// in y's dtype. out_scale goes in as the norm's weight where it is exact in the input dtype (a
// power of 2), else as a multiply after the norm.
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, double out_scale) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t n = x.size(-1);
    int exp2 = 0;
    const bool as_weight = out_scale != 1.0 && std::frexp(out_scale, &exp2) == 0.5;
    std::optional<at::Tensor> w;
    if (as_weight) w = at::full({n}, out_scale, x.options().requires_grad(false));
    auto [y, rstd] = at::_fused_rms_norm(x, {n}, w, kEps * kEps / static_cast<double>(n));
    if (out_scale != 1.0 && !as_weight) y = y * out_scale;
    ctx->save_for_backward({y, rstd});
    ctx->saved_data["out_scale"] = out_scale;
    ctx->saved_data["as_weight"] = as_weight;
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const at::Tensor &y = saved[0], &rstd = saved[1];
    const double out_scale = ctx->saved_data["out_scale"].toDouble();
    const bool as_weight = ctx->saved_data["as_weight"].toBool();
    const int64_t n = y.size(-1);
    auto r_sizes = y.sizes().vec();
    r_sizes.back() = 1;
    const at::Tensor r = rstd.reshape(r_sizes);
    const at::Tensor x = (y / (r * out_scale)).to(y.scalar_type());
    std::optional<at::Tensor> w;
    if (as_weight) w = at::full({n}, out_scale, y.options());
    const at::Tensor dy = (out_scale != 1.0 && !as_weight) ? grads[0] * out_scale : grads[0];
    auto [dx, dw] = at::_fused_rms_norm_backward(dy.contiguous(), x, {n}, rstd, w, {true, false});
    return {dx, at::Tensor()};
  }
};

}  // namespace

at::Tensor l2norm(const at::Tensor& t, int64_t groups) {
  TORCH_CHECK(t.dim() >= 1 && groups >= 1 && t.size(-1) % groups == 0, "flashcos l2norm: groups (", groups,
              ") must divide the last dim ", t.dim() >= 1 ? t.size(-1) : 0);
  // On CUDA, x / |x| = rms_norm(x) / sqrt(gs): libtorch's fused RMSNorm does it in one pass each
  // way (the op chain of L2NormFunction costs ~10 fp32 passes over q and k).
  if (t.is_cuda() && at::isReducedFloatingType(t.scalar_type()) && t.numel() > 0) {
    return rms_l2norm(t, groups);
  }
  return L2NormFunction::apply(t, groups)[0];
}

at::Tensor rms_l2norm(const at::Tensor& t, int64_t groups) {
  TORCH_CHECK(t.dim() >= 1 && groups >= 1 && t.size(-1) % groups == 0, "flashcos rms_l2norm: groups (", groups,
              ") must divide the last dim ", t.dim() >= 1 ? t.size(-1) : 0);
  const int64_t gs = t.size(-1) / groups;
  return rms_normalize(grouped(t, groups), 1.0 / std::sqrt(static_cast<double>(gs))).reshape(t.sizes());
}

at::Tensor rms_normalize(const at::Tensor& x, double out_scale) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) >= 1, "flashcos rms_normalize: x needs a non-empty last dim");
  if (x.is_cuda() && x.numel() > 0) return RmsNormFunction::apply(x, out_scale)[0];
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t n = x.size(-1);
  auto y = at::rms_norm(x, {n}, std::nullopt, kEps * kEps / static_cast<double>(n));
  return out_scale == 1.0 ? y : y * out_scale;
}

}  // namespace flashcos
