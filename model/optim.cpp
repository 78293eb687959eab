#include "model/optim.h"

#include <ATen/ATen.h>

namespace flashcos::model {
namespace {

// One fused update over every parameter with a gradient. StateT is AdamParamState or
// AdamWParamState, OptionsT the matching options; decoupled picks _fused_adamw_.
template <class StateT, class OptionsT>
void fused_step(torch::optim::Optimizer& opt, bool decoupled) {
  torch::NoGradGuard no_grad;
  for (auto& group : opt.param_groups()) {
    auto& options = static_cast<OptionsT&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "FusedAdam: amsgrad is not supported");
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    int64_t step = -1;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = opt.state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto s = std::make_unique<StateT>();
        s->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<StateT&>(*slot);
      s.step(s.step() + 1);
      // All tensors of a group share the step count (they are updated together).
      TORCH_CHECK(step < 0 || step == s.step(), "FusedAdam: parameters of one group disagree on the step count");
      step = s.step();
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
    }
    if (params.empty()) continue;
    auto step_t = at::full({}, static_cast<double>(step), params[0].options().dtype(at::kFloat));
    std::vector<at::Tensor> steps(params.size(), step_t);
    const auto [beta1, beta2] = options.betas();
    const std::vector<at::Tensor> no_max_exp_avg_sqs;
    auto fused = decoupled ? &at::_ops::_fused_adamw_::call : &at::_ops::_fused_adam_::call;
    fused(params, grads, exp_avgs, exp_avg_sqs, no_max_exp_avg_sqs, steps, options.lr(), beta1, beta2,
          options.weight_decay(), options.eps(), /*amsgrad=*/false, /*maximize=*/false, std::nullopt, std::nullopt);
    // The fused kernel writes the parameters without moving their version counters (an in-place
    // op would): move them, so that what keys on them (fused::WeightCopy) sees the update.
    for (auto& p : params) p.unsafeGetTensorImpl()->bump_version();
  }
}

// The joint 2-norm of grads (float32, on their device), or undefined for none.
at::Tensor joint_norm(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return {};
  return at::linalg_vector_norm(at::stack(at::_foreach_norm(grads, 2)).to(at::kFloat), 2);
}

}  // namespace

torch::Tensor FusedAdam::step(LossClosure closure) {
  TORCH_CHECK(!closure, "FusedAdam: closures are not supported");
  fused_step<torch::optim::AdamParamState, torch::optim::AdamOptions>(*this, /*decoupled=*/false);
  return {};
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  TORCH_CHECK(!closure, "FusedAdamW: closures are not supported");
  fused_step<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(*this, /*decoupled=*/true);
  return {};
}

std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

at::Tensor grad_norm(const std::vector<at::Tensor>& params) { return joint_norm(defined_grads(params)); }

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  const auto grads = defined_grads(params);
  auto total = joint_norm(grads);
  if (!total.defined()) return total;
  auto coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  at::_foreach_mul_(grads, coef);
  return total;
}

}  // namespace flashcos::model
