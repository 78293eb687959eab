// fp32 / fp64 cosine-sim attention on CUDA cores (FFMA / DFMA), full input precision.
//
// Same math as fwd_kernel.cuh / bwd_kernel.cuh with an exact exp: accuracy first, these are the
// kernels for fp32 checks and fp64 gradchecks, not the fast path. Four lanes share one row
// (kSub, each holding D / 4 features; the dot products reduce with two shuffles).
//   forward:  CTA = 32 query rows, streams K, V in tiles of kKeys keys
//   backward: dkdv kernel (CTA = 32 keys, loops over the group's query heads and rows), then a
//             dq kernel (CTA = 32 query rows, loops over keys; also adds dbias by atomics).
#pragma once

#include "attention/cosine/cuda/bwd_kernel.cuh"  // delta_kernel
#include "attention/cosine/cuda/params.h"

namespace flashcos::cuda {

namespace simt {
constexpr int kSub = 4;   // lanes per row
constexpr int kRows = 32; // rows (queries or keys) per CTA
constexpr int kKeys = 16; // streamed rows per shared-memory tile
constexpr int kThreads = kSub * kRows;

__device__ __forceinline__ float exact_exp(float x) { return expf(x); }
__device__ __forceinline__ double exact_exp(double x) { return exp(x); }

template <typename T>
__device__ __forceinline__ T row_dot(const T* a, const T* b, int n) {
  T s = 0;
  for (int k = 0; k < n; ++k) s = fma(a[k], b[k], s);
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  return s;
}
}  // namespace simt

template <typename T, int D>
__global__ void __launch_bounds__(simt::kThreads) simt_fwd_kernel(const FwdParams p) {
  using namespace simt;
  constexpr int kDS = D / kSub;
  __shared__ T sK[kKeys][D], sV[kKeys][D];
  const int tid = threadIdx.x, sub = tid % kSub;
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / (p.H / p.Hkv);
  const int I = p.I, J = p.J, diag = J - I;
  const int m0 = blockIdx.x * kRows, r = m0 + tid / kSub;
  const T* gQ = static_cast<const T*>(p.q) + b * p.q_b_stride + h * p.q_h_stride;
  const T* gK = static_cast<const T*>(p.k) + b * p.k_b_stride + hkv * p.k_h_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_b_stride + hkv * p.v_h_stride;
  const T* gBias = p.bias ? static_cast<const T*>(p.bias) + (p.bias_batch_dim ? b : h) * p.bias_0_stride
                          : nullptr;
  const T scale = T(p.scale_d), offset = p.exp_kind ? T(0) : -T(p.scale_d);

  T q[kDS], o[kDS], l = 0;
#pragma unroll
  for (int k = 0; k < kDS; ++k) {
    q[k] = r < I ? gQ[int64_t(r) * p.q_i_stride + sub * kDS + k] : T(0);
    o[k] = 0;
  }
  const int n_end = p.causal ? min(J, m0 + kRows + diag) : J;
  for (int n0 = 0; n0 < n_end; n0 += kKeys) {
    __syncthreads();
    for (int idx = tid; idx < kKeys * D; idx += kThreads) {
      const int key = idx / D, d = idx % D, c = n0 + key;
      sK[key][d] = c < J ? gK[int64_t(c) * p.k_j_stride + d] : T(0);
      sV[key][d] = c < J ? gV[int64_t(c) * p.v_j_stride + d] : T(0);
    }
    __syncthreads();
    for (int key = 0; key < kKeys; ++key) {
      const int c = n0 + key;
      const T s = row_dot(q, &sK[key][sub * kDS], kDS);
      const bool ok = c < J && r < I && (!p.causal || c <= r + diag) &&
                      (!p.mask || p.mask[b * p.mask_b_stride + c * p.mask_j_stride]);
      if (!ok) continue;
      T x = fma(s, scale, offset);
      if (gBias) x += gBias[r * p.bias_i_stride + c * p.bias_j_stride];
      const T pe = exact_exp(x);
      l += pe;
#pragma unroll
      for (int k = 0; k < kDS; ++k) o[k] = fma(pe, sV[key][sub * kDS + k], o[k]);
    }
  }
  if (r >= I) return;
  const T inv = p.exp_kind ? T(1) : (l > T(0) ? T(1) / l : T(0));
  T* gO = static_cast<T*>(p.o) + b * p.o_b_stride + h * p.o_h_stride + int64_t(r) * p.o_i_stride;
#pragma unroll
  for (int k = 0; k < kDS; ++k) gO[sub * kDS + k] = o[k] * inv;
  if (sub == 0 && p.l) static_cast<T*>(p.l)[(int64_t(b) * p.H + h) * I + r] = l;
}

// dK, dV for 32 keys of one (b, kv head), summed over the group's query heads.
template <typename T, int D>
__global__ void __launch_bounds__(simt::kThreads) simt_dkdv_kernel(const BwdParams p) {
  using namespace simt;
  constexpr int kDS = D / kSub;
  __shared__ T sQ[kKeys][D], sdO[kKeys][D], sInvL[kKeys], sDelta[kKeys];
  const int tid = threadIdx.x, sub = tid % kSub;
  const int hkv = blockIdx.y, b = blockIdx.z, group = p.H / p.Hkv;
  const int I = p.I, J = p.J, diag = J - I;
  const int n0 = blockIdx.x * kRows, c = n0 + tid / kSub;
  const T* gK = static_cast<const T*>(p.k) + b * p.k_b_stride + hkv * p.k_h_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_b_stride + hkv * p.v_h_stride;
  const T scale = T(p.scale_d), offset = p.exp_kind ? T(0) : -T(p.scale_d);
  const bool key_ok = c < J && (!p.mask || p.mask[b * p.mask_b_stride + c * p.mask_j_stride]);

  T k[kDS], v[kDS], dk[kDS], dv[kDS];
#pragma unroll
  for (int e = 0; e < kDS; ++e) {
    k[e] = c < J ? gK[int64_t(c) * p.k_j_stride + sub * kDS + e] : T(0);
    v[e] = c < J ? gV[int64_t(c) * p.v_j_stride + sub * kDS + e] : T(0);
    dk[e] = dv[e] = 0;
  }
  const int r_start = p.causal ? max(0, n0 - diag) : 0;
  for (int hh = 0; hh < group; ++hh) {
    const int h = hkv * group + hh;
    const T* gQ = static_cast<const T*>(p.q) + b * p.q_b_stride + h * p.q_h_stride;
    const T* gdO = static_cast<const T*>(p.dout) + b * p.do_b_stride + h * p.do_h_stride;
    const T* gBias = p.bias ? static_cast<const T*>(p.bias) + (p.bias_batch_dim ? b : h) * p.bias_0_stride
                            : nullptr;
    for (int r0 = r_start; r0 < I; r0 += kKeys) {
      __syncthreads();
      for (int idx = tid; idx < kKeys * D; idx += kThreads) {
        const int row = idx / D, d = idx % D, r = r0 + row;
        sQ[row][d] = r < I ? gQ[int64_t(r) * p.q_i_stride + d] : T(0);
        sdO[row][d] = r < I ? gdO[int64_t(r) * p.do_i_stride + d] : T(0);
      }
      if (tid < kKeys) {
        const int r = r0 + tid;
        T inv_l = 0, delta = 0;
        if (r < I) {
          const int64_t row = (int64_t(b) * p.H + h) * I + r;
          if (p.exp_kind) {
            inv_l = 1;
          } else {
            const T l = static_cast<const T*>(p.l)[row];
            inv_l = l > T(0) ? T(1) / l : T(0);
            delta = static_cast<const T*>(p.delta)[row];
          }
        }
        sInvL[tid] = inv_l;
        sDelta[tid] = delta;
      }
      __syncthreads();
      for (int row = 0; row < kKeys; ++row) {
        const int r = r0 + row;
        const T s = row_dot(k, &sQ[row][sub * kDS], kDS);
        const T dp = row_dot(v, &sdO[row][sub * kDS], kDS);
        const bool ok = key_ok && r < I && (!p.causal || c <= r + diag);
        if (!ok) continue;
        T x = fma(s, scale, offset);
        if (gBias) x += gBias[r * p.bias_i_stride + c * p.bias_j_stride];
        const T pe = exact_exp(x) * sInvL[row];
        const T ds = pe * (dp - sDelta[row]);
#pragma unroll
        for (int e = 0; e < kDS; ++e) {
          dv[e] = fma(pe, sdO[row][sub * kDS + e], dv[e]);
          dk[e] = fma(ds, sQ[row][sub * kDS + e], dk[e]);
        }
      }
    }
  }
  if (c >= J) return;
  T* gdk = static_cast<T*>(p.dk) + b * p.dk_b_stride + hkv * p.dk_h_stride + int64_t(c) * p.dk_j_stride + sub * kDS;
  T* gdv = static_cast<T*>(p.dv) + b * p.dv_b_stride + hkv * p.dv_h_stride + int64_t(c) * p.dv_j_stride + sub * kDS;
#pragma unroll
  for (int e = 0; e < kDS; ++e) {
    gdk[e] = dk[e] * scale;
    gdv[e] = dv[e];
  }
}

// dQ for 32 query rows of one (b, h); dbias by atomics into the zeroed accumulator.
template <typename T, int D>
__global__ void __launch_bounds__(simt::kThreads) simt_dq_kernel(const BwdParams p) {
  using namespace simt;
  constexpr int kDS = D / kSub;
  __shared__ T sK[kKeys][D], sV[kKeys][D];
  const int tid = threadIdx.x, sub = tid % kSub;
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / (p.H / p.Hkv);
  const int I = p.I, J = p.J, diag = J - I;
  const int m0 = blockIdx.x * kRows, r = m0 + tid / kSub;
  const T* gQ = static_cast<const T*>(p.q) + b * p.q_b_stride + h * p.q_h_stride;
  const T* gdO = static_cast<const T*>(p.dout) + b * p.do_b_stride + h * p.do_h_stride;
  const T* gK = static_cast<const T*>(p.k) + b * p.k_b_stride + hkv * p.k_h_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_b_stride + hkv * p.v_h_stride;
  const int lead = p.bias_batch_dim ? b : h;
  const T* gBias = p.bias ? static_cast<const T*>(p.bias) + lead * p.bias_0_stride : nullptr;
  T* gdBias = p.bias ? static_cast<T*>(p.dbias_accum) +
                           (p.dbias_per_head ? int64_t(b) * p.H + h : int64_t(lead)) * I * J
                     : nullptr;
  const T scale = T(p.scale_d), offset = p.exp_kind ? T(0) : -T(p.scale_d);

  T q[kDS], dout[kDS], dq[kDS], inv_l = 0, delta = 0;
#pragma unroll
  for (int e = 0; e < kDS; ++e) {
    q[e] = r < I ? gQ[int64_t(r) * p.q_i_stride + sub * kDS + e] : T(0);
    dout[e] = r < I ? gdO[int64_t(r) * p.do_i_stride + sub * kDS + e] : T(0);
    dq[e] = 0;
  }
  if (r < I) {
    const int64_t row = (int64_t(b) * p.H + h) * I + r;
    if (p.exp_kind) {
      inv_l = 1;
    } else {
      const T l = static_cast<const T*>(p.l)[row];
      inv_l = l > T(0) ? T(1) / l : T(0);
      delta = static_cast<const T*>(p.delta)[row];
    }
  }
  const int n_end = p.causal ? min(J, m0 + kRows + diag) : J;
  for (int n0 = 0; n0 < n_end; n0 += kKeys) {
    __syncthreads();
    for (int idx = tid; idx < kKeys * D; idx += kThreads) {
      const int key = idx / D, d = idx % D, c = n0 + key;
      sK[key][d] = c < J ? gK[int64_t(c) * p.k_j_stride + d] : T(0);
      sV[key][d] = c < J ? gV[int64_t(c) * p.v_j_stride + d] : T(0);
    }
    __syncthreads();
    for (int key = 0; key < kKeys; ++key) {
      const int c = n0 + key;
      const T s = row_dot(q, &sK[key][sub * kDS], kDS);
      const T dp = row_dot(dout, &sV[key][sub * kDS], kDS);
      const bool ok = c < J && r < I && (!p.causal || c <= r + diag) &&
                      (!p.mask || p.mask[b * p.mask_b_stride + c * p.mask_j_stride]);
      if (!ok) continue;
      T x = fma(s, scale, offset);
      if (gBias) x += gBias[r * p.bias_i_stride + c * p.bias_j_stride];
      const T pe = exact_exp(x) * inv_l;
      const T ds = pe * (dp - delta);
#pragma unroll
      for (int e = 0; e < kDS; ++e) dq[e] = fma(ds, sK[key][sub * kDS + e], dq[e]);
      if (gdBias && sub == 0) atomicAdd(gdBias + int64_t(r) * J + c, ds);
    }
  }
  if (r >= I) return;
  T* gdQ = static_cast<T*>(p.dq) + ((int64_t(b) * p.H + h) * I + r) * D + sub * kDS;
#pragma unroll
  for (int e = 0; e < kDS; ++e) gdQ[e] = dq[e] * scale;
}

template <typename T, int D>
cudaError_t launch_simt_fwd(const FwdParams& p, cudaStream_t stream) {
  const dim3 grid((p.I + simt::kRows - 1) / simt::kRows, p.H, p.B);
  simt_fwd_kernel<T, D><<<grid, simt::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t launch_simt_bwd(const BwdParams& p, cudaStream_t stream) {
  if (!p.exp_kind) {
    const cudaError_t err = launch_delta<T, T>(p, stream);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid_kv((p.J + simt::kRows - 1) / simt::kRows, p.Hkv, p.B);
  simt_dkdv_kernel<T, D><<<grid_kv, simt::kThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const dim3 grid_q((p.I + simt::kRows - 1) / simt::kRows, p.H, p.B);
  simt_dq_kernel<T, D><<<grid_q, simt::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
