// flashcos l2norm: l2-normalisation of the last dim in groups (the step before cosine-sim
// attention), with fused CUDA kernels for CUDA tensors (attention/l2norm/).
//   y = x / max(|x_g|, 1e-12)  for each of the `groups` equal chunks x_g of the last dim.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flashcos {

/// l2-normalise the last dim of t in `groups` equal chunks.
at::Tensor l2norm(const at::Tensor& t, int64_t groups = 1);
// The same through libtorch's RMSNorm (y = rms_norm(x) / sqrt(group size)), any device; l2norm
// takes it for fp16 / bf16 CUDA tensors.
at::Tensor rms_l2norm(const at::Tensor& t, int64_t groups = 1);
/// y = out_scale * x / rms(x) over the last dim (rms(x) = sqrt(mean(x^2))) by libtorch's RMSNorm
/// (fused kernels on CUDA). Its autograd keeps x and 1 / rms.
at::Tensor rms_normalize(const at::Tensor& x, double out_scale = 1.0);

}  // namespace flashcos
