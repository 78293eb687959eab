// Fastmax feature-map kernels (math and shapes in attention/fastmax/cuda/fastmax.cuh). Both are
// memory-bound row kernels: a block walks rows grid-stride, stages the row in shared memory and
// writes / reads the F features coalesced. The GEMMs around them are cuBLAS (fastmax_chunked.cpp).
#include "attention/fastmax/cuda/fastmax.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace flashcos::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 132 * 16;

template <typename T> struct Acc { using type = float; };  // math type: float, double for double
template <> struct Acc<double> { using type = double; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ double to_float(double v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// Packed upper-triangle index of (m, r), m <= r, row-major.
__device__ __forceinline__ int packed(int m, int r, int d) { return m * d - m * (m - 1) / 2 + (r - m); }

template <typename T>
__global__ void features_kernel(FastmaxFeatureParams p) {
  using A = typename Acc<T>::type;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* s_x = reinterpret_cast<A*>(smem_raw);                       // (D)
  unsigned* s_pair = reinterpret_cast<unsigned*>(s_x + p.d);     // (D (D + 1) / 2): m << 16 | r
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
      out[t] = T(t == 0 ? A(p.c0) : A(p.c1) * s_x[t - 1]);
    for (int t = threadIdx.x; t < nq; t += blockDim.x) {
      const unsigned pr = s_pair[t];
      const int m = int(pr >> 16), r = int(pr & 0xffffu);
      const A w = m == r ? A(p.c2) : A(p.c2) * A(p.offdiag);
      out[1 + d + t] = T(w * s_x[m] * s_x[r]);
    }
  }
}

template <typename T>
__global__ void feature_grad_kernel(FastmaxFeatureGradParams p) {
  using A = typename Acc<T>::type;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = p.d, f = p.f;
  A* s_u = reinterpret_cast<A*>(smem_raw);  // (F)
  A* s_x = s_u + f;                         // (D)
  const T* g_x = static_cast<const T*>(p.x);
  const A* g_u = static_cast<const A*>(p.u);
  A* g_gx = static_cast<A*>(p.gx);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    __syncthreads();
    for (int t = threadIdx.x; t < f; t += blockDim.x) s_u[t] = g_u[row * f + t];
    for (int t = threadIdx.x; t < d; t += blockDim.x) s_x[t] = to_float(g_x[row * d + t]);
    __syncthreads();
    for (int t = threadIdx.x; t < d; t += blockDim.x) {
      A acc = 0;
      if (p.p == 2) {
        const A* uq = s_u + 1 + d;
        for (int r = 0; r < t; ++r) acc += uq[packed(r, t, d)] * s_x[r];
        const A* row_t = uq + packed(t, t, d);  // U_t,r for r >= t is contiguous
        for (int r = t; r < d; ++r) acc += row_t[r - t] * s_x[r];
        acc *= A(2) * A(p.c2);
      }
      g_gx[row * d + t] = acc + A(p.c1) * s_u[1 + t];
    }
  }
}

int blocks_for(int64_t rows) { return int(std::min<int64_t>(rows, kMaxBlocks)); }

}  // namespace

cudaError_t launch_fastmax_features(const FastmaxFeatureParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const size_t acc = p.dtype == FmDtype::kF64 ? sizeof(double) : sizeof(float);
  const size_t smem = acc * p.d + sizeof(unsigned) * (p.p == 2 ? p.d * (p.d + 1) / 2 : 0);
  const dim3 grid(blocks_for(p.rows)), block(kThreads);
  switch (p.dtype) {
    case FmDtype::kF64: features_kernel<double><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kF32: features_kernel<float><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kBF16: features_kernel<__nv_bfloat16><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kF16: features_kernel<__half><<<grid, block, smem, stream>>>(p); break;
  }
  return cudaGetLastError();
}

cudaError_t launch_fastmax_feature_grad(const FastmaxFeatureGradParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const size_t smem = (p.dtype == FmDtype::kF64 ? sizeof(double) : sizeof(float)) * (p.f + p.d);
  const int threads = std::min(kThreads, (p.d + 31) / 32 * 32);
  const dim3 grid(blocks_for(p.rows)), block(threads);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaSuccess;
    if (p.dtype == FmDtype::kF64)
      e = cudaFuncSetAttribute(feature_grad_kernel<double>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  switch (p.dtype) {
    case FmDtype::kF64: feature_grad_kernel<double><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kF32: feature_grad_kernel<float><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kBF16: feature_grad_kernel<__nv_bfloat16><<<grid, block, smem, stream>>>(p); break;
    case FmDtype::kF16: feature_grad_kernel<__half><<<grid, block, smem, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
