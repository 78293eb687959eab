// Adam / AdamW whose step() is one fused multi-tensor kernel (at::_fused_adam_ /
// at::_fused_adamw_) instead of libtorch's per-parameter loop of ~8 small kernels per tensor.
// State lives exactly where torch::optim::Adam(W) keeps it, so save()/load() and checkpoints are
// unchanged. The per-step bias-correction counter is one device scalar shared by every tensor.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <vector>

namespace flashcos::model {

class FusedAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// The parameters' .grad tensors that are defined, in order (the same tensors, not copies).
std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& params);

// The joint 2-norm of the parameters' gradients (those defined) as a float32 scalar on their
// device, without a device -> host sync (one foreach norm); undefined where no gradient is defined.
at::Tensor grad_norm(const std::vector<at::Tensor>& params);

// Scales the parameters' gradients so that their joint 2-norm is at most max_norm (libtorch's
// clip_grad_norm_ without its device -> host sync: it returns the norm as a double): grad_norm, one
// scale factor on the device, one foreach multiply. Returns the norm before clipping (grad_norm).
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace flashcos::model
