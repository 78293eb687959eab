// The classifier and its cross-entropy as one operator, chunked over rows:
//   logits = h W^T + b   (compute_dtype: bf16 under autocast, GEMMs accumulate in float32)
//   loss = mean_rows (logsumexp(logits) - logits[target])   in float32 (float64 for double)
// The row gradient dlogits = softmax(logits) - onehot(target) is made in the forward, in place of
// each chunk's logits (model/fused/cuda/cross_entropy.h on CUDA), so the float32 (rows, V) logits
// of the composite path are never written and the backward is two GEMMs:
//   dh = (g / N) dlogits W,   dW = (g / N) dlogits^T h,   db = (g / N) sum_rows dlogits
// with g the incoming gradient of the loss. Matches F::cross_entropy(linear(h, W, b).to(float),
// target) (mean reduction; every target must be in [0, V): out of range gives a NaN loss on CUDA
// and an error on CPU).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flashcos::model::fused {

// Rows per chunk: 8192 rows x 256 bf16 logits = 4 MiB, still in L2 when the row kernel reads the
// chunk its GEMM has just written.
constexpr int64_t kDefaultChunkRows = 8192;

// h: (..., C); weight: (V, C); bias: (V) or undefined; target: int64 with h.numel() / C elements.
// The CUDA row kernel runs for CUDA tensors in fp16 / bf16 / fp32, libtorch ops otherwise.
at::Tensor classifier_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias,
                                    const at::Tensor& target, at::ScalarType compute_dtype,
                                    int64_t chunk_rows = kDefaultChunkRows);

}  // namespace flashcos::model::fused
