// Deterministic dQ on a fixed grid (the Hopper backward's kFixed instance,
// attention/cosine/cuda/hopper/bwd_hopper_ws.cuh): each key block rounds its part of row i of dQ to a
// multiple of the row's unit 2^u_i before it adds it into the float32 accumulator, and u_i is chosen
// so that every partial sum of the row is a multiple of 2^u_i below 2^(u_i + 24) in magnitude: then
// every float32 add is exact and the sum is the same in any order, so the adds need no fixed order
// (no turns and counters; the ordered adds cost the Hopper backward 11-19 %, docs/performance.md).
//
// The unit. For the cosine kind P's rows sum to 1 (P = exp(logit) / l), dP_ij = do_i . v_j and
// D_i = do_i . o_i with o_i a convex combination of the v_j, so
//   sum_j |dS_ij| = sum_j P_ij |dP_ij - D_i| <= 2 |do_i| max_j |v_j|
// and every partial sum of dq_id = scale sum_j dS_ij k_jd over any set of key blocks is at most
//   b_i = 2.5 scale |do_i| max_j |v_j| max_jd |k_jd|
// (2.5 rather than 2 for the 16-bit rounding of P and dS). u_i = ceil(log2 b_i) - 22 keeps each
// addend below 2^(u_i + 22), where x -> (x + c_i) - c_i with c_i = 1.5 * 2^(u_i + 23) rounds it to the
// nearest multiple of 2^u_i (two float32 adds), and every partial sum (with the roundings, at most
// 2^(u_i + 22) + n 2^(u_i - 1)) stays exact. The price: each add is off by up to half a unit,
// 2^(u_i - 1) < 2^-22 b_i, where a float32 add is off by 2^-24 of the partial sum. On random inputs
// b_i is about 2^7 .. 2^9 times the row's largest |dq_id| (tests/test_dq_grid.cpp), so each add is
// off by about 2^-14 of that element and a sum of n adds by about sqrt(n) times that (2^-11 at 64
// key blocks): inside bf16's rounding of dq (2^-9), about fp16's (2^-11).
// A row whose bound is not finite gets a c_i that is not finite, and its dq comes out NaN. The exp
// kind (no l: P's rows need not sum to 1) has no such bound and keeps the ordered adds.
#pragma once

#include <ATen/core/Tensor.h>

namespace flashcos::detail {

// (B, H, I) float32: c_i = 1.5 * 2^(u_i + 23) for dout (B, H, I, D) and k, v (B, Hkv, J, D) (H a
// multiple of Hkv) at logit scale `scale`.
at::Tensor dq_grid_constants(const at::Tensor& dout, const at::Tensor& k, const at::Tensor& v, double scale);

// The same constants from the kernels the Hopper backward runs (attention/cosine/cuda/dq_grid.cuh),
// for tests: fp16 / bf16 CUDA tensors; throws in a build without CUDA (cuda_ops.cpp).
at::Tensor dq_grid_constants_cuda(const at::Tensor& dout, const at::Tensor& k, const at::Tensor& v, double scale);

}  // namespace flashcos::detail
