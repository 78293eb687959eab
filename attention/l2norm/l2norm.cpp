// l2norm as one autograd Function: y = x * r with r = 1 / max(|x_g|, eps) per group g of the
// last dim. Saves only y and the per-group r (a (..., groups, 1) float tensor), instead of the
// float32 intermediates a chain of libtorch ops keeps alive: on the default model at seq 8192
// that chain held several hundred MiB per layer. Norms are taken in float32 (float64 for double).
//   backward: dx = r * (dy - y * sum_g(dy * y))   where the norm exceeds eps, else r * dy.
#include <ATen/ATen.h>

#include <cmath>
#include <torch/csrc/autograd/custom_function.h>

#include <flashcos/l2norm.h>
#include <flashcos/rotary.h>
#include "attention/l2norm/l2norm_cuda.h"

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

// The fused CUDA kernels (attention/l2norm/cuda/l2norm.h): one pass each way; saves x and r (y is
// recomputed from them in float32 in the backward). With rotary the output is R(t) y, and the
// backward kernel applies R(t)^T to the gradient (flashcos/rotary.h).
class L2NormCudaFunction : public torch::autograd::Function<L2NormCudaFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, int64_t groups, bool rotary, double base,
                               int64_t offset) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const detail::RotaryArgs rot{base, offset};
    auto [y, r] = detail::l2norm_cuda_forward(x, groups, {}, rotary ? &rot : nullptr);
    ctx->save_for_backward({x, r});
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["rotary"] = rotary;
    ctx->saved_data["base"] = base;
    ctx->saved_data["offset"] = offset;
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto saved = ctx->get_saved_variables();
    const detail::RotaryArgs rot{ctx->saved_data["base"].toDouble(), ctx->saved_data["offset"].toInt()};
    const bool rotary = ctx->saved_data["rotary"].toBool();
    return {detail::l2norm_cuda_backward(grads[0], saved[0], saved[1], ctx->saved_data["groups"].toInt(), {},
                                         rotary ? &rot : nullptr),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor l2norm(const at::Tensor& t, int64_t groups) {
  TORCH_CHECK(t.dim() >= 1 && groups >= 1 && t.size(-1) % groups == 0, "flashcos l2norm: groups (", groups,
              ") must divide the last dim ", t.dim() >= 1 ? t.size(-1) : 0);
  // On CUDA: our fused kernels where they apply (one pass each way, any 16-byte aligned strides),
  // else x / |x| = rms_norm(x) / sqrt(gs) by libtorch's RMSNorm (the op chain of L2NormFunction
  // costs ~10 fp32 passes over q and k).
  if (detail::l2norm_cuda_supported(t, groups) && t.numel() > 0) {
    return L2NormCudaFunction::apply(t, groups, false, 0.0, int64_t(0))[0];
  }
  if (t.is_cuda() && at::isReducedFloatingType(t.scalar_type()) && t.numel() > 0) {
    return rms_l2norm(t, groups);
  }
  return L2NormFunction::apply(t, groups)[0];
}

at::Tensor l2norm_rotary(const at::Tensor& t, int64_t groups, double base, int64_t offset) {
  TORCH_CHECK(t.dim() >= 2 && groups >= 1 && t.size(-1) % groups == 0, "flashcos l2norm_rotary: t must be (..., T, D) ",
              "with groups (", groups, ") dividing D, got ", t.sizes());
  if (detail::l2norm_cuda_supported(t, groups) && t.numel() > 0) {
    rotary_inv_freq(t.size(-1) / groups, base);  // validates the base and the group size
    TORCH_CHECK(offset >= 0 && offset + t.size(-2) <= (int64_t(1) << 24), "flashcos l2norm_rotary: positions ", offset,
                " .. ", offset + t.size(-2), " must lie in [0, 2^24] (exact in float32)");
    return L2NormCudaFunction::apply(t, groups, true, base, offset)[0];
  }
  return rotary(l2norm(t, groups), groups, base, offset);
}

at::Tensor rms_l2norm(const at::Tensor& t, int64_t groups) {
  TORCH_CHECK(t.dim() >= 1 && groups >= 1 && t.size(-1) % groups == 0, "flashcos rms_l2norm: groups (", groups,
              ") must divide the last dim ", t.dim() >= 1 ? t.size(-1) : 0);
  const int64_t gs = t.size(-1) / groups;
  return rms_normalize(grouped(t, groups), 1.0 / std::sqrt(static_cast<double>(gs))).reshape(t.sizes());
}

at::Tensor rms_normalize(const at::Tensor& x, double out_scale) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) >= 1, "flashcos rms_normalize: x needs a non-empty last dim");
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t n = x.size(-1);
  const double eps = kEps * kEps / static_cast<double>(n);  // max(|x|, kEps) where |x| is not ~0
  // out_scale goes in as the norm's weight where it is exact in x's dtype (a power of 2), else as
  // a multiply after the norm.
  int exp2 = 0;
  if (out_scale != 1.0 && std::frexp(out_scale, &exp2) == 0.5) {
    return at::rms_norm(x, {n}, at::full({n}, out_scale, x.options().requires_grad(false)), eps);
  }
  auto y = at::rms_norm(x, {n}, std::nullopt, eps);
  return out_scale == 1.0 ? y : y * out_scale;
}

}  // namespace flashcos
