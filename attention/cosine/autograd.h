// The torch::autograd::Function behind the tiled and fused backends (attention/cosine/autograd.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include "attention/cosine/core.h"

namespace flashcos::detail {

// o (B, H, I, D) with autograd: saves q, k, v, o and l (O(n) memory) and recomputes P in backward.
at::Tensor attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args, bool fused);

}  // namespace flashcos::detail
