// What the model's CUDA kernels (model/fused, model/decode) need to know of a libtorch tensor: its
// element type as the kernels name it (fp16, bf16 or fp32) and whether its data is 16-byte aligned
// for their vector loads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "attention/common/cuda/dtype.h"

namespace flashcos::model {

inline bool kernel_takes_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

// The kernels' name for t; std::invalid_argument naming `who` for a type no kernel takes.
inline flashcos::cuda::DType kernel_dtype(at::ScalarType t, const char* who) {
  switch (t) {
    case at::kHalf: return flashcos::cuda::DType::kHalf;
    case at::kBFloat16: return flashcos::cuda::DType::kBFloat16;
    case at::kFloat: return flashcos::cuda::DType::kFloat;
    default:
      throw std::invalid_argument(std::string(who) + ": expected float32, bfloat16 or float16 tensors, got " +
                                  c10::toString(t));
  }
}

// The type the ops' libtorch path computes in: float64 if any input is, else float32.
inline at::ScalarType op_compute_type(std::initializer_list<at::ScalarType> types) {
  for (auto t : types) {
    if (t == at::kDouble) return at::kDouble;
  }
  return at::kFloat;
}

inline bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace flashcos::model
