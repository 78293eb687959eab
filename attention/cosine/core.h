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

#include <utility>

#include "attention/common/poison.h"

namespace flashcos::detail {

struct CoreArgs {
  bool causal = false;
  double scale = 10.0;
  bool exp_kind = false;        // unnormalised exp attention: no l, no "- scale"
  bool bias_batch_dim = false;  // bias is (B, I, J) instead of (H, I, J)
  int64_t tile_size = 512;      // tiled path only
  // Upper bound of q . k (cosine kind): 1 for l2-normalised q, k; `groups` when each of the groups
  // is normalised separately; 1 without l2norm (q, k are then taken as unit-norm). The 16-bit forward picks its fixed-offset or
  // online variant by it (fwd_needs_online in attention/cosine/cuda/params.h).
  double qk_max = 1.0;
  bool deterministic = false;  // fused backward: dq in a fixed order, dbias without atomics
};

struct ForwardResult {
  at::Tensor o;  // (B, H, I, D)
  at::Tensor l;  // (B, H, I) row sums (cosine kind), undefined for exp
};

struct BackwardResult {
  at::Tensor dq, dk, dv, dbias;
  // With fused_backward's dq_float: the gradient is dq times dq_factor (the kernels may leave the
  // softmax scale out of their float32 accumulator, for the reader of dq to apply); 1 elsewhere.
  float dq_factor = 1.f;
};

// Tiled path: chunked libtorch ops, any device, O(tile^2) extra memory per batch-head.
ForwardResult tiled_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args);
BackwardResult tiled_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& o, const at::Tensor& l,
                              const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args);

// Fused CUDA kernels (attention/cosine/cuda_ops.cpp). Throw a c10::Error in a build without CUDA.
// o_out: where to write o ((B, H, I, D), q's dtype, any strides the kernels take), else allocated.
// dq_float: for fp16 / bf16 inputs, return dq as the kernels' float32 accumulator (no rounding
// pass; the packed path's l2norm backward reads it), the gradient being dq times the result's
// dq_factor. dv_out: where to write dv (v's shape, the
// kernels' strides), else allocated.
ForwardResult fused_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args,
                            const at::Tensor& o_out = {});
BackwardResult fused_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& o, const at::Tensor& l,
                              const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args,
                              bool dq_float = false, const at::Tensor& dv_out = {});

// Head dims the fused kernels support (16, 32, 64, 80, 96, 128).
bool fused_supports_head_dim(int64_t d);

}  // namespace flashcos::detail
