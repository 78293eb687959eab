// Fused classifier + cross-entropy (classifier_cross_entropy.h): the autograd Function, its per-
// chunk row kernel launch (model/fused/cuda/cross_entropy.h) and the libtorch-op row path.
#include "model/fused/classifier_cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>

#include "attention/common/poison.h"

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "model/fused/cuda/cross_entropy.h"
#endif

namespace flashcos::model::fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool row_kernel_applies(const at::Tensor& logits) {
#ifdef FLASHCOS_WITH_CUDA
  const auto t = logits.scalar_type();
  return logits.is_cuda() && (t == at::kHalf || t == at::kBFloat16 || t == at::kFloat);
#else
  return false;
#endif
}

// loss_rows = logsumexp(z) - z[target]; z overwritten with softmax(z) - onehot(target).
void softmax_cross_entropy_rows(at::Tensor& z, const at::Tensor& target, at::Tensor& loss_rows) {
  if (row_kernel_applies(z)) {
#ifdef FLASHCOS_WITH_CUDA
    namespace fc = flashcos::cuda;
    fc::CrossEntropyParams p;
    p.rows = z.size(0), p.vocab = int(z.size(1));
    p.dtype = z.scalar_type() == at::kHalf       ? fc::DType::kHalf
              : z.scalar_type() == at::kBFloat16 ? fc::DType::kBFloat16
                                                 : fc::DType::kFloat;
    p.logits = z.data_ptr(), p.dlogits = z.data_ptr();
    p.target = target.data_ptr<int64_t>();
    p.loss = loss_rows.data_ptr<float>();
    C10_CUDA_CHECK(fc::run_cross_entropy_rows(p, at::cuda::getCurrentCUDAStream()));
#endif
    return;
  }
  const at::Tensor zf = z.to(loss_rows.scalar_type());
  const at::Tensor lse = zf.logsumexp(1);
  const at::Tensor idx = target.unsqueeze(1);
  loss_rows.copy_(lse - zf.gather(1, idx).squeeze(1));
  at::Tensor d = (zf - lse.unsqueeze(1)).exp();
  d.scatter_add_(1, idx, at::full({z.size(0), 1}, -1.0, d.options()));
  z.copy_(d);
}

class ClassifierCrossEntropyFunction : public torch::autograd::Function<ClassifierCrossEntropyFunction> {
 public:
  // bias is optional: Function::apply records every at::Tensor argument as a variable (its
  // device, dtype, sizes), which throws for an undefined tensor; an empty std::optional is not one.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias_opt, const at::Tensor& target,
                               at::ScalarType dt, int64_t chunk_rows) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const at::Tensor bias = bias_opt.has_value() ? *bias_opt : at::Tensor();
    const int64_t C = h.size(-1), V = weight.size(0), N = target.numel();
#ifdef FLASHCOS_WITH_CUDA
    std::optional<c10::cuda::CUDAGuard> guard;
    if (h.is_cuda()) guard.emplace(h.device());
#endif
    const at::Tensor h2 = h.reshape({N, C}).to(dt).contiguous();
    const at::Tensor w = weight.to(dt).contiguous();  // (V, C): a 256 x 512 copy, once per call
    const at::Tensor b = bias.defined() ? bias.to(dt) : at::Tensor();
    const at::Tensor t = target.reshape({N}).contiguous();
    const auto loss_dtype = dt == at::kDouble ? at::kDouble : at::kFloat;
    // The logits of each chunk, then (in place) its rows' dlogits: (N, V) in dt, kept for backward.
    at::Tensor dlogits = at::empty({N, V}, h2.options());
    at::Tensor loss_rows = at::empty({N}, h2.options().dtype(loss_dtype));
    flashcos::detail::poison_if_requested(dlogits);
    flashcos::detail::poison_if_requested(loss_rows);
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
      const int64_t n = std::min(chunk_rows, N - r0);
      at::Tensor z = dlogits.narrow(0, r0, n);
      const at::Tensor hc = h2.narrow(0, r0, n);
      if (b.defined()) {
        at::addmm_out(z, b, hc, w.t());
      } else {
        at::mm_out(z, hc, w.t());
      }
      at::Tensor lc = loss_rows.narrow(0, r0, n);
      softmax_cross_entropy_rows(z, t.narrow(0, r0, n), lc);
    }
    ctx->save_for_backward({h2, w, dlogits});
    ctx->saved_data["h_dtype"] = h.scalar_type();
    ctx->saved_data["h_sizes"] = h.sizes();
    ctx->saved_data["w_dtype"] = weight.scalar_type();
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["b_dtype"] = bias.defined() ? bias.scalar_type() : weight.scalar_type();
    return {loss_rows.sum() / static_cast<double>(N)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h2 = saved[0], &w = saved[1], &dlogits = saved[2];
    const int64_t N = dlogits.size(0);
    const at::Tensor none;
    const auto ct = dlogits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    // g / N as a device scalar (no host sync); applied to the GEMMs' outputs, so dlogits keeps the
    // full range of softmax - onehot in its 16-bit dtype (no 1 / N underflow in fp16).
    const at::Tensor scale = grads[0].to(ct) / static_cast<double>(N);
    at::Tensor dh = at::mm(dlogits, w);
    dh.mul_(scale);
    at::Tensor dw = at::mm(dlogits.t(), h2).to(ct).mul_(scale);
    at::Tensor db;
    if (ctx->saved_data["has_bias"].toBool()) {
      db = dlogits.sum(0, /*keepdim=*/false, ct).mul_(scale).to(ctx->saved_data["b_dtype"].toScalarType());
    }
    return {dh.view(ctx->saved_data["h_sizes"].toIntVector()).to(ctx->saved_data["h_dtype"].toScalarType()),
            dw.to(ctx->saved_data["w_dtype"].toScalarType()), db, none, none, none};
  }
};

}  // namespace

at::Tensor classifier_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias,
                                    const at::Tensor& target, at::ScalarType compute_dtype, int64_t chunk_rows) {
  TORCH_CHECK(h.defined() && h.dim() >= 1 && h.size(-1) >= 1, "flashcos classifier_cross_entropy: h must be (..., C)");
  TORCH_CHECK(weight.defined() && weight.dim() == 2 && weight.size(1) == h.size(-1) && weight.size(0) >= 1,
              "flashcos classifier_cross_entropy: weight ", weight.sizes(), " must be (V, C) with C = ", h.size(-1));
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
              "flashcos classifier_cross_entropy: bias ", bias.defined() ? bias.sizes() : at::IntArrayRef{},
              " must be (V) = (", weight.size(0), ")");
  TORCH_CHECK(target.defined() && target.scalar_type() == at::kLong && target.numel() * h.size(-1) == h.numel(),
              "flashcos classifier_cross_entropy: target must be int64 with one entry per row of h (",
              h.numel() / h.size(-1), "), got ", target.scalar_type(), " ", target.sizes());
  TORCH_CHECK(target.numel() >= 1, "flashcos classifier_cross_entropy: no rows (the mean of nothing)");
  TORCH_CHECK(at::isFloatingType(compute_dtype), "flashcos classifier_cross_entropy: compute dtype must be floating, got ",
              compute_dtype);
  TORCH_CHECK(chunk_rows >= 1, "flashcos classifier_cross_entropy: chunk_rows must be >= 1, got ", chunk_rows);
  TORCH_CHECK(weight.device() == h.device() && target.device() == h.device() &&
                  (!bias.defined() || bias.device() == h.device()),
              "flashcos classifier_cross_entropy: h, weight, bias and target must be on one device");
  const std::optional<at::Tensor> bias_opt = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  return ClassifierCrossEntropyFunction::apply(h, weight, bias_opt, target, compute_dtype, chunk_rows)[0];
}

}  // namespace flashcos::model::fused
