// Fused l2norm forward / backward (attention/l2norm/cuda/l2norm.h). One thread per 8 elements; the
// gs / 8 threads of a group sit side by side in one warp and reduce with xor shuffles.
//   forward:  y = x r, r = 1 / max(|x_g|, eps);  with rotary, out = R(t) y
//   backward: g = R(t)^T dout (with rotary, else g = dout);  dx = s r (g - y sum_g(g y)), s = dy_scale
// R(t) on the pair (a, b) = (2m, 2m + 1) of a group, angle th = t * inv_freq[m]:
//   (a, b) -> (a cos th - b sin th, a sin th + b cos th);  R^T: (a cos th + b sin th, -a sin th + b cos th).
// A thread's 8 elements are 4 whole pairs (groups start at multiples of 8), so no shuffles are
// needed; the block copies inv_freq into shared memory once, cos / sin come from sincosf on the
// fp32 angle (no cos / sin tables in memory).
#include "attention/l2norm/cuda/l2norm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashcos::cuda {
namespace {

constexpr int kVec = 8;
constexpr int kThreads = 256;

struct Vec8 {
  float v[kVec];
};

__device__ __forceinline__ Vec8 load8(const NormTensor& t, int64_t off) {
  Vec8 out;
  if (t.dtype == DType::kFloat) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(t.ptr) + off);
    const float4 a = p[0], b = p[1];
    out.v[0] = a.x, out.v[1] = a.y, out.v[2] = a.z, out.v[3] = a.w;
    out.v[4] = b.x, out.v[5] = b.y, out.v[6] = b.z, out.v[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(t.ptr) + off);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (t.dtype == DType::kHalf) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        out.v[2 * i] = f.x, out.v[2 * i + 1] = f.y;
      } else {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
        out.v[2 * i] = f.x, out.v[2 * i + 1] = f.y;
      }
    }
  }
  return out;
}

__device__ __forceinline__ void store8(const NormTensor& t, int64_t off, const Vec8& in) {
  if (t.dtype == DType::kFloat) {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(const_cast<void*>(t.ptr)) + off);
    p[0] = make_float4(in.v[0], in.v[1], in.v[2], in.v[3]);
    p[1] = make_float4(in.v[4], in.v[5], in.v[6], in.v[7]);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (t.dtype == DType::kHalf) {
        const __half2 h = __floats2half2_rn(in.v[2 * i], in.v[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(in.v[2 * i], in.v[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(const_cast<void*>(t.ptr)) + off) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

__device__ __forceinline__ int64_t offset(const NormTensor& t, int64_t i0, int64_t i1, int64_t i2, int col) {
  return i0 * t.s0 + i1 * t.s1 + i2 * t.s2 + col;
}

// Sum over the `width` (power of two) lanes of an aligned lane group. Every lane of the warp calls it.
__device__ __forceinline__ float group_sum(float v, int width) {
  for (int m = 1; m < width; m <<= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

struct Coord {
  bool active;
  int64_t i0, i1, i2;
  int col, group;
};

// The thread's row (i0, i1, i2) and column. Index is uint32_t when every row index fits (the usual
// case): 64-bit divisions cost ~10x the 32-bit ones and dominated the forward's time.
template <typename Index>
__device__ __forceinline__ Coord coord(const L2NormParams& p) {
  const Index t = Index(blockIdx.x) * Index(blockDim.x) + Index(threadIdx.x);
  const Index per_row = Index(p.D / kVec);
  const Index n1 = Index(p.n1), n2 = Index(p.n2);
  const Index rows = Index(p.n0) * n1 * n2;
  Coord c;
  c.active = t < rows * per_row;
  const Index row = c.active ? t / per_row : 0;
  c.col = int(t - row * per_row) * kVec;
  c.group = c.col / (p.D / p.groups);
  const Index q = row / n2;
  c.i2 = int64_t(row - q * n2);
  c.i1 = int64_t(q % n1);
  c.i0 = int64_t(q / n1);
  return c;
}

__device__ __forceinline__ int64_t r_index(const L2NormParams& p, const Coord& c) {
  return ((c.i0 * p.n1 + c.i1) * p.n2 + c.i2) * p.groups + c.group;
}

// rotary_table[i2 * pairs + m] = (cos, sin) of the angle float(i2 + pos_offset) * inv_freq[m], in
// fp32 (sincosf), one thread per entry. The main kernels read their thread's 4 rotations from it:
// evaluated there, the four sincosf per thread cost about as much as the kernel's memory traffic.
__global__ void __launch_bounds__(kThreads) rotary_table_kernel(const L2NormParams p) {
  const int pairs = p.D / p.groups / 2;
  const int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (k >= p.n2 * pairs) return;
  float sn, cs;
  sincosf(__fmul_rn(static_cast<float>(k / pairs + p.pos_offset), p.inv_freq[k % pairs]), &sn, &cs);
  p.rotary_table[k] = make_float2(cs, sn);
}

// Rotates the thread's 4 pairs by R(t) (transpose: R(t)^T), R(t) from the rotation table.
__device__ __forceinline__ void rotate(Vec8& v, const L2NormParams& p, const Coord& c, bool transpose) {
  const int gs = p.D / p.groups;
  const int m0 = (c.col % gs) / 2;
  // The 4 (cos, sin) pairs: 32 bytes, 32-byte aligned (m0 is a multiple of 4).
  const float4* table = reinterpret_cast<const float4*>(p.rotary_table + c.i2 * (gs / 2) + m0);
  const float4 t4[2] = {table[0], table[1]};
#pragma unroll
  for (int e = 0; e < kVec / 2; ++e) {
    const float cs = e % 2 == 0 ? t4[e / 2].x : t4[e / 2].z;
    float sn = e % 2 == 0 ? t4[e / 2].y : t4[e / 2].w;
    if (transpose) sn = -sn;
    const float a = v.v[2 * e], b = v.v[2 * e + 1];
    v.v[2 * e] = a * cs - b * sn;
    v.v[2 * e + 1] = a * sn + b * cs;
  }
}

template <typename Index>
__global__ void __launch_bounds__(kThreads) l2norm_fwd_kernel(const L2NormParams p) {
  const Coord c = coord<Index>(p);
  const int width = p.D / p.groups / kVec;
  Vec8 x{};
  if (c.active) x = load8(p.x, offset(p.x, c.i0, c.i1, c.i2, c.col));
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < kVec; ++e) ss += x.v[e] * x.v[e];
  ss = group_sum(ss, width);
  const float r = rsqrtf(fmaxf(ss, p.eps * p.eps));
  if (!c.active) return;
#pragma unroll
  for (int e = 0; e < kVec; ++e) x.v[e] *= r;
  if (p.rotary) rotate(x, p, c, /*transpose=*/false);
  store8(p.y, offset(p.y, c.i0, c.i1, c.i2, c.col), x);
  if (c.col % (width * kVec) == 0) p.r[r_index(p, c)] = r;
}

template <typename Index>
__global__ void __launch_bounds__(kThreads) l2norm_bwd_kernel(const L2NormParams p) {
  const Coord c = coord<Index>(p);
  const int width = p.D / p.groups / kVec;
  Vec8 x{}, dy{};
  float r = 0.f;
  if (c.active) {
    x = load8(p.x, offset(p.x, c.i0, c.i1, c.i2, c.col));
    dy = load8(p.dy, offset(p.dy, c.i0, c.i1, c.i2, c.col));
    r = p.r[r_index(p, c)];
    if (p.rotary) rotate(dy, p, c, /*transpose=*/true);
  }
  float s = 0.f, ss = 0.f;
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    s += dy.v[e] * (x.v[e] * r);
    ss += x.v[e] * x.v[e];
  }
  s = group_sum(s, width);
  ss = group_sum(ss, width);
  if (!c.active) return;
  // Where the norm was clamped to eps, y = x r is not on the sphere and the projection term is
  // dropped (dx = r dy), as in the libtorch path.
  const float proj = ss > p.eps * p.eps ? s : 0.f;
  const float rs = r * p.dy_scale;  // dx is linear in dy
#pragma unroll
  for (int e = 0; e < kVec; ++e) dy.v[e] = rs * (dy.v[e] - x.v[e] * r * proj);
  store8(p.dx, offset(p.dx, c.i0, c.i1, c.i2, c.col), dy);
}

cudaError_t fill_rotary_table(const L2NormParams& p, cudaStream_t stream) {
  const int64_t entries = p.n2 * (p.D / p.groups / 2);
  if (entries == 0) return cudaSuccess;
  if ((entries + kThreads - 1) / kThreads > 0x7fffffff) return cudaErrorInvalidValue;
  rotary_table_kernel<<<unsigned((entries + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch(void (*kernel32)(L2NormParams), void (*kernel64)(L2NormParams), const L2NormParams& p,
                   cudaStream_t stream) {
  const int64_t threads = p.n0 * p.n1 * p.n2 * (p.D / kVec);
  if (threads == 0) return cudaSuccess;
  if (p.rotary && !p.rotary_table_filled) {
    const cudaError_t e = fill_rotary_table(p, stream);
    if (e != cudaSuccess) return e;
  }
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  // 32-bit indices while the last thread's index (blocks * kThreads) fits.
  const bool narrow = blocks * kThreads <= int64_t(UINT32_MAX);
  (narrow ? kernel32 : kernel64)<<<unsigned(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool l2norm_aligned(const NormTensor& t) {
  return t.dtype != DType::kDouble && reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && t.s0 % kVec == 0 && t.s1 % kVec == 0 && t.s2 % kVec == 0;
}

bool l2norm_supported(const L2NormParams& p) {
  if (p.groups < 1 || p.D < kVec || p.D % p.groups != 0) return false;
  const int gs = p.D / p.groups;
  const int width = gs / kVec;
  if (p.rotary && (gs / 2 > kMaxRotaryPairs || p.rotary_table == nullptr ||
                   reinterpret_cast<uintptr_t>(p.rotary_table) % 32 != 0)) {
    return false;
  }
  return gs % kVec == 0 && width <= 32 && (width & (width - 1)) == 0 && l2norm_aligned(p.x);
}

cudaError_t run_l2norm_fwd(const L2NormParams& p, cudaStream_t stream) {
  if (!l2norm_supported(p) || !l2norm_aligned(p.y) || p.r == nullptr) return cudaErrorInvalidValue;
  return launch(l2norm_fwd_kernel<uint32_t>, l2norm_fwd_kernel<uint64_t>, p, stream);
}

cudaError_t run_rotary_table(const L2NormParams& p, cudaStream_t stream) {
  if (!p.rotary || p.groups < 1 || p.D % p.groups != 0 || (p.D / p.groups) % 2 != 0 ||
      p.D / p.groups / 2 > kMaxRotaryPairs || p.rotary_table == nullptr) {
    return cudaErrorInvalidValue;
  }
  return fill_rotary_table(p, stream);
}

cudaError_t run_l2norm_bwd(const L2NormParams& p, cudaStream_t stream) {
  if (!l2norm_supported(p) || !l2norm_aligned(p.dy) || !l2norm_aligned(p.dx) || p.r == nullptr) return cudaErrorInvalidValue;
  return launch(l2norm_bwd_kernel<uint32_t>, l2norm_bwd_kernel<uint64_t>, p, stream);
}

}  // namespace flashcos::cuda
