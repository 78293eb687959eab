// The attention core contract shared by every backend (tiled CPU path, fused CUDA kernels).
//
// Everything here works on canonical, validated shapes (attention.cpp builds them):
//   q (B, H, I, D); k, v (B, Hkv, J, D), H % Hkv == 0; any strides (last dim contiguous);
//   mask (B, J) bool or undefined; bias (H, I, J) or (B, I, J) (bias_batch_dim), or undefined.
// l2norm has already been applied (outside, by plain libtorch ops with their own autograd).
//
// Forward returns o (B, H, I, D) in q's dtype and, for the cosine kind, l (B, H, I): the row sums
// l_i = sum_j P_ij in float32 (float64 for double inputs); rows with nothing to attend have l = 0
// and o = 0. The exp kind returns an undefined l.
// Backward returns dq, dk, dv in the dtypes and shapes of q, k, v and dbias in bias's shape and
// dtype (undefined without bias).
#pragma once

#include <ATen/core/Tensor.h>

namespace flashcos::detail {

struct CoreArgs {
  bool causal = false;
  double scale = 10.0;
  bool exp_kind = false;        // unnormalised exp attention: no l, no "- scale"
  bool bias_batch_dim = false;  // bias is (B, I, J) instead of (H, I, J)
  int64_t tile_size = 512;      // tiled path only
};

struct ForwardResult {
  at::Tensor o;  // (B, H, I, D)
  at::Tensor l;  // (B, H, I) row sums (cosine kind), undefined for exp
};

struct BackwardResult {
  at::Tensor dq, dk, dv, dbias;
};

// Tiled path: chunked libtorch ops, any device, O(tile^2) extra memory per batch-head.
ForwardResult tiled_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args);
BackwardResult tiled_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& o, const at::Tensor& l,
                              const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args);

// Fused CUDA kernels (attention/cuda_ops.cpp). Throw a c10::Error in a build without CUDA.
ForwardResult fused_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args);
BackwardResult fused_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& o, const at::Tensor& l,
                              const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args);
// Head dims the fused kernels support (16, 32, 64, 80, 96, 128).
bool fused_supports_head_dim(int64_t d);

}  // namespace flashcos::detail
