// Fastmax internals shared by attention/fastmax*.cpp (not part of the public API).
//
// The core works on canonical shapes after `normalize` and temperature have been applied:
//   q~ (N, I, D) = q / temperature (or its normalised form), k (N, J, D), v (N, J, Dv),
// N = B * H (grouped / single-headed k, v are expanded to H heads before the core).
//
// Feature maps (F = 1 + D for p = 1, F = 1 + D + D (D + 1) / 2 for p = 2):
//   phi_y(y) = [1, y_1 .. y_D, y_m y_r (m <= r, row-major)]
//   phi_x(x) = [a0, a1 x_1 .. a1 x_D, a2 w_mr x_m x_r]     (w_mr = 1 if m == r else 2)
// so phi_x(x) . phi_y(y) = f(x . y) and the moments are S = sum_j phi_y(k_j) [v_j, 1]^T (F, Dv + 1).
//
// Everything reduces to one scan (fastmax_scan) over "rows" x_r against "columns" y_c with weights
// W_c (width E), where row r sees column c when c <= r + off (causal) or always:
//   out_r = sum_c f(x_r . y_c) W_c                                (E wide)
//   gx_r  = sum_c f'(x_r . y_c) (G_r . W_c) y_c                   (D wide, grad mode)
// Forward: x = q~, y = k, W = [v, 1]. Backward with g^ = do / den, delta = g^ . o, G = [g^, -delta]:
//   dq~ = gx(x = q~, y = k, W = [v, 1], G),  and in the reverse direction (row = key j sees the
//   queries i with j <= i + J - I)  dv = out(x = k, y = q~, W = G)[:Dv],  dk = gx(..., G = [v, 1]).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flashcos::detail {

struct FastmaxCoef {
  int64_t p = 2;
  double a0 = 1.0, a1 = 1.0, a2 = 0.5;
};

inline int64_t fastmax_num_features(int64_t p, int64_t d) {
  return p == 1 ? 1 + d : 1 + d + d * (d + 1) / 2;
}

// phi_x (with_coef) or phi_y of x (..., D) -> (..., F), in x's dtype.
at::Tensor fastmax_features(const at::Tensor& x, const FastmaxCoef& c, bool with_coef);
// Gradient of phi_x(x) . u w.r.t. x: u (R, F) float, x (R, D) -> (R, D) in u's dtype.
at::Tensor fastmax_feature_grad(const at::Tensor& u, const at::Tensor& x, const FastmaxCoef& c);

struct FastmaxScanResult {
  at::Tensor out;  // (N, Lx, E) accumulation dtype, or undefined
  at::Tensor gx;   // (N, Lx, D) accumulation dtype, or undefined
};

// x (N, Lx, D), y (N, Ly, D), w (N, Ly, E), g (N, Lx, E) or undefined (no grad mode).
// reverse: row r sees column c when c >= r - off (the transposed causal pattern).
FastmaxScanResult fastmax_scan(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w,
                               const at::Tensor& g, const FastmaxCoef& c, bool causal, int64_t off,
                               bool reverse, int64_t chunk, bool want_out, bool use_cuda_kernels);

struct FastmaxCoreForward {
  at::Tensor o;    // (N, I, Dv) in q's dtype
  at::Tensor o32;  // (N, I, Dv) accumulation dtype (saved for backward)
  at::Tensor den;  // (N, I) accumulation dtype; 0 for rows with no visible key
};
struct FastmaxCoreBackward {
  at::Tensor dq, dk, dv;  // in the inputs' dtypes
};

FastmaxCoreForward fastmax_core_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const FastmaxCoef& c, bool causal, int64_t chunk,
                                        bool use_cuda_kernels);
FastmaxCoreBackward fastmax_core_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& o32, const at::Tensor& den,
                                          const FastmaxCoef& c, bool causal, int64_t chunk,
                                          bool use_cuda_kernels);

// 1 when bf16 / fp16 GEMMs with a float32 output (at::bmm out_dtype) worked, 0 when they threw
// (float32 GEMMs are used instead), -1 before the first one.
int fastmax_half_gemm_state();

// CUDA kernels behind the feature maps (attention/fastmax/fastmax_cuda.cpp); error without CUDA.
at::Tensor fastmax_features_cuda(const at::Tensor& x, const FastmaxCoef& c, bool with_coef);
at::Tensor fastmax_feature_grad_cuda(const at::Tensor& u, const at::Tensor& x, const FastmaxCoef& c);

// The fused moment-scan kernel (attention/fastmax/cuda/fastmax_scan.cu) takes x: bf16 CUDA tensors with
// D in {16, 32, 64}; false in a build without CUDA.
bool fastmax_fused_scan_available(const at::Tensor& x);
// fastmax_scan on the fused kernel: non-causal (all columns), or causal with Lx == Ly a multiple
// of 64 (row i sees j <= i). w, g: any floating dtype. Returns float32 out (N, Lx, E) / gx
// (N, Lx, D), undefined when not asked for.
FastmaxScanResult fastmax_fused_scan_cuda(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w,
                                          const at::Tensor& g, const FastmaxCoef& c, bool causal, bool want_out);

}  // namespace flashcos::detail
