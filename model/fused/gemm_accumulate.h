// C (m x n, float32, row-major, leading dimension ldc) = A^T B + beta C for half-precision A (k x m,
// leading dimension lda) and B (k x n, ldb), both row-major: one cuBLAS GemmEx with float32
// output and accumulation, on the current stream with libtorch's cuBLAS handle (its workspace, so
// it can be captured in a CUDA graph). A weight's gradient dW = dy^T x over the rows of a batch,
// added to the float32 .grad in the GEMM (linear.h). cuBLAS is found in the process (libtorch
// loads it) rather than linked, so the trainer never carries a second copy of the library.
#pragma once

#include <ATen/core/Tensor.h>

namespace flashcos::model::fused {

// a (k, m) and b (k, n): fp16 or bf16 CUDA matrices of one dtype with unit column stride;
// c (m, n) float32 with unit column stride; beta 0 or 1. Throws naming the problem otherwise.
void gemm_at_b_accumulate(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, float beta);

}  // namespace flashcos::model::fused
