// The torch side of the fused l2norm CUDA kernels (attention/l2norm/cuda/l2norm.h), used by l2norm()
// and by the QKV attention entry point (attention/cosine/qkv.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace flashcos::detail {

// Rotary positions fused into the kernels (flashcos/rotary.h): positions offset + index along dim -2.
struct RotaryArgs {
  double base = 10000.0;
  int64_t offset = 0;
};

// Fused l2norm on CUDA (attention/l2norm/cuda/l2norm.h), for tensors of 1..4 dims with a contiguous last
// dim: y = x / max(|x_g|, 1e-12) per group. supported(): dtype fp16 / bf16 / fp32, group size a
// multiple of 8 with group size / 8 a power of two <= 32, 16-byte aligned data and strides.
bool l2norm_cuda_supported(const at::Tensor& x, int64_t groups);
// Returns y (written into y_out when given) and r = 1 / max(|x_g|, eps): x.shape[:-1] + (groups,)
// float32, contiguous.
// With `rotary` (not null) y is rotated after the normalisation (positions along dim -2).
std::pair<at::Tensor, at::Tensor> l2norm_cuda_forward(const at::Tensor& x, int64_t groups,
                                                      const at::Tensor& y_out = {},
                                                      const RotaryArgs* rotary = nullptr);
// dx for the incoming dy (any float dtype / strides), from x and the forward's r (y recomputed in
// float32); written into dx_out when given (x's shape and dtype, 16-byte aligned strides).
// With `rotary`, dy is the gradient of the rotated output (R^T is applied to it in the kernel).
// dy_scale: the gradient is dy times it (the attention's dq accumulator may come without its softmax
// scale: BackwardResult::dq_factor); applied in the kernel, in float32.
at::Tensor l2norm_cuda_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& r, int64_t groups,
                                const at::Tensor& dx_out = {}, const RotaryArgs* rotary = nullptr,
                                double dy_scale = 1.0);

}  // namespace flashcos::detail
