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

namespace flashcos::detail {

struct CoreArgs {
  bool causal = false;
  double scale = 10.0;
  bool exp_kind = false;        // unnormalised exp attention: no l, no "- scale"
  bool bias_batch_dim = false;  // bias is (B, I, J) instead of (H, I, J)
  int64_t tile_size = 512;      // tiled path only
  // Upper bound of q . k (cosine kind): 1 for l2-normalised q, k; `groups` when each of the groups
  // is normalised separately; 1 without l2norm (q, k are then taken as unit-norm). The 16-bit forward picks its fixed-offset or
  // online variant by it (fwd_needs_online in attention/cuda/params.h).
  double qk_max = 1.0;
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
// o_out: where to write o ((B, H, I, D), q's dtype, any strides the kernels take), else allocated.
// dq_float: for fp16 / bf16 inputs, return dq as the kernels' float32 accumulator (no rounding
// pass; the packed path's l2norm backward reads it). dv_out: where to write dv (v's shape, the
// kernels' strides), else allocated.
ForwardResult fused_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args,
                            const at::Tensor& o_out = {});
BackwardResult fused_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& o, const at::Tensor& l,
                              const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args,
                              bool dq_float = false, const at::Tensor& dv_out = {});

// FLASHCOS_POISON=1 in the environment (the tests set it): fills t with NaN, so that an output a
// kernel leaves partly unwritten cannot pass. Called on every output before its kernel runs.
void poison_if_requested(const at::Tensor& t);

// Fused l2norm on CUDA (attention/cuda/l2norm.h), for tensors of 1..4 dims with a contiguous last
// dim: y = x / max(|x_g|, 1e-12) per group. supported(): dtype fp16 / bf16 / fp32, group size a
// multiple of 8 with group size / 8 a power of two <= 32, 16-byte aligned data and strides.
bool l2norm_cuda_supported(const at::Tensor& x, int64_t groups);
// Returns y (written into y_out when given) and r = 1 / max(|x_g|, eps): x.shape[:-1] + (groups,)
// float32, contiguous.
std::pair<at::Tensor, at::Tensor> l2norm_cuda_forward(const at::Tensor& x, int64_t groups,
                                                      const at::Tensor& y_out = {});
// dx for the incoming dy (any float dtype / strides), from x and the forward's r (y recomputed in
// float32); written into dx_out when given (x's shape and dtype, 16-byte aligned strides).
at::Tensor l2norm_cuda_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& r, int64_t groups,
                                const at::Tensor& dx_out = {});
// Head dims the fused kernels support (16, 32, 64, 80, 96, 128).
bool fused_supports_head_dim(int64_t d);

}  // namespace flashcos::detail
