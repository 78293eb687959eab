// Shared helper of the Fastmax CPU and CUDA suites.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <flashcos/fastmax.h>

namespace flashcos::test {

struct FastmaxGrads {
  at::Tensor o, dq, dk, dv;
};

// o and d(sum(o * w))/d{q, k, v} through autograd, on fresh leaf copies of q0, k0, v0.
inline FastmaxGrads fastmax_grads(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
                                  const at::Tensor& w, const FastmaxOptions& opt) {
  at::Tensor q = q0.detach().clone().requires_grad_(true);
  at::Tensor k = k0.detach().clone().requires_grad_(true);
  at::Tensor v = v0.detach().clone().requires_grad_(true);
  at::Tensor o = fastmax_attention(q, k, v, opt);
  auto g = torch::autograd::grad({(o * w.to(o.scalar_type())).sum()}, {q, k, v});
  return {o.detach(), g[0], g[1], g[2]};
}

}  // namespace flashcos::test
