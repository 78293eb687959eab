// The embedding table's gradient in two passes (math and layout in embedding_grad.h):
//   pass 1, block (64-column slice, token run): acc[v][c] += dx[t][c] over the run's tokens in
//           shared memory (8 warps; lane l takes columns 2l, 2l + 1; kUnroll tokens' loads in
//           flight per warp), then the (V, 64) accumulator to the run's partial rows;
//   pass 2, one thread per element of dW: the runs' partials summed in run order, added to dW
//           (accumulate) or written.
#include "model/fused/cuda/embedding_grad.h"

#include <algorithm>

namespace flashcos::cuda {
namespace {

constexpr int kCols = 64;  // columns per block
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;
constexpr int kBlocksPerSm = 2;  // 2 x 64 KiB of accumulators per SM

int column_blocks(const EmbeddingGradParams& p) { return (p.cols + kCols - 1) / kCols; }

__global__ void __launch_bounds__(kThreads) embedding_grad_partials_kernel(const EmbeddingGradParams p,
                                                                           int64_t run_tokens) {
  extern __shared__ float acc[];  // (V, kCols)
  const int c0 = int(blockIdx.x) * kCols;
  const int64_t run = blockIdx.y;
  for (int i = threadIdx.x; i < p.rows * kCols; i += kThreads) acc[i] = 0.f;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = c0 + 2 * lane;
  const bool col_ok = col < p.cols;  // cols is even: both columns or neither
  const int64_t t_begin = run * run_tokens, t_end = min(p.tokens, t_begin + run_tokens);
  for (int64_t t = t_begin + warp; t < t_end; t += int64_t(kWarps) * kUnroll) {
    float2 v[kUnroll];
    int64_t row[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t tu = t + int64_t(u) * kWarps;
      row[u] = -1;
      v[u] = make_float2(0.f, 0.f);
      if (tu < t_end) {
        row[u] = p.idx[tu];
        if (col_ok) v[u] = *reinterpret_cast<const float2*>(p.dx + tu * p.cols + col);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!col_ok || row[u] < 0 || row[u] >= p.rows) continue;
      float* a = acc + row[u] * kCols + 2 * lane;
      atomicAdd(a, v[u].x);
      atomicAdd(a + 1, v[u].y);
    }
  }
  __syncthreads();
  float* out = p.partials + run * p.rows * p.cols;
  for (int i = threadIdx.x; i < p.rows * kCols; i += kThreads) {
    const int c = c0 + i % kCols;
    if (c < p.cols) out[int64_t(i / kCols) * p.cols + c] = acc[i];
  }
}

__global__ void __launch_bounds__(kThreads) embedding_grad_reduce_kernel(const EmbeddingGradParams p, int runs) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t n = p.rows * p.cols;
  if (i >= n) return;
  float sum = 0.f;
  for (int r = 0; r < runs; ++r) sum += p.partials[int64_t(r) * n + i];
  p.dw[i] = p.accumulate ? p.dw[i] + sum : sum;
}

}  // namespace

bool embedding_grad_supported(int64_t rows, int64_t cols) {
  return rows >= 1 && rows <= kEmbeddingGradMaxRows && cols >= 2 && cols % 2 == 0 && cols <= (int64_t(1) << 24);
}

int embedding_grad_chunks(const EmbeddingGradParams& p) {
  const int64_t by_sms = (int64_t(kBlocksPerSm) * std::max(p.num_sms, 1) + column_blocks(p) - 1) / column_blocks(p);
  const int64_t by_tokens = (p.tokens + 255) / 256;  // at least 256 tokens a run
  return int(std::max<int64_t>(1, std::min<int64_t>({by_sms, by_tokens, 65535})));
}

cudaError_t run_embedding_grad(const EmbeddingGradParams& p, cudaStream_t stream) {
  if (!embedding_grad_supported(p.rows, p.cols) || p.tokens < 0 || p.dw == nullptr || p.partials == nullptr ||
      (p.tokens > 0 && (p.idx == nullptr || p.dx == nullptr)) || reinterpret_cast<uintptr_t>(p.dx) % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  const int runs = embedding_grad_chunks(p);
  const int64_t run_tokens = std::max<int64_t>(1, (p.tokens + runs - 1) / runs);
  const size_t smem = size_t(p.rows) * kCols * sizeof(float);
  // Once per process (one device a process here; not a stream operation, so graph capture is fine).
  static const cudaError_t attr = cudaFuncSetAttribute(
      embedding_grad_partials_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      int(kEmbeddingGradMaxRows * kCols * sizeof(float)));
  if (attr != cudaSuccess) return attr;
  cudaError_t err = cudaSuccess;
  embedding_grad_partials_kernel<<<dim3(unsigned(column_blocks(p)), unsigned(runs)), kThreads, smem, stream>>>(
      p, run_tokens);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t n = p.rows * p.cols;
  embedding_grad_reduce_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p, runs);
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
