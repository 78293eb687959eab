// The token embedding as one operator: out = weight[idx] (at::embedding), and the table's gradient
// dW[v] = sum of dout's rows whose token is v computed by two small kernels (model/fused/cuda/
// embedding_grad.h: one read of dout, per-run partials in shared memory, a fixed-order sum) and
// added straight into weight.grad where autograd would add it (grad_accumulate.h), instead of
// libtorch's sort of the indices and segment sums (about 20 kernels and 0.14 ms per micro-step of
// the default model at seq 8192). CUDA float32 tables of up to 256 rows and an even width take the
// kernels; everything else runs at::embedding_dense_backward (the same as libtorch's embedding).
#pragma once

#include <ATen/core/Tensor.h>

namespace flashcos::model::fused {

// weight (V, C) floating; idx integer (any shape) in [0, V). Returns idx.shape + (C), weight's dtype.
at::Tensor embedding(const at::Tensor& idx, const at::Tensor& weight);
bool embedding_grad_uses_kernel(const at::Tensor& weight);

}  // namespace flashcos::model::fused
