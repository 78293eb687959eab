// fused::embedding (embedding.h): the autograd Function, its gradient kernels' launch and the
// libtorch path.
#include "model/fused/embedding.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/device.h"
#include "model/fused/grad_accumulate.h"

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "model/fused/cuda/embedding_grad.h"
#endif

namespace flashcos::model::fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class EmbeddingFunction : public torch::autograd::Function<EmbeddingFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& idx) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    ctx->save_for_backward({idx});
    ctx->saved_data["weight"] = weight;  // the parameter itself, for its .grad
    return at::embedding(weight, idx);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const at::Tensor idx = ctx->get_saved_variables()[0];
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return {at::Tensor(), at::Tensor()};
    const int64_t V = weight.size(0), C = weight.size(1);
    if (!embedding_grad_uses_kernel(weight) || grads[0].scalar_type() != at::kFloat) {
      return {at::embedding_dense_backward(grads[0], idx, V, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false),
              at::Tensor()};
    }
#ifdef FLASHCOS_WITH_CUDA
    const c10::cuda::CUDAGuard guard(weight.device());
    const at::Tensor dx = grads[0].reshape({-1, C}).contiguous();
    const at::Tensor ids = idx.reshape({-1}).to(at::kLong).contiguous();
    const ParamGradOut dw = param_grad_out(weight, true, [&] { return at::empty({V, C}, weight.options()); });
    flashcos::cuda::EmbeddingGradParams p;
    p.tokens = ids.numel(), p.rows = V, p.cols = int(C), p.num_sms = current_sm_count();
    p.idx = ids.data_ptr<int64_t>(), p.dx = dx.data_ptr<float>(), p.dw = dw.dst.data_ptr<float>();
    p.accumulate = dw.into_grad;
    at::Tensor partials = at::empty({flashcos::cuda::embedding_grad_scratch_floats(p)}, dx.options());
    p.partials = partials.data_ptr<float>();
    C10_CUDA_CHECK(flashcos::cuda::run_embedding_grad(p, at::cuda::getCurrentCUDAStream()));
    return {dw.for_autograd(), at::Tensor()};
#else
    return {at::embedding_dense_backward(grads[0], idx, V, -1, false), at::Tensor()};
#endif
  }
};

}  // namespace

bool embedding_grad_uses_kernel(const at::Tensor& weight) {
#ifdef FLASHCOS_WITH_CUDA
  return weight.is_cuda() && weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.is_contiguous() &&
         flashcos::cuda::embedding_grad_supported(weight.size(0), weight.size(1));
#else
  (void)weight;
  return false;
#endif
}

at::Tensor embedding(const at::Tensor& idx, const at::Tensor& weight) {
  TORCH_CHECK(weight.defined() && weight.dim() == 2 && at::isFloatingType(weight.scalar_type()),
              "flashcos embedding: weight must be a floating (V, C) table, got ",
              weight.defined() ? weight.sizes() : at::IntArrayRef{});
  TORCH_CHECK(idx.defined() && (idx.scalar_type() == at::kLong || idx.scalar_type() == at::kInt),
              "flashcos embedding: idx must be int64 or int32, got ", idx.defined() ? idx.scalar_type() : at::kLong);
  TORCH_CHECK(idx.device() == weight.device(), "flashcos embedding: idx (", idx.device(), ") and weight (",
              weight.device(), ") on different devices");
  return EmbeddingFunction::apply(weight, idx);
}

}  // namespace flashcos::model::fused
