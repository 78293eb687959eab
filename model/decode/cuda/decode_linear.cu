// The decode step's one-row linear layer (math in decode_linear.h).
//   grid ceil(N / 4), 128 threads. Each warp first issues the loads of its row of W (they do not
//   depend on x), then every block stages x in shared memory as float32 and, with a
//   LayerNorm, normalises it there (block sums for the mean, then the centred variance). Each lane
//   then keeps its slice of h in registers: chunk c = lane + 32 i of 8 features. Each warp takes
//   one output row: all of its weight loads issued first (16-byte loads, up to 8 per lane in
//   flight), the dot product in float32, a warp sum, and lane 0 applies bias, GELU, the rounding
//   and the store or the residual add.
#include "model/decode/cuda/decode_linear.h"

#include "model/fused/cuda/vec.cuh"

namespace flashcos::cuda {
namespace {

using namespace fused;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red is free (an earlier sum's readers are done)
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += red[w];
  return total;
}

// Loads the lane's chunks of row `row` of W (zeros past K).
template <int kChunks>
__device__ __forceinline__ void load_row(const DecodeLinearParams& p, int row, int lane, float (&wr)[kChunks][kVec]) {
  const int chunks = p.k / kVec;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = lane + 32 * i;
    if (c < chunks) {
      load8(p.w, p.w_dtype, int64_t(row) * p.k + c * kVec, wr[i]);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) wr[i][j] = 0.f;
    }
  }
}

template <int kChunks>  // chunks of 8 features per lane: ceil(K / 256)
__global__ void __launch_bounds__(kThreads) decode_linear_kernel(const DecodeLinearParams p) {
  __shared__ __align__(16) float xs[kDecodeLinearMaxK];
  __shared__ float red[kWarps];
  const int K = p.k, lane = threadIdx.x % 32, warp = threadIdx.x / 32, chunks = K / kVec;
  // The first row's weights do not depend on x: their loads go out before x's, so the two
  // memory latencies overlap.
  int row = blockIdx.x * kWarps + warp;
  float wr[kChunks][kVec];
  if (row < p.n) load_row<kChunks>(p, row, lane, wr);
#pragma unroll 4
  for (int k = threadIdx.x; k < K; k += kThreads) xs[k] = load1(p.x, p.x_dtype, k);
  if (p.ln_gamma != nullptr) {
    // Each thread reads back only the features it wrote: no barrier before the sums' own.
    float s = 0.f;
    for (int k = threadIdx.x; k < K; k += kThreads) s += xs[k];
    const float mean = block_sum(s, red) / static_cast<float>(K);
    float v = 0.f;
    for (int k = threadIdx.x; k < K; k += kThreads) {
      const float d = xs[k] - mean;
      v += d * d;
    }
    const float rstd = rsqrtf(block_sum(v, red) / static_cast<float>(K) + p.ln_eps);
    for (int k = threadIdx.x; k < K; k += kThreads) {
      xs[k] = round_to(p.w_dtype, (xs[k] - mean) * rstd * p.ln_gamma[k] + p.ln_beta[k]);
    }
  }
  __syncthreads();

  float h[kChunks][kVec];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = lane + 32 * i;
#pragma unroll
    for (int j = 0; j < kVec; ++j) h[i][j] = c < chunks ? xs[c * kVec + j] : 0.f;
  }
  for (; row < p.n; row += gridDim.x * kWarps) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc = fmaf(wr[i][j], h[i][j], acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      float y = round_to(p.w_dtype, acc + (p.bias != nullptr ? load1(p.bias, p.w_dtype, row) : 0.f));
      if (p.gelu) y = round_to(p.w_dtype, 0.5f * y * (1.f + erff(y * 0.70710678118654752f)));
      if (p.accumulate) {
        static_cast<float*>(p.out)[row] += y;
      } else {
        store1(p.out, p.out_dtype, row, y);
      }
    }
    const int next = row + gridDim.x * kWarps;
    if (next < p.n) load_row<kChunks>(p, next, lane, wr);
  }
}

}  // namespace

bool decode_linear_supported(int k) { return k >= kVec && k <= kDecodeLinearMaxK && k % kVec == 0; }

cudaError_t run_decode_linear(const DecodeLinearParams& p, cudaStream_t stream) {
  if (!decode_linear_supported(p.k) || p.n < 1 || (p.accumulate && p.out_dtype != DType::kFloat) ||
      (p.accumulate && p.ln_gamma != nullptr && p.x == p.out)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid((p.n + kWarps - 1) / kWarps);
  const int chunks = (p.k / kVec + 31) / 32;
  if (chunks <= 1) {
    decode_linear_kernel<1><<<grid, kThreads, 0, stream>>>(p);
  } else if (chunks <= 2) {
    decode_linear_kernel<2><<<grid, kThreads, 0, stream>>>(p);
  } else if (chunks <= 4) {
    decode_linear_kernel<4><<<grid, kThreads, 0, stream>>>(p);
  } else {
    decode_linear_kernel<8><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
