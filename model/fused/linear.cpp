// linear_from_copy (linear.h): the autograd Function and its weight-gradient routing.
#include "model/fused/linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/fused/gemm_accumulate.h"
#include "model/fused/grad_accumulate.h"

namespace flashcos::model::fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Weight gradients written into .grad here (grad_accumulate.h), float32 weights only: the GEMM
// accumulates in float32.
bool accumulate_here(const at::Tensor& w) {
  return w.scalar_type() == at::kFloat && grad_accumulates_here(w, /*allow_undefined=*/true);
}

// Several weights' gradients as one GEMM into one float32 buffer whose row blocks are their .grad
// tensors: set up that way where all are undefined (the buffer is allocated and each .grad becomes
// a view of it), reused where they already are such views (later micro-steps, gradients zeroed in
// place). One (sum out_i) x in GEMM runs much faster than one per weight (q, k, v: 3 x 512 rows).
// False (nothing done) where the weights do not allow it; the caller then goes weight by weight.
bool stacked_gradient(AutogradContext* ctx, const at::Tensor& dy, const at::Tensor& x2,
                      const std::vector<at::Tensor>& weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!ctx->needs_input_grad(2 + i) || !accumulate_here(weights[i])) return false;
  }
  const int64_t in = x2.size(1), rows = dy.size(1);
  const at::Tensor& g0 = weights[0].grad();
  if (!g0.defined()) {
    for (const auto& w : weights) {
      if (w.grad().defined()) return false;
    }
    at::Tensor buffer = at::empty({rows, in}, weights[0].options().dtype(at::kFloat));
    gemm_at_b_accumulate(dy, x2, buffer, 0.f);
    int64_t row = 0;
    for (const auto& w : weights) {
      w.mutable_grad() = buffer.narrow(0, row, w.size(0));
      row += w.size(0);
    }
    return true;
  }
  int64_t row = 0;
  for (const auto& w : weights) {
    const at::Tensor& g = w.grad();
    if (!g.defined() || !g.storage().is_alias_of(g0.storage()) || g.data_ptr<float>() != g0.data_ptr<float>() + row * in) {
      return false;
    }
    row += w.size(0);
  }
  if (g0.storage_offset() + rows * in > static_cast<int64_t>(g0.storage().nbytes() / sizeof(float))) return false;
  gemm_at_b_accumulate(dy, x2, g0.as_strided({rows, in}, {in, 1}), 1.f);
  return true;
}

// The CUDA GEMM path: half-precision x and dy, float32 weights.
bool uses_cublas(const at::Tensor& x, const at::Tensor& w) {
  return x.is_cuda() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) &&
         w.scalar_type() == at::kFloat;
}

class LinearFromCopyFunction : public torch::autograd::Function<LinearFromCopyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& copy, at::TensorList weights) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t in = x.size(-1), N = in == 0 ? 0 : x.numel() / in;
    // Unit column stride, as the weight-gradient GEMM reads it (a view where x allows one).
    at::Tensor x2 = x.reshape({N, in});
    if (x2.stride(1) != 1 && in > 1) x2 = x2.contiguous();
    at::Tensor y = at::mm(x2, copy.t());
    ctx->save_for_backward({x2, copy});
    ctx->saved_data["weights"] = weights.vec();
    auto sizes = x.sizes().vec();
    sizes.back() = copy.size(0);
    return y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &copy = saved[1];
    const auto weights = ctx->saved_data["weights"].toTensorVector();
    variable_list out(2 + weights.size());
    if (!grads[0].defined()) return out;
    const int64_t N = x2.size(0), rows = copy.size(0);
    const at::Tensor dy = grads[0].reshape({N, rows}).to(x2.scalar_type()).contiguous();
    const auto x_sizes = [&] {
      auto s = grads[0].sizes().vec();
      s.back() = x2.size(1);
      return s;
    }();
    if (ctx->needs_input_grad(0)) out[0] = at::mm(dy, copy).view(x_sizes);
    if (weights.size() > 1 && uses_cublas(x2, weights[0]) && stacked_gradient(ctx, dy, x2, weights)) return out;
    int64_t row = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      const at::Tensor& w = weights[i];
      const int64_t rows_i = w.size(0);
      const at::Tensor dy_i = dy.narrow(1, row, rows_i);
      row += rows_i;
      if (!ctx->needs_input_grad(2 + i)) continue;
      const bool here = accumulate_here(w);
      const bool add = here && w.grad().defined();  // beta 1 into .grad
      at::Tensor dw;  // float32 (float64 for double), when not added in place
      if (uses_cublas(x2, w)) {
        if (!add) dw = at::empty(w.sizes(), w.options().dtype(at::kFloat));
        gemm_at_b_accumulate(dy_i, x2, add ? w.grad() : dw, add ? 1.f : 0.f);
      } else {
        const auto ct = x2.scalar_type() == at::kDouble || w.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
        dw = at::mm(dy_i.t().to(ct), x2.to(ct));
        if (add) w.grad().add_(dw);
      }
      if (add) continue;
      if (here) {
        w.mutable_grad() = dw.to(w.scalar_type());
      } else {
        out[2 + i] = dw.to(w.scalar_type());
      }
    }
    return out;
  }
};

}  // namespace

at::Tensor linear_from_copy(const at::Tensor& x, const at::Tensor& copy, const std::vector<at::Tensor>& weights) {
  TORCH_CHECK(x.defined() && x.dim() >= 1, "flashcos linear_from_copy: x must be (..., in)");
  TORCH_CHECK(copy.defined() && copy.dim() == 2 && copy.size(1) == x.size(-1), "flashcos linear_from_copy: copy ",
              copy.defined() ? copy.sizes() : at::IntArrayRef{}, " must be (out, in) with in = ", x.size(-1));
  TORCH_CHECK(copy.scalar_type() == x.scalar_type() && copy.device() == x.device(),
              "flashcos linear_from_copy: copy (", copy.scalar_type(), ", ", copy.device(), ") must match x (",
              x.scalar_type(), ", ", x.device(), ")");
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "flashcos linear_from_copy: x must be floating point, got ",
              x.scalar_type());
  int64_t rows = 0;
  for (const auto& w : weights) {
    TORCH_CHECK(w.defined() && w.dim() == 2 && w.size(1) == copy.size(1) && w.device() == x.device() &&
                    at::isFloatingType(w.scalar_type()),
                "flashcos linear_from_copy: each weight must be a floating (out_i, ", copy.size(1), ") tensor on ",
                x.device());
    rows += w.size(0);
  }
  TORCH_CHECK(!weights.empty() && rows == copy.size(0), "flashcos linear_from_copy: the weights' ", rows,
              " rows must be the copy's ", copy.size(0));
  return LinearFromCopyFunction::apply(x, copy, at::TensorList(weights));
}

}  // namespace flashcos::model::fused
