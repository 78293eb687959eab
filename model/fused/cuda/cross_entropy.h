// Torch-free parameters of the fused softmax cross-entropy row kernel (cross_entropy.cu), the
// part of the fused classifier (model/fused/classifier_cross_entropy.h) between its two GEMMs.
// For each of N rows of V logits z (row-major, contiguous) and a target t in [0, V):
//   lse = log sum_c exp(z_c)              (float32, max-shifted)
//   loss_row = lse - z_t                  (NaN when t is out of range)
//   dz_c = exp(z_c - lse) - [c == t]      (the gradient of loss_row; the caller scales it)
// dz may overwrite z in place (dlogits == logits): each element is read before it is written by
// the same thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

struct CrossEntropyParams {
  int64_t rows = 0;  // N
  int vocab = 0;     // V
  DType dtype = DType::kBFloat16;  // of logits and dlogits: fp16, bf16 or fp32
  const void* logits = nullptr;    // (N, V)
  void* dlogits = nullptr;         // (N, V), may equal logits
  const int64_t* target = nullptr; // (N)
  float* loss = nullptr;           // (N)
};

// Any V >= 1; 16-byte accesses where V is a multiple of 8 and both pointers 16-byte aligned,
// element by element otherwise.
cudaError_t run_cross_entropy_rows(const CrossEntropyParams& p, cudaStream_t stream);

}  // namespace flashcos::cuda
