// Torch-free parameters of the embedding table's gradient kernels (embedding_grad.cu):
//   dW[v, c] (+)= sum over tokens t with idx[t] = v of dx[t, c]
// for N tokens, a (V, C) float32 table (V <= kEmbeddingGradMaxRows) and a float32 (N, C) dx.
// Pass 1: the tokens are cut into `chunks` runs; a block takes one run and 64 columns, adds each
// token's row slice into a (V, 64) float32 accumulator in shared memory (atomic adds there), and
// writes it to its row of `partials` (chunks, V, C). Pass 2 sums the chunks' rows per element in a
// fixed order and adds the result to dW (or writes it). One read of dx, against libtorch's sort of
// the indices and segment sums (about 20 kernels). Not bitwise repeatable (the shared-memory adds
// of one block come in any order), like libtorch's own atomic accumulation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashcos::cuda {

constexpr int64_t kEmbeddingGradMaxRows = 256;  // V: the (V, 64) float32 accumulator is 64 KiB

struct EmbeddingGradParams {
  int64_t tokens = 0;            // N
  int64_t rows = 0;              // V
  int cols = 0;                  // C
  int num_sms = 1;               // sizes the grid
  const int64_t* idx = nullptr;  // (N), values outside [0, V) are skipped
  const float* dx = nullptr;     // (N, C), contiguous
  float* partials = nullptr;     // (embedding_grad_chunks(p), V, C) scratch
  float* dw = nullptr;           // (V, C), contiguous
  bool accumulate = false;       // add to dw instead of overwriting it
};

bool embedding_grad_supported(int64_t rows, int64_t cols);
int embedding_grad_chunks(const EmbeddingGradParams& p);  // rows of `partials` the caller allocates
cudaError_t run_embedding_grad(const EmbeddingGradParams& p, cudaStream_t stream);

}  // namespace flashcos::cuda
