// Fused residual add + LayerNorm, forward and backward (math in add_layer_norm.h).
//   forward:  one warp per row; the row's s = x + r lives in registers (kSlots x 8 floats per lane,
//             lane l holding columns [8 (l + 32 k), 8 (l + 32 k) + 8)), so x and r are read once;
//             mean and variance by two warp sums (centred second pass: no cancellation).
//   backward: one warp per row, rows strided over a grid of ~2 blocks per SM; each lane keeps its
//             columns' dgamma / dbeta partial sums in registers across rows, the block sums its
//             warps' partials in shared memory into one row of `partials`, and a second kernel sums
//             those rows column by column in a fixed order.
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

template <int kSlots>
__global__ void __launch_bounds__(kThreads) add_layer_norm_bwd_kernel(const AddLayerNormParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nvec = p.width / kVec;
  const float inv_width = 1.f / float(p.width);
  // s where the forward added a residual, else x itself (then in x's dtype).
  const void* s_ptr = p.r != nullptr ? static_cast<const void*>(p.s) : p.x;
  const DType s_dtype = p.r != nullptr ? p.s_dtype : p.x_dtype;
  float dgamma[kSlots][kVec], dbeta[kSlots][kVec];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) dgamma[k][i] = dbeta[k][i] = 0.f;
  }
  for (int64_t row = int64_t(blockIdx.x) * kWarps + warp; row < p.rows; row += int64_t(gridDim.x) * kWarps) {
    const int64_t base = row * p.width;
    const float mean = p.mean[row], rstd = p.rstd[row];
    float xhat[kSlots][kVec], g[kSlots][kVec];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int c = lane + 32 * k;
      if (c >= nvec) continue;
      float dy[kVec], gamma[kVec];
      load8(s_ptr, s_dtype, base + c * kVec, xhat[k]);
      load8(p.dy, p.y_dtype, base + c * kVec, dy);
      load8(p.gamma, p.w_dtype, c * kVec, gamma);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        xhat[k][i] = (xhat[k][i] - mean) * rstd;
        g[k][i] = dy[i] * gamma[i];
        sum_g += g[k][i];
        sum_gx += g[k][i] * xhat[k][i];
        dgamma[k][i] += dy[i] * xhat[k][i];
        dbeta[k][i] += dy[i];
      }
    }
    const float mean_g = warp_sum(sum_g) * inv_width;
    const float mean_gx = warp_sum(sum_gx) * inv_width;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int c = lane + 32 * k;
      if (c >= nvec) continue;
      float d[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) d[i] = rstd * (g[k][i] - mean_g - xhat[k][i] * mean_gx);
      if (p.ds != nullptr) {
        float ds[kVec];
        load8(p.ds, p.s_dtype, base + c * kVec, ds);
#pragma unroll
        for (int i = 0; i < kVec; ++i) d[i] += ds[i];
      }
      store8(p.dx, p.x_dtype, base + c * kVec, d);
      if (p.dr != nullptr) store8(p.dr, p.r_dtype, base + c * kVec, d);
    }
  }
  // The block's warps' partials, summed in shared memory: element e = 8 lane + i of slot k is
  // column 256 k + e. One (slot, quantity) at a time keeps the buffer at 8 KiB.
  __shared__ float s_part[kWarps][32 * kVec];
  float* out = p.partials + int64_t(blockIdx.x) * 2 * p.width;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) s_part[warp][lane * kVec + i] = q == 0 ? dgamma[k][i] : dbeta[k][i];
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

// dgamma[c] = sum_b partials[b][0][c], dbeta[c] = sum_b partials[b][1][c]: 32 columns per block,
// 8 rows of threads striding over the blocks, then a shared-memory sum over the 8.
constexpr int kReduceCols = 32, kReduceRows = 8;

__global__ void __launch_bounds__(kReduceCols* kReduceRows) gamma_beta_reduce_kernel(const AddLayerNormParams p,
                                                                                     int blocks) {
  __shared__ float s_acc[kReduceRows][kReduceCols + 1];
  const int tx = threadIdx.x % kReduceCols, ty = threadIdx.x / kReduceCols;
  const int col2 = blockIdx.x * kReduceCols + tx;  // in [0, 2 C): dgamma columns, then dbeta's
  float acc = 0.f;
  if (col2 < 2 * p.width) {
    for (int b = ty; b < blocks; b += kReduceRows) acc += p.partials[int64_t(b) * 2 * p.width + col2];
  }
  s_acc[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && col2 < 2 * p.width) {
    for (int r = 1; r < kReduceRows; ++r) acc += s_acc[r][tx];
    if (col2 < p.width) {
      store1(p.dgamma, p.w_dtype, col2, acc);
    } else {
      store1(p.dbeta, p.w_dtype, col2 - p.width, acc);
    }
  }
}

template <typename Fn>
cudaError_t with_slots(int width, Fn&& fn) {
  const int nvec = width / kVec;
  if (nvec <= 32) return fn(std::integral_constant<int, 1>{});
  if (nvec <= 64) return fn(std::integral_constant<int, 2>{});
  return fn(std::integral_constant<int, 4>{});
}

}  // namespace

bool add_layer_norm_supported(int64_t width) {
  return width >= kVec && width % kVec == 0 && width <= kAddLayerNormMaxWidth;
}

int add_layer_norm_backward_blocks(const AddLayerNormParams& p) {
  const int64_t by_rows = (p.rows + kWarps - 1) / kWarps;
  return int(std::max<int64_t>(1, std::min<int64_t>(by_rows, 2 * int64_t(std::max(p.num_sms, 1)))));
}

cudaError_t run_add_layer_norm_fwd(const AddLayerNormParams& p, cudaStream_t stream) {
  if (!add_layer_norm_supported(p.width)) return cudaErrorInvalidValue;
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
  const int blocks = add_layer_norm_backward_blocks(p);
  // rows == 0 still runs: the partials are then zeros and so are dgamma, dbeta.
  cudaError_t err = with_slots(p.width, [&](auto slots) {
    add_layer_norm_bwd_kernel<decltype(slots)::value><<<blocks, kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  });
  if (err != cudaSuccess) return err;
  const int reduce_blocks = (2 * p.width + kReduceCols - 1) / kReduceCols;
  gamma_beta_reduce_kernel<<<reduce_blocks, kReduceCols * kReduceRows, 0, stream>>>(p, blocks);
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
