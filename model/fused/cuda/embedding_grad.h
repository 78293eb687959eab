// Torch-free parameters of the embedding table's gradient kernels (embedding_grad.cu):
//   dW[v, c] (+)= sum over tokens t with idx[t] = v of dx[t, c]
// for N tokens, a (V, C) float32 table (V <= kEmbeddingGradMaxRows) and a float32 (N, C) dx.
// Pass 1: the tokens are cut into `chunks` runs; a one-warp block takes one run and 32 columns,
// each lane adding its column of the run's rows in token order into a (V + 1, 32) float32
// accumulator in shared memory, and writes the rows the run touched to its slab of `partials`
// (chunks, V, C), flagging them in a (V, chunks rounded up to 32) byte table after the slabs.
// Pass 2 sums the flagged chunks' rows per element in chunk order and adds the result to dW (or
// writes it). One read of dx, against libtorch's sort of the indices and segment sums (about 20
// kernels). Bitwise repeatable for a given N, V, C and SM count: no atomics, each sum has one order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashcos::cuda {

constexpr int64_t kEmbeddingGradMaxRows = 256;  // V: the (V + 1, 32) float32 accumulator is 33 KiB

struct EmbeddingGradParams {
  int64_t tokens = 0;            // N
  int64_t rows = 0;              // V
  int cols = 0;                  // C
  int num_sms = 1;               // sizes the grid
  const int64_t* idx = nullptr;  // (N), values outside [0, V) are skipped
  const float* dx = nullptr;     // (N, C), contiguous
  float* partials = nullptr;     // embedding_grad_scratch_floats(p) floats of scratch, 16-byte aligned
  float* dw = nullptr;           // (V, C), contiguous
  bool accumulate = false;       // add to dw instead of overwriting it
};

bool embedding_grad_supported(int64_t rows, int64_t cols);
int embedding_grad_chunks(const EmbeddingGradParams& p);  // token runs (rows of the partials)
int64_t embedding_grad_scratch_floats(const EmbeddingGradParams& p);  // the size of `partials`
cudaError_t run_embedding_grad(const EmbeddingGradParams& p, cudaStream_t stream);

}  // namespace flashcos::cuda
