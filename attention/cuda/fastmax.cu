// Fastmax feature-map kernels (math and shapes in attention/cuda/fastmax.cuh). Both are
// memory-bound row kernels: a block walks rows grid-stride, stages the row in shared memory and
// writes / reads the F features coalesced. The GEMMs around them are cuBLAS (fastmax_chunked.cpp).
#include "attention/cuda/fastmax.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace flashcos::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 132 * 16;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

// Packed upper-triangle index of (m, r), m <= r, row-major.
__device__ __forceinline__ int packed(int m, int r, int d) { return m * d - m * (m - 1) / 2 + (r - m); }

template <typename T>
__global__ void features_kernel(FastmaxFeatureParams p) {
  extern __shared__ float smem[];
  float* s_x = smem;                                             // (D)
  unsigned* s_pair = reinterpret_cast<unsigned*>(smem + p.d);    // (D (D + 1) / 2): m << 16 | r
  const int d = p.d, f = p.f, nq = f - 1 - d;
  if (p.p == 2) {
    for (int m = threadIdx.x; m < d; m += blockDim.x)
      for (int r = m; r < d; ++r) s_pair[packed(m, r, d)] = (unsigned(m) << 16) | unsigned(r);
  }
  const T* g_x = static_cast<const T*>(p.x);
  T* g_phi = static_cast<T*>(p.phi);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    __syncthreads();  // s_pair built / previous row's s_x no longer read
    for (int t = threadIdx.x; t < d; t += blockDim.x) s_x[t] = to_float(g_x[row * d + t]);
    __syncthreads();
    T* out = g_phi + row * f;
    for (int t = threadIdx.x; t < 1 + d; t += blockDim.x)
      out[t] = from_float<T>(t == 0 ? p.c0 : p.c1 * s_x[t - 1]);
    for (int t = threadIdx.x; t < nq; t += blockDim.x) {
      const unsigned pr = s_pair[t];
      const int m = int(pr >> 16), r = int(pr & 0xffffu);
      const float w = m == r ? p.c2 : p.c2 * p.offdiag;
      out[1 + d + t] = from_float<T>(w * s_x[m] * s_x[r]);
    }
  }
}

template <typename T>
__global__ void feature_grad_kernel(FastmaxFeatureGradParams p) {
  extern __shared__ float smem[];
  const int d = p.d, f = p.f;
  float* s_u = smem;      // (F)
  float* s_x = smem + f;  // (D)
  const T* g_x = static_cast<const T*>(p.x);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    __syncthreads();
    for (int t = threadIdx.x; t < f; t += blockDim.x) s_u[t] = p.u[row * f + t];
    for (int t = threadIdx.x; t < d; t += blockDim.x) s_x[t] = to_float(g_x[row * d + t]);
    __syncthreads();
    for (int t = threadIdx.x; t < d; t += blockDim.x) {
      float acc = 0.f;
      if (p.p == 2) {
        const float* uq = s_u + 1 + d;
        for (int r = 0; r < t; ++r) acc += uq[packed(r, t, d)] * s_x[r];
        const float* row_t = uq + packed(t, t, d);  // U_t,r for r >= t is contiguous
        for (int r = t; r < d; ++r) acc += row_t[r - t] * s_x[r];
        acc *= 2.f * p.c2;
      }
      p.gx[row * d + t] = acc + p.c1 * s_u[1 + t];
    }
  }
}

int blocks_for(int64_t rows) { return int(std::min<int64_t>(rows, kMaxBlocks)); }

}  // namespace

cudaError_t launch_fastmax_features(const FastmaxFeatureParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const size_t smem = sizeof(float) * p.d + sizeof(unsigned) * (p.p == 2 ? p.d * (p.d + 1) / 2 : 0);
  const dim3 grid(blocks_for(p.rows)), block(kThreads);
  switch (p.dtype) {
    case FmDtype::kF32: features_kernel<float><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kBF16: features_kernel<__nv_bfloat16><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kF16: features_kernel<__half><<<grid, block, smem, stream>>>(p); break;
  }
  return cudaGetLastError();
}

cudaError_t launch_fastmax_feature_grad(const FastmaxFeatureGradParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const size_t smem = sizeof(float) * (p.f + p.d);
  const int threads = std::min(kThreads, (p.d + 31) / 32 * 32);
  const dim3 grid(blocks_for(p.rows)), block(threads);
  switch (p.dtype) {
    case FmDtype::kF32: feature_grad_kernel<float><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kBF16: feature_grad_kernel<__nv_bfloat16><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kF16: feature_grad_kernel<__half><<<grid, block, smem, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
