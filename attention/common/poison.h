// Output poisoning for tests, shared by every operator's torch side.
#pragma once

#include <ATen/core/Tensor.h>

namespace flashcos::detail {

// FLASHCOS_POISON=1 in the environment (the tests set it): fills t with NaN, so that an output a
// kernel leaves partly unwritten cannot pass. Called on every output before its kernel runs.
void poison_if_requested(const at::Tensor& t);

}  // namespace flashcos::detail
