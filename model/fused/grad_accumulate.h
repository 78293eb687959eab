// Whether a fused operator's backward may add a parameter's gradient into its .grad itself (the
// kernel's final write becomes a read-add-write) and hand autograd no gradient for it, instead of
// returning a fresh gradient that autograd's accumulation then adds in a kernel of its own (one
// launch per parameter and micro-step: with the CUDA graph every micro-step adds).
// Only where that is exactly what autograd would do:
//   - a plain backward over the whole graph (no torch::autograd::grad, no inputs= subset) and no
//     create_graph (grad mode off in the backward);
//   - a leaf parameter whose gradient accumulation nothing hooks (data parallel's Reducer does;
//     within an IdleAccumulatorPostHooks scope its post hooks are known to do nothing);
//   - an existing .grad of the parameter's dtype, shape and device, contiguous, not sparse (where
//     .grad is undefined autograd takes the fresh gradient without a kernel anyway).
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "attention/common/poison.h"

namespace flashcos::model::fused {

// `allow_undefined`: also true where .grad is undefined (the caller then sets it).
bool grad_accumulates_here(const at::Tensor& param, bool allow_undefined = false);

// Data parallel's Reducer puts a post hook on every parameter's gradient accumulator; between its
// reductions (the micro-steps of a --grad-accum step before the last, "no_sync") those hooks
// return at once. While a scope of this class is open (in any thread: backward runs on autograd's
// own threads), grad_accumulates_here disregards accumulators' post hooks, so the fused operators
// add into .grad themselves on those micro-steps too. The trainer opens it around them only: on the
// reducing micro-step the hooks must run, and do.
class IdleAccumulatorPostHooks {
 public:
  IdleAccumulatorPostHooks();
  ~IdleAccumulatorPostHooks();
  IdleAccumulatorPostHooks(const IdleAccumulatorPostHooks&) = delete;
  IdleAccumulatorPostHooks& operator=(const IdleAccumulatorPostHooks&) = delete;
};

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
