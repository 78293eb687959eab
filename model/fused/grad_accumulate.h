// Whether a fused operator's backward may add a parameter's gradient into its .grad itself (the
// kernel's final write becomes a read-add-write) and hand autograd no gradient for it, instead of
// returning a fresh gradient that autograd's accumulation then adds in a kernel of its own (one
// launch per parameter and micro-step: with the CUDA graph every micro-step adds).
// Only where that is exactly what autograd would do:
//   - a plain backward over the whole graph (no torch::autograd::grad, no inputs= subset) and no
//     create_graph (grad mode off in the backward);
//   - a leaf parameter whose gradient accumulation nothing hooks (data parallel's Reducer does);
//   - an existing .grad of the parameter's dtype, shape and device, contiguous, not sparse (where
//     .grad is undefined autograd takes the fresh gradient without a kernel anyway).
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "attention/common/poison.h"

namespace flashcos::model::fused {

// `allow_undefined`: also true where .grad is undefined (the caller then sets it).
bool grad_accumulates_here(const at::Tensor& param, bool allow_undefined = false);

// Where a kernel writes a parameter's gradient: into the parameter's .grad (`into_grad`: the kernel
// adds) where the gradient is `needed` and grad_accumulates_here, else into `fresh()` (poisoned
// under FLASHCOS_POISON), which autograd then takes: for_autograd() is what the backward returns.
struct ParamGradOut {
  at::Tensor dst;
  bool into_grad = false;
  at::Tensor for_autograd() const { return into_grad ? at::Tensor() : dst; }
};
template <typename Fresh>
ParamGradOut param_grad_out(const at::Tensor& param, bool needed, Fresh&& fresh) {
  if (needed && grad_accumulates_here(param)) return {param.grad(), true};
  at::Tensor t = std::forward<Fresh>(fresh)();
  flashcos::detail::poison_if_requested(t);
  return {t, false};
}

}  // namespace flashcos::model::fused
