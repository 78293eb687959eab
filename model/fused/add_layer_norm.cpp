// Residual add + LayerNorm (add_layer_norm.h): the autograd Function, its CUDA kernel launches
// (model/fused/cuda/add_layer_norm.h) and the same math as libtorch ops for everything else.
#include "model/fused/add_layer_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "attention/common/poison.h"
#include "model/fused/switch.h"
#include "model/device.h"
#include "model/fused/grad_accumulate.h"
#include "model/kernel_tensors.h"

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "model/fused/cuda/add_layer_norm.h"
#endif

namespace flashcos::model::fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifdef FLASHCOS_WITH_CUDA
namespace fc = flashcos::cuda;

fc::DType to_dtype(at::ScalarType t) { return kernel_dtype(t, "flashcos add_layer_norm"); }
#endif

class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  // Returns {normed, sum} with a residual r, {normed} without.
  // r and r_bias are optional: Function::apply records every at::Tensor argument as a variable (its
  // device, dtype, sizes), which throws for an undefined tensor; an empty std::optional is a
  // non-variable.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& r_opt,
                               const std::optional<at::Tensor>& r_bias_opt, const at::Tensor& gamma,
                               const at::Tensor& beta, double eps, at::ScalarType out_dtype) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const at::Tensor r = r_opt.has_value() ? *r_opt : at::Tensor();
    const at::Tensor r_bias = r_bias_opt.has_value() ? *r_bias_opt : at::Tensor();
    const bool has_r = r.defined(), has_bias = r_bias.defined();
    const int64_t C = x.size(-1), N = C == 0 ? 0 : x.numel() / C;
    const at::Tensor x2 = x.reshape({N, C}).contiguous();
    const at::Tensor r2 = has_r ? r.reshape({N, C}).contiguous() : at::Tensor();
    at::ScalarType s_dtype = has_r ? at::result_type(x, r) : x.scalar_type();
    if (has_bias) s_dtype = at::promote_types(s_dtype, r_bias.scalar_type());
    const bool kernel = add_layer_norm_uses_kernel(x2, r2, gamma, out_dtype, r_bias) && beta.is_contiguous() &&
                        aligned16(gamma) && aligned16(beta);
    at::Tensor s, y, mean, rstd;
    if (kernel) {
#ifdef FLASHCOS_WITH_CUDA
      const c10::cuda::CUDAGuard guard(x.device());
      s = has_r ? at::empty({N, C}, x2.options().dtype(s_dtype)) : x2;
      y = at::empty({N, C}, x2.options().dtype(out_dtype));
      mean = at::empty({N}, x2.options().dtype(at::kFloat));
      rstd = at::empty({N}, x2.options().dtype(at::kFloat));
      if (has_r) flashcos::detail::poison_if_requested(s);
      flashcos::detail::poison_if_requested(y);
      fc::AddLayerNormParams p;
      p.rows = N, p.width = int(C), p.eps = float(eps);
      p.x = x2.data_ptr(), p.x_dtype = to_dtype(x2.scalar_type());
      if (has_r) p.r = r2.data_ptr(), p.r_dtype = to_dtype(r2.scalar_type());
      if (has_bias) p.r_bias = r_bias.data_ptr(), p.r_bias_dtype = to_dtype(r_bias.scalar_type());
      p.gamma = gamma.data_ptr(), p.beta = beta.data_ptr(), p.w_dtype = to_dtype(gamma.scalar_type());
      if (has_r) p.s = s.data_ptr();
      p.s_dtype = to_dtype(s_dtype);
      p.y = y.data_ptr(), p.y_dtype = to_dtype(out_dtype);
      p.mean = mean.data_ptr<float>(), p.rstd = rstd.data_ptr<float>();
      C10_CUDA_CHECK(fc::run_add_layer_norm_fwd(p, at::cuda::getCurrentCUDAStream()));
#endif
    } else {
      const auto ct = op_compute_type({x.scalar_type(), s_dtype, gamma.scalar_type(), out_dtype});
      // With a bias: x + (r + r_bias) in the compute type, rounded once to s's dtype, as the
      // kernel does it.
      if (has_bias) {
        s = (x2.to(ct) + (r2.to(ct) + r_bias.to(ct))).to(s_dtype);
      } else {
        s = has_r ? x2 + r2 : x2;
      }
      const at::Tensor sf = s.to(ct);
      mean = sf.mean(-1);
      const at::Tensor centred = sf - mean.unsqueeze(-1);
      rstd = (centred.square().mean(-1) + eps).rsqrt();
      y = (centred * rstd.unsqueeze(-1) * gamma.to(ct) + beta.to(ct)).to(out_dtype);
    }
    ctx->save_for_backward({s, gamma, mean, rstd});
    // The parameters themselves, for their .grad (grad_accumulate.h).
    ctx->saved_data["gamma"] = gamma;
    ctx->saved_data["beta"] = beta;
    if (has_bias) ctx->saved_data["r_bias"] = r_bias;
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["has_r"] = has_r;
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["r_dtype"] = has_r ? r.scalar_type() : x.scalar_type();
    ctx->saved_data["bias_dtype"] = has_bias ? r_bias.scalar_type() : x.scalar_type();
    ctx->saved_data["beta_dtype"] = beta.scalar_type();
    ctx->saved_data["out_dtype"] = out_dtype;
    ctx->saved_data["sizes"] = x.sizes();
    if (!has_r) return {y.view(x.sizes())};
    return {y.view(x.sizes()), s.view(x.sizes())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &s = saved[0], &gamma = saved[1], &mean = saved[2], &rstd = saved[3];
    const bool kernel = ctx->saved_data["kernel"].toBool(), has_r = ctx->saved_data["has_r"].toBool();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const auto x_dtype = ctx->saved_data["x_dtype"].toScalarType();
    const auto r_dtype = ctx->saved_data["r_dtype"].toScalarType();
    const auto bias_dtype = ctx->saved_data["bias_dtype"].toScalarType();
    const auto beta_dtype = ctx->saved_data["beta_dtype"].toScalarType();
    const auto out_dtype = ctx->saved_data["out_dtype"].toScalarType();
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const int64_t N = s.size(0), C = s.size(1);
    const at::Tensor none;
    // An output nobody used arrives undefined: no gradient from it.
    at::Tensor dy = grads[0].defined() ? grads[0].reshape({N, C}).to(out_dtype).contiguous()
                                       : at::zeros({N, C}, s.options().dtype(out_dtype));
    at::Tensor ds = has_r && grads.size() > 1 && grads[1].defined()
                        ? grads[1].reshape({N, C}).to(s.scalar_type()).contiguous()
                        : at::Tensor();
    at::Tensor dx, dr, dbias, dgamma, dbeta;
    if (kernel) {
#ifdef FLASHCOS_WITH_CUDA
      const c10::cuda::CUDAGuard guard(s.device());
      if (!aligned16(dy)) dy = dy.clone();
      if (ds.defined() && !aligned16(ds)) ds = ds.clone();
      dx = at::empty({N, C}, s.options().dtype(x_dtype));
      const bool separate_dr = has_r && r_dtype != x_dtype;
      if (separate_dr) dr = at::empty({N, C}, s.options().dtype(r_dtype));
      // Parameter gradients straight into their .grad where that is what autograd would do.
      // needs_input_grad counts the tensor inputs present: x, (r, (r_bias,)) gamma, beta.
      auto out = [&](const char* name, size_t edge, at::ScalarType dtype) {
        return param_grad_out(ctx->saved_data[name].toTensor(), ctx->needs_input_grad(edge),
                              [&] { return at::empty({C}, gamma.options().dtype(dtype)); });
      };
      const size_t gamma_edge = 1 + (has_r ? 1 : 0) + (has_bias ? 1 : 0);
      const ParamGradOut gamma_out = out("gamma", gamma_edge, gamma.scalar_type());
      const ParamGradOut beta_out = out("beta", gamma_edge + 1, beta_dtype);
      const ParamGradOut bias_out = has_bias ? out("r_bias", 2, bias_dtype) : ParamGradOut{};
      dgamma = gamma_out.dst, dbeta = beta_out.dst, dbias = bias_out.dst;
      flashcos::detail::poison_if_requested(dx);
      if (separate_dr) flashcos::detail::poison_if_requested(dr);
      fc::AddLayerNormParams p;
      p.rows = N, p.width = int(C), p.num_sms = current_sm_count();
      p.x = s.data_ptr(), p.x_dtype = to_dtype(x_dtype);  // read only where there is no r: then s is x
      if (has_r) {
        p.r = s.data_ptr();  // marks "there was a residual"; the backward reads s, never r
        p.r_dtype = to_dtype(r_dtype);
        p.s = s.data_ptr();
      }
      if (has_bias) {
        p.r_bias = s.data_ptr();  // marks "there was a bias"; the backward never reads it
        p.r_bias_dtype = to_dtype(bias_dtype);
        p.dr_bias = dbias.data_ptr();
      }
      p.s_dtype = to_dtype(s.scalar_type());
      p.gamma = gamma.data_ptr(), p.w_dtype = to_dtype(gamma.scalar_type());
      TORCH_CHECK(beta_dtype == gamma.scalar_type(), "flashcos add_layer_norm: gamma and beta must share a dtype");
      p.y_dtype = to_dtype(out_dtype);
      p.mean = mean.data_ptr<float>(), p.rstd = rstd.data_ptr<float>();
      p.dy = dy.data_ptr();
      p.ds = ds.defined() ? ds.data_ptr() : nullptr;
      p.dx = dx.data_ptr();
      p.dr = separate_dr ? dr.data_ptr() : nullptr;
      const int64_t blocks = fc::add_layer_norm_backward_blocks(p), nq = fc::add_layer_norm_backward_partials(p);
      at::Tensor partials = at::empty({blocks, nq, C}, s.options().dtype(at::kFloat));
      p.partials = partials.data_ptr<float>();
      p.dgamma = dgamma.data_ptr(), p.dbeta = dbeta.data_ptr();
      p.accumulate_dgamma = gamma_out.into_grad, p.accumulate_dbeta = beta_out.into_grad;
      p.accumulate_dr_bias = bias_out.into_grad;
      C10_CUDA_CHECK(fc::run_add_layer_norm_bwd(p, at::cuda::getCurrentCUDAStream()));
      // Added already: nothing for autograd to add.
      dgamma = gamma_out.for_autograd(), dbeta = beta_out.for_autograd(), dbias = bias_out.for_autograd();
      if (has_r && !separate_dr) dr = dx;
#endif
    } else {
      const auto ct = mean.scalar_type();
      const at::Tensor xhat = (s.to(ct) - mean.unsqueeze(-1)) * rstd.unsqueeze(-1);
      const at::Tensor dyf = dy.to(ct);
      const at::Tensor g = dyf * gamma.to(ct);
      at::Tensor d = rstd.unsqueeze(-1) * (g - g.mean(-1, true) - xhat * (g * xhat).mean(-1, true));
      if (ds.defined()) d = d + ds.to(ct);
      dx = d.to(x_dtype);
      if (has_r) dr = d.to(r_dtype);
      if (has_bias) dbias = d.sum(0).to(bias_dtype);
      dgamma = (dyf * xhat).sum(0).to(gamma.scalar_type());
      dbeta = dyf.sum(0).to(beta_dtype);
    }
    return {dx.view(sizes), has_r ? dr.view(sizes) : none, has_bias && dbias.defined() ? dbias : none, dgamma, dbeta,
            none, none};
  }
};

void check_args(const at::Tensor& x, const at::Tensor& r, const at::Tensor& r_bias, const at::Tensor& gamma,
                const at::Tensor& beta) {
  TORCH_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) >= 1, "flashcos add_layer_norm: x must be (..., C) with C >= 1");
  TORCH_CHECK(!r.defined() || r.sizes() == x.sizes(), "flashcos add_layer_norm: r ", r.defined() ? r.sizes() : at::IntArrayRef{},
              " must have x's shape ", x.sizes());
  TORCH_CHECK(!r_bias.defined() || r.defined(), "flashcos add_layer_norm: r_bias (the residual branch's bias) needs a "
              "residual r; pass r or leave r_bias undefined");
  TORCH_CHECK(!r_bias.defined() || (r_bias.dim() == 1 && r_bias.size(0) == x.size(-1)),
              "flashcos add_layer_norm: r_bias ", r_bias.defined() ? r_bias.sizes() : at::IntArrayRef{},
              " must be (C) = (", x.size(-1), ")");
  TORCH_CHECK(!r_bias.defined() || r_bias.device() == x.device(),
              "flashcos add_layer_norm: x and r_bias on different devices");
  TORCH_CHECK(gamma.defined() && beta.defined() && gamma.dim() == 1 && beta.dim() == 1 && gamma.size(0) == x.size(-1) &&
                  beta.size(0) == x.size(-1),
              "flashcos add_layer_norm: gamma ", gamma.sizes(), " and beta ", beta.sizes(), " must be (C) = (",
              x.size(-1), ")");
  TORCH_CHECK(gamma.scalar_type() == beta.scalar_type(), "flashcos add_layer_norm: gamma (", gamma.scalar_type(),
              ") and beta (", beta.scalar_type(), ") must share a dtype");
  TORCH_CHECK(!r.defined() || r.device() == x.device(), "flashcos add_layer_norm: x and r on different devices");
}

}  // namespace

bool add_layer_norm_uses_kernel(const at::Tensor& x, const at::Tensor& r, const at::Tensor& gamma,
                                at::ScalarType out_dtype, const at::Tensor& r_bias) {
#ifdef FLASHCOS_WITH_CUDA
  if (!x.is_cuda() || !fc::add_layer_norm_supported(x.size(-1))) return false;
  if (!kernel_takes_dtype(x.scalar_type()) || !kernel_takes_dtype(gamma.scalar_type()) ||
      !kernel_takes_dtype(out_dtype)) {
    return false;
  }
  if (r.defined() && !kernel_takes_dtype(r.scalar_type())) return false;
  if (!gamma.is_cuda() || gamma.device() != x.device() || !gamma.is_contiguous()) return false;
  if (r_bias.defined() && (!kernel_takes_dtype(r_bias.scalar_type()) || !r_bias.is_cuda() ||
                           r_bias.device() != x.device() || !r_bias.is_contiguous() || !aligned16(r_bias))) {
    return false;
  }
  // The kernels read contiguous rows with 16-byte accesses (the Function makes x, r contiguous).
  return (!x.is_contiguous() || aligned16(x)) && (!r.defined() || !r.is_contiguous() || aligned16(r));
#else
  return false;
#endif
}

AddLayerNormOut add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& r_bias,
                               const at::Tensor& gamma, const at::Tensor& beta, double eps, at::ScalarType out_dtype) {
  check_args(x, r, r_bias, gamma, beta);
  auto opt = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  auto out = AddLayerNormFunction::apply(x, opt(r), opt(r_bias), gamma, beta, eps, out_dtype);
  if (!r.defined()) return {x, out[0]};
  return {out[1], out[0]};
}

AddLayerNormOut add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& gamma,
                               const at::Tensor& beta, double eps, at::ScalarType out_dtype) {
  return add_layer_norm(x, r, at::Tensor(), gamma, beta, eps, out_dtype);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps,
                      at::ScalarType out_dtype) {
  return add_layer_norm(x, at::Tensor(), at::Tensor(), gamma, beta, eps, out_dtype).normed;
}

}  // namespace flashcos::model::fused
