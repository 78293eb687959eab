// Adam / AdamW whose step() is one fused multi-tensor kernel (at::_fused_adam_ /
// at::_fused_adamw_) instead of libtorch's per-parameter loop of ~8 small kernels per tensor.
// State lives exactly where torch::optim::Adam(W) keeps it, so save()/load() and checkpoints are
// unchanged. The per-step bias-correction counter is one device scalar shared by every tensor.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

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

}  // namespace flashcos::model
