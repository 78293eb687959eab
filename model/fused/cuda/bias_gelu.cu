// Fused bias + GELU, forward and backward (math in bias_gelu.h), and the bias gradient's reduce.
//   Both directions tile the (N, F) matrix the same way: a block of 8 warps takes 256 columns
//   (blockIdx.x; lane l holds columns [8 l, 8 l + 8) of them: one 16-byte access, two for fp32)
//   and its warps stride over the rows (warp w of block row blockIdx.y starts at row
//   8 blockIdx.y + w), so each lane loads its 8 bias values once and, in the backward, keeps its
//   8 columns' db partial sums in registers across all its rows. The forward takes kUnrollFwd rows
//   an iteration, all loads issued before the math.
//   backward: the block sums its warps' db partials in shared memory into one row of `partials`
//   (one per block row), and a second kernel sums those rows column by column in a fixed order.
#include "model/fused/cuda/bias_gelu.h"

#include <algorithm>

#include "model/fused/cuda/vec.cuh"

namespace flashcos::cuda {
namespace {

using namespace fused;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileCols = 32 * kVec;  // columns per block
// Blocks per SM the grids are sized for, and the occupancy each kernel is compiled for. The kernels
// are bound by memory latency: occupancy counts most (H100, the trainer's (32768, 2048) bf16 in run
// D3 of 2026-11-26: 4 blocks an SM against 3 with twice the rows per iteration, backward 1.28 ms
// against 1.92, forward 0.84 against 1.06-1.13 per 8 layers). The dtype is a template parameter:
// the runtime switch cost registers (kernels 7-12 % slower: runs D1 against D3, two machines).
constexpr int kBlocksPerSmFwd = 8, kBlocksPerSmBwd = 4;
constexpr int kUnrollFwd = 1, kUnrollBwd = 1;

// at::gelu's float32 constants (ActivationGeluKernel.cu): 1 / sqrt 2 and 1 / sqrt(2 pi).
constexpr float kSqrtHalf = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

// gelu(z) = z Phi(z), written as at::gelu (approximate 'none') writes it in float32.
__device__ __forceinline__ float gelu(float z) { return z * 0.5f * (1.f + erff(z * kSqrtHalf)); }

// gelu'(z) = Phi(z) + z phi(z), as at::gelu_backward writes it in float32, with the fast exp
// (__expf, a few ulp on exp(-z^2 / 2) <= 1; the result is rounded to 16 bits): the backward 1.27 ->
// 1.24 ms a micro-step on an H100 (runs D7, D10 of 2026-11-26, two machines).
__device__ __forceinline__ float gelu_grad(float z) {
  const float cdf = 0.5f * (1.f + erff(z * kSqrtHalf));
  const float pdf = __expf(-0.5f * z * z) * kInvSqrt2Pi;
  return cdf + z * pdf;
}

template <DType kDtype>
__global__ void __launch_bounds__(kThreads, kBlocksPerSmFwd) bias_gelu_fwd_kernel(const BiasGeluParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cv = blockIdx.x * 32 + lane;  // this lane's 8-column vector
  if (cv >= p.width / kVec) return;       // no block-wide sync below
  float b[kVec];
  load8(p.b, p.b_dtype, cv * kVec, b);
  const int64_t step = int64_t(gridDim.y) * kWarps;
  for (int64_t row0 = int64_t(blockIdx.y) * kWarps + warp; row0 < p.rows; row0 += kUnrollFwd * step) {
    float z[kUnrollFwd][kVec];
#pragma unroll
    for (int u = 0; u < kUnrollFwd; ++u) {
      const int64_t row = row0 + u * step;
      if (row < p.rows) load8<kDtype>(p.y, row * p.width + cv * kVec, z[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnrollFwd; ++u) {
      const int64_t row = row0 + u * step;
      if (row >= p.rows) continue;
      float h[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) h[i] = gelu(z[u][i] + b[i]);
      store8<kDtype>(p.h, row * p.width + cv * kVec, h);
    }
  }
}

template <DType kDtype>
__global__ void __launch_bounds__(kThreads, kBlocksPerSmBwd) bias_gelu_bwd_kernel(const BiasGeluParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cv = blockIdx.x * 32 + lane;
  float db[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) db[i] = 0.f;
  if (cv < p.width / kVec) {
    float b[kVec];
    load8(p.b, p.b_dtype, cv * kVec, b);
    const int64_t step = int64_t(gridDim.y) * kWarps;
    for (int64_t row0 = int64_t(blockIdx.y) * kWarps + warp; row0 < p.rows; row0 += kUnrollBwd * step) {
      float y[kUnrollBwd][kVec], dh[kUnrollBwd][kVec];
#pragma unroll
      for (int u = 0; u < kUnrollBwd; ++u) {
        const int64_t row = row0 + u * step;
        if (row >= p.rows) continue;
        load8<kDtype>(p.y, row * p.width + cv * kVec, y[u]);
        load8<kDtype>(p.dh, row * p.width + cv * kVec, dh[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnrollBwd; ++u) {
        const int64_t row = row0 + u * step;
        if (row >= p.rows) continue;
        float dy[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          dy[i] = dh[u][i] * gelu_grad(y[u][i] + b[i]);
          db[i] += dy[i];
        }
        store8<kDtype>(p.dy, row * p.width + cv * kVec, dy);
      }
    }
  }
  // The warps' db partials summed in shared memory: element e = 8 lane + i is column 256
  // blockIdx.x + e of this block's tile, summed by thread e.
  __shared__ float s_part[kWarps][kTileCols];
#pragma unroll
  for (int i = 0; i < kVec; ++i) s_part[warp][lane * kVec + i] = db[i];
  __syncthreads();
  const int col = blockIdx.x * kTileCols + threadIdx.x;  // kThreads == kTileCols
  if (col < p.width) {
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += s_part[w][threadIdx.x];
    p.partials[int64_t(blockIdx.y) * p.width + col] = acc;
  }
}
static_assert(kThreads == kTileCols, "the partial reduction maps one thread to one column of the tile");

// db[c] = sum_r partials[r][c] over the backward's block rows.
__global__ void __launch_bounds__(kColSumThreads) bias_gelu_bias_grad_reduce_kernel(const BiasGeluParams p,
                                                                                    int row_blocks) {
  const float acc = column_sum_of_partials(p.partials, row_blocks, p.width, p.width);
  const int col = blockIdx.x * kColSumCols + threadIdx.x;
  if (threadIdx.x < kColSumCols && col < p.width)
    store1(p.db, p.b_dtype, col, p.accumulate_db ? acc + load1(p.db, p.b_dtype, col) : acc);
}

int column_tiles(const BiasGeluParams& p) { return (p.width + kTileCols - 1) / kTileCols; }

// Block rows of a grid: enough blocks for blocks_per_sm per SM, no more than the rows need.
int row_blocks(const BiasGeluParams& p, int blocks_per_sm) {
  const int64_t by_rows = (p.rows + kWarps - 1) / kWarps;
  const int64_t by_sms = (int64_t(blocks_per_sm) * std::max(p.num_sms, 1) + column_tiles(p) - 1) / column_tiles(p);
  return int(std::max<int64_t>(1, std::min<int64_t>({by_rows, by_sms, 65535})));
}

}  // namespace

bool bias_gelu_supported(int64_t width) { return width >= kVec && width % kVec == 0 && width <= (int64_t(1) << 30); }

int bias_gelu_backward_row_blocks(const BiasGeluParams& p) { return row_blocks(p, kBlocksPerSmBwd); }

cudaError_t run_bias_gelu_fwd(const BiasGeluParams& p, cudaStream_t stream) {
  if (!bias_gelu_supported(p.width)) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const dim3 grid(unsigned(column_tiles(p)), unsigned(row_blocks(p, kBlocksPerSmFwd)));
  switch (p.dtype) {
    case DType::kFloat: bias_gelu_fwd_kernel<DType::kFloat><<<grid, kThreads, 0, stream>>>(p); break;
    case DType::kHalf: bias_gelu_fwd_kernel<DType::kHalf><<<grid, kThreads, 0, stream>>>(p); break;
    case DType::kBFloat16: bias_gelu_fwd_kernel<DType::kBFloat16><<<grid, kThreads, 0, stream>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t run_bias_gelu_bwd(const BiasGeluParams& p, cudaStream_t stream) {
  if (!bias_gelu_supported(p.width)) return cudaErrorInvalidValue;
  // rows == 0 still runs: the partials are then zeros and so is db.
  const int rb = row_blocks(p, kBlocksPerSmBwd);
  const dim3 grid(unsigned(column_tiles(p)), unsigned(rb));
  switch (p.dtype) {
    case DType::kFloat: bias_gelu_bwd_kernel<DType::kFloat><<<grid, kThreads, 0, stream>>>(p); break;
    case DType::kHalf: bias_gelu_bwd_kernel<DType::kHalf><<<grid, kThreads, 0, stream>>>(p); break;
    case DType::kBFloat16: bias_gelu_bwd_kernel<DType::kBFloat16><<<grid, kThreads, 0, stream>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int reduce_blocks = (p.width + kColSumCols - 1) / kColSumCols;
  bias_gelu_bias_grad_reduce_kernel<<<reduce_blocks, kColSumThreads, 0, stream>>>(p, rb);
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
