// Fused residual add (+ the residual branch's bias) + LayerNorm, forward and backward (math in
// add_layer_norm.h):
//   forward:  one warp per row; the row's s = x + (r + r_bias) lives in registers (kSlots x 8 floats
//             per lane, lane l holding columns [8 (l + 32 k), 8 (l + 32 k) + 8)), so x and r are
//             read once; mean and variance by two warp sums (centred second pass: no cancellation).
//   backward: one warp per row, rows strided over a grid of ~2 blocks per SM; each lane keeps its
//             columns' dgamma / dbeta (/ dr_bias) partial sums in registers across rows, the block
//             sums its warps' partials in shared memory into one row of `partials`, and a second
//             kernel sums those rows column by column in a fixed order.
#include "model/fused/cuda/add_layer_norm.h"

#include <algorithm>
#include <type_traits>

#include "model/fused/cuda/vec.cuh"

namespace flashcos::cuda {
namespace {

using namespace fused;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

template <int kSlots>
__global__ void __launch_bounds__(kThreads) add_layer_norm_fwd_kernel(const AddLayerNormParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  if (row >= p.rows) return;  // whole warps only: no block-wide sync below
  const int nvec = p.width / kVec;
  const int64_t base = row * p.width;
  float v[kSlots][kVec];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int c = lane + 32 * k;
    if (c >= nvec) continue;
    load8(p.x, p.x_dtype, base + c * kVec, v[k]);
    if (p.r != nullptr) {
      float r[kVec];
      load8(p.r, p.r_dtype, base + c * kVec, r);
      if (p.r_bias != nullptr) {
        float b[kVec];
        load8(p.r_bias, p.r_bias_dtype, c * kVec, b);
#pragma unroll
        for (int i = 0; i < kVec; ++i) r[i] += b[i];
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[k][i] = round_to(p.s_dtype, v[k][i] + r[i]);
      store8(p.s, p.s_dtype, base + c * kVec, v[k]);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum += v[k][i];
  }
  const float inv_width = 1.f / float(p.width);
  const float mean = warp_sum(sum) * inv_width;
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    if (lane + 32 * k >= nvec) continue;
#pragma unroll
    for (int i = 0; i < kVec; ++i) sq += (v[k][i] - mean) * (v[k][i] - mean);
  }
  const float rstd = rsqrtf(warp_sum(sq) * inv_width + p.eps);
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int c = lane + 32 * k;
    if (c >= nvec) continue;
    float g[kVec], b[kVec], y[kVec];
    load8(p.gamma, p.w_dtype, c * kVec, g);
    load8(p.beta, p.w_dtype, c * kVec, b);
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = (v[k][i] - mean) * rstd * g[i] + b[i];
    store8(p.y, p.y_dtype, base + c * kVec, y);
  }
  if (lane == 0) {
    p.mean[row] = mean;
    p.rstd[row] = rstd;
  }
}

// kBias: the forward added r_bias, whose gradient (the column sums of dsum) is a third partial.
// The grid has 2 blocks an SM (add_layer_norm_backward_blocks): up to 2 slots they must both be
// resident, so at most 128 registers a thread. With kBias the 16 more accumulators of 2 slots took
// the kernel to 134 registers, and to a 16-byte spill in the row loop at the cap (ptxas, sm_90);
// recomputing xhat from a second load of s (below) brings it to 118 (sm_90) / 114 (sm_80).
template <int kSlots, bool kBias>
__global__ void __launch_bounds__(kThreads, kSlots <= 2 ? 2 : 1)
    add_layer_norm_bwd_kernel(const AddLayerNormParams p) {
  constexpr int kPartials = kBias ? 3 : 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nvec = p.width / kVec;
  const float inv_width = 1.f / float(p.width);
  // s where the forward added a residual, else x itself (then in x's dtype).
  const void* s_ptr = p.r != nullptr ? static_cast<const void*>(p.s) : p.x;
  const DType s_dtype = p.r != nullptr ? p.s_dtype : p.x_dtype;
  // Per column: dgamma, dbeta, dr_bias (the last with kBias only).
  float part[kPartials][kSlots][kVec];
#pragma unroll
  for (int q = 0; q < kPartials; ++q) {
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) part[q][k][i] = 0.f;
    }
  }
  for (int64_t row = int64_t(blockIdx.x) * kWarps + warp; row < p.rows; row += int64_t(gridDim.x) * kWarps) {
    const int64_t base = row * p.width;
    const float mean = p.mean[row], rstd = p.rstd[row];
    // With kBias, xhat is not kept across the warp sums but recomputed from a second load of s (the
    // same warp read that row segment just before: an L1 hit, most likely).
    float xhat[kBias ? 1 : kSlots][kVec], g[kSlots][kVec];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int c = lane + 32 * k;
      if (c >= nvec) continue;
      float dy[kVec], gamma[kVec];
      float (&xh)[kVec] = xhat[kBias ? 0 : k];
      load8(s_ptr, s_dtype, base + c * kVec, xh);
      load8(p.dy, p.y_dtype, base + c * kVec, dy);
      load8(p.gamma, p.w_dtype, c * kVec, gamma);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        xh[i] = (xh[i] - mean) * rstd;
        g[k][i] = dy[i] * gamma[i];
        sum_g += g[k][i];
        sum_gx += g[k][i] * xh[i];
        part[0][k][i] += dy[i] * xh[i];
        part[1][k][i] += dy[i];
      }
    }
    const float mean_g = warp_sum(sum_g) * inv_width;
    const float mean_gx = warp_sum(sum_gx) * inv_width;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int c = lane + 32 * k;
      if (c >= nvec) continue;
      float (&xh)[kVec] = xhat[kBias ? 0 : k];
      if constexpr (kBias) {
        load8(s_ptr, s_dtype, base + c * kVec, xh);
#pragma unroll
        for (int i = 0; i < kVec; ++i) xh[i] = (xh[i] - mean) * rstd;
      }
      float d[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) d[i] = rstd * (g[k][i] - mean_g - xh[i] * mean_gx);
      if (p.ds != nullptr) {
        float ds[kVec];
        load8(p.ds, p.s_dtype, base + c * kVec, ds);
#pragma unroll
        for (int i = 0; i < kVec; ++i) d[i] += ds[i];
      }
      if constexpr (kBias) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) part[2][k][i] += d[i];
      }
      store8(p.dx, p.x_dtype, base + c * kVec, d);
      if (p.dr != nullptr) store8(p.dr, p.r_dtype, base + c * kVec, d);
    }
  }
  // The block's warps' partials, summed in shared memory: element e = 8 lane + i of slot k is
  // column 256 k + e. One (slot, quantity) at a time keeps the buffer at 8 KiB.
  __shared__ float s_part[kWarps][32 * kVec];
  float* out = p.partials + int64_t(blockIdx.x) * kPartials * p.width;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
#pragma unroll
    for (int q = 0; q < kPartials; ++q) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) s_part[warp][lane * kVec + i] = part[q][k][i];
      __syncthreads();
      const int col = 32 * kVec * k + threadIdx.x;  // kThreads == 32 * kVec
      if (col < p.width) {
        float acc = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) acc += s_part[w][threadIdx.x];
        out[q * p.width + col] = acc;
      }
      __syncthreads();
    }
  }
}
static_assert(kThreads == 32 * kVec, "the partial reduction maps one thread to one element of a warp's slot");

// dgamma[c] = sum_b partials[b][0][c], dbeta[c] = sum_b partials[b][1][c] (and dr_bias[c] =
// sum_b partials[b][2][c]): the (blocks, nq C) partials summed down their columns.
__global__ void __launch_bounds__(kColSumThreads) layer_norm_param_grads_reduce_kernel(const AddLayerNormParams p,
                                                                                       int blocks, int nq) {
  const int cols = nq * p.width;
  const float acc = column_sum_of_partials(p.partials, blocks, cols, cols);
  const int col = blockIdx.x * kColSumCols + threadIdx.x;  // in [0, nq C): dgamma's, dbeta's, dr_bias's
  if (threadIdx.x >= kColSumCols || col >= cols) return;
  const int q = col / p.width, c = col % p.width;
  if (q == 0) {
    store1(p.dgamma, p.w_dtype, c, p.accumulate_dgamma ? acc + load1(p.dgamma, p.w_dtype, c) : acc);
  } else if (q == 1) {
    store1(p.dbeta, p.w_dtype, c, p.accumulate_dbeta ? acc + load1(p.dbeta, p.w_dtype, c) : acc);
  } else {
    store1(p.dr_bias, p.r_bias_dtype, c, p.accumulate_dr_bias ? acc + load1(p.dr_bias, p.r_bias_dtype, c) : acc);
  }
}

template <typename Fn>
cudaError_t with_slots(int width, Fn&& fn) {
  const int nvec = width / kVec;
  if (nvec <= 32) return fn(std::integral_constant<int, 1>{});
  if (nvec <= 64) return fn(std::integral_constant<int, 2>{});
  return fn(std::integral_constant<int, 4>{});
}

bool has_r_bias(const AddLayerNormParams& p) { return p.r != nullptr && p.r_bias != nullptr; }

}  // namespace

bool add_layer_norm_supported(int64_t width) {
  return width >= kVec && width % kVec == 0 && width <= kAddLayerNormMaxWidth;
}

int add_layer_norm_backward_blocks(const AddLayerNormParams& p) {
  const int64_t by_rows = (p.rows + kWarps - 1) / kWarps;
  return int(std::max<int64_t>(1, std::min<int64_t>(by_rows, 2 * int64_t(std::max(p.num_sms, 1)))));
}

int add_layer_norm_backward_partials(const AddLayerNormParams& p) { return has_r_bias(p) ? 3 : 2; }

cudaError_t run_add_layer_norm_fwd(const AddLayerNormParams& p, cudaStream_t stream) {
  if (!add_layer_norm_supported(p.width)) return cudaErrorInvalidValue;
  if (p.r_bias != nullptr && p.r == nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const int64_t blocks = (p.rows + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return with_slots(p.width, [&](auto slots) {
    add_layer_norm_fwd_kernel<decltype(slots)::value><<<unsigned(blocks), kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

cudaError_t run_add_layer_norm_bwd(const AddLayerNormParams& p, cudaStream_t stream) {
  if (!add_layer_norm_supported(p.width)) return cudaErrorInvalidValue;
  if (p.r_bias != nullptr && (p.r == nullptr || p.dr_bias == nullptr)) return cudaErrorInvalidValue;
  const int blocks = add_layer_norm_backward_blocks(p);
  const bool bias = has_r_bias(p);
  // rows == 0 still runs: the partials are then zeros and so are the parameter gradients.
  cudaError_t err = with_slots(p.width, [&](auto slots) {
    constexpr int kSlots = decltype(slots)::value;
    if (bias) {
      add_layer_norm_bwd_kernel<kSlots, true><<<blocks, kThreads, 0, stream>>>(p);
    } else {
      add_layer_norm_bwd_kernel<kSlots, false><<<blocks, kThreads, 0, stream>>>(p);
    }
    return cudaGetLastError();
  });
  if (err != cudaSuccess) return err;
  const int nq = add_layer_norm_backward_partials(p);
  const int reduce_blocks = (nq * p.width + kColSumCols - 1) / kColSumCols;
  layer_norm_param_grads_reduce_kernel<<<reduce_blocks, kColSumThreads, 0, stream>>>(p, blocks, nq);
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
