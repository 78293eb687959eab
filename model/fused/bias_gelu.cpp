// Bias + GELU (bias_gelu.h): the autograd Function, its CUDA kernel launches
// (model/fused/cuda/bias_gelu.h) and the same math as libtorch ops for everything else.
#include "model/fused/bias_gelu.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "attention/common/poison.h"
#include "model/device.h"
#include "model/fused/grad_accumulate.h"
#include "model/kernel_tensors.h"

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "model/fused/cuda/bias_gelu.h"
#endif

namespace flashcos::model::fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifdef FLASHCOS_WITH_CUDA
namespace fc = flashcos::cuda;

fc::DType to_dtype(at::ScalarType t) { return kernel_dtype(t, "flashcos bias_gelu"); }
#endif

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& b) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t F = y.size(-1), N = F == 0 ? 0 : y.numel() / F;
    const at::Tensor y2 = y.reshape({N, F}).contiguous();
    const bool kernel = bias_gelu_uses_kernel(y2, b);
    at::Tensor h;
    if (kernel) {
#ifdef FLASHCOS_WITH_CUDA
      const c10::cuda::CUDAGuard guard(y.device());
      h = at::empty({N, F}, y2.options());
      flashcos::detail::poison_if_requested(h);
      fc::BiasGeluParams p;
      p.rows = N, p.width = int(F), p.num_sms = current_sm_count();
      p.y = y2.data_ptr(), p.dtype = to_dtype(y2.scalar_type());
      p.b = b.data_ptr(), p.b_dtype = to_dtype(b.scalar_type());
      p.h = h.data_ptr();
      C10_CUDA_CHECK(fc::run_bias_gelu_fwd(p, at::cuda::getCurrentCUDAStream()));
#endif
    } else {
      const auto ct = op_compute_type({y.scalar_type(), b.scalar_type()});
      h = at::gelu(y2.to(ct) + b.to(ct)).to(y.scalar_type());
    }
    ctx->save_for_backward({y2, b});
    ctx->saved_data["b"] = b;  // the parameter itself, for its .grad
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["sizes"] = y.sizes();
    return h.view(y.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &y = saved[0], &b = saved[1];
    const bool kernel = ctx->saved_data["kernel"].toBool();
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const int64_t N = y.size(0), F = y.size(1);
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    at::Tensor dh = grads[0].reshape({N, F}).to(y.scalar_type()).contiguous();
    at::Tensor dy, db;
    if (kernel) {
#ifdef FLASHCOS_WITH_CUDA
      const c10::cuda::CUDAGuard guard(y.device());
      if (!aligned16(dh)) dh = dh.clone();
      dy = at::empty({N, F}, y.options());
      // db straight into b's .grad where that is what autograd would do (grad_accumulate.h).
      const at::Tensor b_param = ctx->saved_data["b"].toTensor();
      const ParamGradOut db_out =
          param_grad_out(b_param, ctx->needs_input_grad(1), [&] { return at::empty({F}, b.options()); });
      flashcos::detail::poison_if_requested(dy);
      fc::BiasGeluParams p;
      p.rows = N, p.width = int(F), p.num_sms = current_sm_count();
      p.y = y.data_ptr(), p.dtype = to_dtype(y.scalar_type());
      p.b = b.data_ptr(), p.b_dtype = to_dtype(b.scalar_type());
      p.dh = dh.data_ptr();
      p.dy = dy.data_ptr();
      at::Tensor partials = at::empty({fc::bias_gelu_backward_row_blocks(p), F}, y.options().dtype(at::kFloat));
      p.partials = partials.data_ptr<float>();
      p.db = db_out.dst.data_ptr();
      p.accumulate_db = db_out.into_grad;
      C10_CUDA_CHECK(fc::run_bias_gelu_bwd(p, at::cuda::getCurrentCUDAStream()));
      db = db_out.for_autograd();
#endif
    } else {
      const auto ct = op_compute_type({y.scalar_type(), b.scalar_type()});
      const at::Tensor dz = at::gelu_backward(dh.to(ct), y.to(ct) + b.to(ct));
      dy = dz.to(y.scalar_type());
      db = dz.sum(0).to(b.scalar_type());
    }
    return {dy.view(sizes), db};
  }
};

}  // namespace

bool bias_gelu_uses_kernel(const at::Tensor& y, const at::Tensor& b) {
#ifdef FLASHCOS_WITH_CUDA
  if (!y.is_cuda() || !fc::bias_gelu_supported(y.size(-1))) return false;
  if (!kernel_takes_dtype(y.scalar_type()) || !kernel_takes_dtype(b.scalar_type())) return false;
  if (!b.is_cuda() || b.device() != y.device() || !b.is_contiguous() || !aligned16(b)) return false;
  // 16-byte row accesses (the Function makes y contiguous).
  return !y.is_contiguous() || aligned16(y);
#else
  return false;
#endif
}

at::Tensor bias_gelu(const at::Tensor& y, const at::Tensor& b) {
  TORCH_CHECK(y.defined() && y.dim() >= 1 && y.size(-1) >= 1, "flashcos bias_gelu: y must be (..., F) with F >= 1");
  TORCH_CHECK(b.defined() && b.dim() == 1 && b.size(0) == y.size(-1), "flashcos bias_gelu: b ",
              b.defined() ? b.sizes() : at::IntArrayRef{}, " must be (F) = (", y.size(-1), "), y's last dimension");
  TORCH_CHECK(b.device() == y.device(), "flashcos bias_gelu: y (", y.device(), ") and b (", b.device(),
              ") on different devices");
  TORCH_CHECK(at::isFloatingType(y.scalar_type()) && at::isFloatingType(b.scalar_type()),
              "flashcos bias_gelu: y and b must be floating point, got ", y.scalar_type(), " and ", b.scalar_type());
  return BiasGeluFunction::apply(y, b);
}

}  // namespace flashcos::model::fused
