// The decode step's one-row linear layer (math in decode_linear.h).
//   grid ceil(N / 4), 128 threads, one output row per warp; no shared memory, no block barrier.
//   1. Before the grid dependency wait (programmatic dependent launch, pdl.cuh) each warp issues
//      the loads that no kernel of the step writes: its row of W (16-byte loads, up to 8 per lane
//      in flight), the row's bias and, for K <= 512, gamma and beta. They overlap the previous
//      kernel's tail. Then the block lets the next kernel launch and waits for the previous one.
//   2. Each lane loads its slice of x (the table row at *token when given) into registers in the
//      layout of its weights: chunk c = lane + 32 i of 8 features. Block 0 stores the table row
//      (x_store) and advances *pos.
//   3. With a LayerNorm every warp computes the statistics of the whole row itself (a warp sum for
//      the mean, then one for the centred variance) and normalises its registers: the four warps
//      of a block compute the same values in the same order, and no block-wide sum is needed.
//   4. The dot product in float32, a warp sum, and lane 0 applies bias, GELU, the rounding and
//      the store or the residual add.
#include "model/decode/cuda/decode_linear.h"

#include "attention/common/cuda/env_switch.h"
#include "attention/common/cuda/pdl.cuh"
#include "model/fused/cuda/vec.cuh"

namespace flashcos::cuda {
namespace {

using namespace fused;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
// Rows of up to 2 chunks per lane (K <= 512, the model's width) load gamma and beta before the wait
// (32 registers more); wider rows load them when they normalise, to stay clear of spills.
constexpr int kMaxEarlyLnChunks = 2;

// The lane's chunks of a row (elements [base, base + K) of ptr): chunk c = lane + 32 i holds the
// 8 features from c * 8; zeros past K.
template <int kChunks>
__device__ __forceinline__ void load_chunks(const void* ptr, DType dtype, int64_t base, int chunks, int lane,
                                            float (&r)[kChunks][kVec]) {
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = lane + 32 * i;
    if (c < chunks) {
      load8(ptr, dtype, base + int64_t(c) * kVec, r[i]);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) r[i][j] = 0.f;
    }
  }
}

template <int kChunks>  // chunks of 8 features per lane: ceil(K / 256)
__global__ void __launch_bounds__(kThreads) decode_linear_kernel(const DecodeLinearParams p) {
  constexpr bool kEarlyLn = kChunks <= kMaxEarlyLnChunks;
  const int K = p.k, chunks = K / kVec, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool ln = p.ln_gamma != nullptr;
  int row = blockIdx.x * kWarps + warp;

  // 1. What no kernel of the step writes, before the wait.
  float wr[kChunks][kVec], b = 0.f;
  if (row < p.n) {
    load_chunks<kChunks>(p.w, p.w_dtype, int64_t(row) * K, chunks, lane, wr);
    if (p.bias != nullptr && lane == 0) b = load1(p.bias, p.w_dtype, row);
  }
  float gr[kEarlyLn ? kChunks : 1][kVec], br[kEarlyLn ? kChunks : 1][kVec];
  if constexpr (kEarlyLn) {
    if (ln) {
      load_chunks<kChunks>(p.ln_gamma, DType::kFloat, 0, chunks, lane, gr);
      load_chunks<kChunks>(p.ln_beta, DType::kFloat, 0, chunks, lane, br);
    }
  }
  pdl::allow_next_grid();
  pdl::wait_for_previous_grid();  // token, x, pos and out: the earlier kernels' from here on

  // 2. x in registers.
  const int64_t x_base = p.token != nullptr ? *p.token * K : 0;
  float h[kChunks][kVec];
  load_chunks<kChunks>(p.x, p.x_dtype, x_base, chunks, lane, h);
  if (blockIdx.x == 0) {
    if (p.x_store != nullptr && warp == 0) {
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const int c = lane + 32 * i;
        if (c < chunks) store8(p.x_store, DType::kFloat, int64_t(c) * kVec, h[i]);
      }
    }
    if (p.pos != nullptr && threadIdx.x == 0) *p.pos += 1;
  }

  // 3. LayerNorm over the whole row in every warp (the zeros past K add nothing to the sums).
  if (ln) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) s += h[i][j];
    }
    const float mean = warp_sum(s) / static_cast<float>(K);
    float v = 0.f;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if (lane + 32 * i >= chunks) continue;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float d = h[i][j] - mean;
        v += d * d;
      }
    }
    const float rstd = rsqrtf(warp_sum(v) / static_cast<float>(K) + p.ln_eps);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = lane + 32 * i;
      if (c >= chunks) continue;
      float g[kVec], be[kVec];
      if constexpr (kEarlyLn) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) g[j] = gr[i][j], be[j] = br[i][j];
      } else {
        load8(p.ln_gamma, DType::kFloat, int64_t(c) * kVec, g);
        load8(p.ln_beta, DType::kFloat, int64_t(c) * kVec, be);
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) h[i][j] = round_to(p.w_dtype, (h[i][j] - mean) * rstd * g[j] + be[j]);
    }
  }

  // 4. One output row per warp (and round).
  for (; row < p.n; row += gridDim.x * kWarps) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc = fmaf(wr[i][j], h[i][j], acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      float y = round_to(p.w_dtype, acc + b);
      if (p.gelu) y = round_to(p.w_dtype, 0.5f * y * (1.f + erff(y * 0.70710678118654752f)));
      if (p.accumulate) {
        static_cast<float*>(p.out)[row] += y;
      } else {
        store1(p.out, p.out_dtype, row, y);
      }
    }
    const int next = row + gridDim.x * kWarps;
    if (next < p.n) {
      load_chunks<kChunks>(p.w, p.w_dtype, int64_t(next) * K, chunks, lane, wr);
      if (p.bias != nullptr && lane == 0) b = load1(p.bias, p.w_dtype, next);
    }
  }
}

}  // namespace

bool decode_linear_supported(int k) { return k >= kVec && k <= kDecodeLinearMaxK && k % kVec == 0; }

cudaError_t run_decode_linear(const DecodeLinearParams& p, cudaStream_t stream) {
  const void* out = p.out;
  if (!decode_linear_supported(p.k) || p.n < 1 || (p.accumulate && p.out_dtype != DType::kFloat) ||
      (p.accumulate && (p.x == out || p.x_store == out)) || (p.x_store != nullptr && p.token == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid((p.n + kWarps - 1) / kWarps), block(kThreads);
  const int chunks = (p.k / kVec + 31) / 32;
  static const bool pdl_on = env_switch_on("FLASHCOS_DECODE_PDL");
  if (chunks <= 1) return pdl::launch<decode_linear_kernel<1>>(pdl_on, grid, block, stream, p);
  if (chunks <= 2) return pdl::launch<decode_linear_kernel<2>>(pdl_on, grid, block, stream, p);
  if (chunks <= 4) return pdl::launch<decode_linear_kernel<4>>(pdl_on, grid, block, stream, p);
  return pdl::launch<decode_linear_kernel<8>>(pdl_on, grid, block, stream, p);
}

}  // namespace flashcos::cuda
