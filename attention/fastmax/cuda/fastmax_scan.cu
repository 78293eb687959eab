// Fused Fastmax moment scan (contract in attention/fastmax/cuda/fastmax.cuh).
//
// One CTA owns one head, 16 output columns e (an "e slice") and either a group of m values of the
// quadratic moment (type A) or the linear moments (type B):
//   type A: Z2^T[(m, e), r] = sum_j (y_jm w_je) y_jr lives in mma accumulators, one 16 x D tile
//           per m (rows e, cols r). The update is a GEMM U^T (16 x 64 j) x Y (64 j x D) whose
//           A operand U^T[e, j] = y_jm w_je is formed in registers; the query
//           H^T[(m, e), i] = sum_r Z2^T[(m, e), r] x_ir reuses the accumulator tile directly as
//           the A operand (the C -> A fragment identity of m16n8k16), then
//             out[i, e] += a2 sum_m x_im H[i, (m, e)]      gx[i, m] += 2 a2 sum_e g_ie H[i, (m, e)].
//   type B: the linear moments Z1^T[e, r] = sum_j w_je y_jr (one accumulator tile in warp 0, the
//           same update with y_m = 1) and Z0[e]: out += a0 Z0 + a1 x Z1 (the same query), and
//           gx += a1 g Z1^T as a small MMA of warps 1..4 on a bf16 copy of the tile in shared
//           memory. Causal: warps 1..4 also add the exact in-chunk part, S = X Y^T per 16-row
//           tile under the mask, out += f(S) W, gx += (f'(S) o G W^T) Y. p = 1 has type B CTAs only.
// bf16 operands are exact for x, y; the float32 values U and Z2 enter the MMAs rounded to bf16
// (relative error ~2^-9 per term, the rounding the plain bf16 definition applies to f(q k^T)), and
// the moments accumulate in float32. (Splitting them into bf16 hi + lo, two MMAs each, kept ~16
// bits at ~1.2x the kernel time; it was not needed for the tests' 2x-of-plain bound.)
// Partial sums of out (over m groups) and gx (over e slices, A and B) meet through float32 vector
// atomics (red.global.add.v4.f32 on sm_90), one per thread per 64-token chunk.
#include <cuda_bf16.h>

#include <type_traits>

#include "attention/fastmax/cuda/fastmax.cuh"
#include "attention/common/cuda/mma.cuh"

namespace flashcos::cuda {
namespace {

using T = __nv_bfloat16;

constexpr int kC = kFastmaxScanChunk;  // tokens per chunk
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kEw = 16;             // columns e per CTA
constexpr int kWPitch = kEw + 4;    // float pitch of the w / g / out tiles

template <int D>
struct ScanShape {
  static constexpr int kMPW = D == 64 ? 1 : 2;    // m values (accumulator tiles) per warp
  static constexpr int kMcta = kWarps * kMPW;      // m values per type-A CTA
  static constexpr int kMSlices = D / kMcta;       // type-A CTAs per e slice
  static constexpr int kPitch = D + 8;             // bf16 pitch of the x / y tiles
  static constexpr int kGPitch = D + 4;            // float pitch of the gx tile
  static constexpr size_t kSmem = 2 * 2 * kC * kPitch * sizeof(T) + 5 * kC * kWPitch * sizeof(float) +
                                  kC * kGPitch * sizeof(float) + kEw * kPitch * sizeof(T);
  static_assert(D % kMcta == 0, "m groups must tile the head dim");
  static_assert(kWarps > kC / 16, "type B needs warp 0 plus one warp per 16-row tile");
};

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[i][k] = 0.f;
}

// Two adjacent 16 x 8 accumulator tiles (columns k0 .. k0 + 15) as one bf16 A fragment with
// k = those columns: the C -> A fragment identity of m16n8k16.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);
  a[1] = pack2<T>(c0[2], c0[3]);
  a[2] = pack2<T>(c1[0], c1[1]);
  a[3] = pack2<T>(c1[2], c1[3]);
}

// One level of a warp reduce-scatter: lanes with bit O set keep the upper HALF of v, the others
// the lower, each adding the partner's copy (lane ^ O) of the half it keeps into v[0 .. HALF).
template <int HALF, int O, int N>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[N], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int k = 0; k < HALF; ++k) {
    const float send = upper ? v[k] : v[k + HALF];
    const float keep = upper ? v[k + HALF] : v[k];
    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}

__device__ __forceinline__ float bf(T v) { return __bfloat162float(v); }

// (kC x kEw) float tile, row pitch kWPitch; rows >= valid are zero-filled.
__device__ __forceinline__ void load_f32_tile(float* s, const float* g, int64_t stride, int valid, int tid) {
  const int row = tid / 4, c = tid % 4;  // kThreads == kC * 4
  const bool ok = row < valid;
  cp_async_16(s + row * kWPitch + c * 4, ok ? g + row * stride + c * 4 : g, ok);
}

template <int D>
__global__ void __launch_bounds__(kThreads, 2) fastmax_scan_kernel(const FastmaxScanParams p) {
  using S = ScanShape<D>;
  constexpr int P = S::kPitch, GP = S::kGPitch;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sb = reinterpret_cast<T*>(smem);
  float* sf = reinterpret_cast<float*>(smem + 2 * 2 * kC * P * sizeof(T));
  // Stage s (0, 1): x, y tiles at sb + (2 s, 2 s + 1) kC P; w, g tiles at sf + (2 s, 2 s + 1) kC kWPitch.
  auto sx = [&](int s) { return sb + 2 * s * kC * P; };
  auto sy = [&](int s) { return sb + (2 * s + 1) * kC * P; };
  auto sw = [&](int s) { return sf + 2 * s * kC * kWPitch; };
  auto sg = [&](int s) { return sf + (2 * s + 1) * kC * kWPitch; };
  float* s_out = sf + 4 * kC * kWPitch;
  float* s_gx = s_out + kC * kWPitch;
  T* s_z1t = reinterpret_cast<T*>(s_gx + kC * GP);  // (kEw, D) bf16, pitch P (type B)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g8 = lane / 4, t4 = lane % 4;
  const int per_e = (p.p == 2 ? S::kMSlices : 0) + 1;
  const int es = blockIdx.x / per_e, ms = blockIdx.x % per_e;
  const bool linear = ms == per_e - 1;
  const int e0 = es * kEw;
  const int64_t head = blockIdx.y;
  const T* gx_in = static_cast<const T*>(p.x) + head * p.lx * D;
  const T* gy_in = static_cast<const T*>(p.y) + head * p.ly * D;
  const float* gw = p.w + head * p.ly * p.ep + e0;
  const float* gg = p.g != nullptr ? p.g + head * p.lx * p.ep + e0 : nullptr;
  float* gout = p.out != nullptr ? p.out + head * p.lx * p.ep + e0 : nullptr;
  float* ggx = p.gx != nullptr ? p.gx + head * p.lx * D : nullptr;
  const bool want_gx = gg != nullptr && ggx != nullptr, want_out = gout != nullptr;
  const float a0 = p.a0, a1 = p.a1, a2 = p.a2;
  const int m_local0 = warp * S::kMPW;
  const int m_warp0 = ms * S::kMcta + m_local0;

  for (int i = tid; i < kC * kWPitch; i += kThreads) s_out[i] = 0.f;

  // x0 / y0 < 0: that operand is not needed in this phase.
  auto load = [&](int s, int x0, int y0) {
    if (x0 >= 0) {
      load_tile_async<kC, D, kThreads>(sx(s), gx_in + int64_t(x0) * D, D, p.lx - x0, gx_in, tid);
      if (want_gx) load_f32_tile(sg(s), gg + int64_t(x0) * p.ep, p.ep, p.lx - x0, tid);
    }
    if (y0 >= 0) {
      load_tile_async<kC, D, kThreads>(sy(s), gy_in + int64_t(y0) * D, D, p.ly - y0, gy_in, tid);
      load_f32_tile(sw(s), gw + int64_t(y0) * p.ep, p.ep, p.ly - y0, tid);
    }
    cp_async_commit();
  };

  float z[S::kMPW][D / 8][4];  // zeroed by the roles that use it (main_loop)

  // Z2^T tiles += U^T Y for one chunk of columns. kLin (type B, warp 0): one tile, Z1^T, with
  // y_m = 1 in U; Z0 accumulates in z0_lo / z0_hi (this lane's columns j, rows e = g8, g8 + 8).
  float z0_lo = 0.f, z0_hi = 0.f;
  auto update = [&](int s, auto lin) {
    constexpr bool kLin = decltype(lin)::value;
    constexpr int kTiles = kLin ? 1 : S::kMPW;
    const T* y = sy(s);
    const float* w = sw(s);
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) {
      const int j0 = kk * 16 + 2 * t4;
      const float w00 = w[j0 * kWPitch + g8], w01 = w[(j0 + 1) * kWPitch + g8];
      const float w02 = w[(j0 + 8) * kWPitch + g8], w03 = w[(j0 + 9) * kWPitch + g8];
      const float w10 = w[j0 * kWPitch + g8 + 8], w11 = w[(j0 + 1) * kWPitch + g8 + 8];
      const float w12 = w[(j0 + 8) * kWPitch + g8 + 8], w13 = w[(j0 + 9) * kWPitch + g8 + 8];
      if constexpr (kLin) {
        z0_lo += (w00 + w01) + (w02 + w03);
        z0_hi += (w10 + w11) + (w12 + w13);
      }
      uint32_t ua[kTiles][4];
#pragma unroll
      for (int mi = 0; mi < kTiles; ++mi) {
        const int m = m_warp0 + mi;
        float y0 = 1.f, y1 = 1.f, y2 = 1.f, y3 = 1.f;
        if constexpr (!kLin) {
          y0 = bf(y[j0 * P + m]);
          y1 = bf(y[(j0 + 1) * P + m]);
          y2 = bf(y[(j0 + 8) * P + m]);
          y3 = bf(y[(j0 + 9) * P + m]);
        }
        ua[mi][0] = pack2<T>(y0 * w00, y1 * w01);
        ua[mi][1] = pack2<T>(y0 * w10, y1 * w11);
        ua[mi][2] = pack2<T>(y2 * w02, y3 * w03);
        ua[mi][3] = pack2<T>(y2 * w12, y3 * w13);
      }
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t rY[4];
        ldmatrix_x4_trans(rY, y + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * P + np * 16 + (lane / 16) * 8);
#pragma unroll
        for (int mi = 0; mi < kTiles; ++mi) {
          mma_16816<T>(z[mi][2 * np], ua[mi], rY[0], rY[1]);
          mma_16816<T>(z[mi][2 * np + 1], ua[mi], rY[2], rY[3]);
        }
      }
    }
    if constexpr (kLin) {
      // Z1^T (after this chunk) as bf16 [e][r] for the gx GEMM of warps 1 .. kC / 16.
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        *reinterpret_cast<uint32_t*>(&s_z1t[g8 * P + nt * 8 + 2 * t4]) = pack2<T>(z[0][nt][0], z[0][nt][1]);
        *reinterpret_cast<uint32_t*>(&s_z1t[(g8 + 8) * P + nt * 8 + 2 * t4]) = pack2<T>(z[0][nt][2], z[0][nt][3]);
      }
    }
  };

  // H^T = Z2^T X^T for one chunk of rows, contracted into s_out / s_gx. kLin (type B, warp 0):
  // out = a0 Z0 + a1 H1 from the Z1^T tile (its gx part is lin_rows).
  auto query = [&](int s, auto lin) {
    constexpr bool kLin = decltype(lin)::value;
    constexpr int kTiles = kLin ? 1 : S::kMPW;
    const T* x = sx(s);
    const float* g = sg(s);
#pragma unroll
    for (int mi = 0; mi < kTiles; ++mi) {
      const int m = m_warp0 + mi;
      float h[kC / 8][4];
      zero(h);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t za[4];
        acc_to_a(za, z[mi][2 * kk], z[mi][2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < kC / 16; ++np) {
          uint32_t rX[4];
          ldmatrix_x4(rX, x + (np * 16 + lane % 8 + (lane / 16) * 8) * P + kk * 16 + ((lane / 8) % 2) * 8);
          mma_16816<T>(h[2 * np], za, rX[0], rX[1]);
          mma_16816<T>(h[2 * np + 1], za, rX[2], rX[3]);
        }
      }
      if constexpr (kLin) {
        if (want_out) {
          float z0a = z0_lo, z0b = z0_hi;
#pragma unroll
          for (int o = 1; o < 4; o *= 2) {
            z0a += __shfl_xor_sync(0xffffffffu, z0a, o);
            z0b += __shfl_xor_sync(0xffffffffu, z0b, o);
          }
          z0a *= a0;
          z0b *= a0;
#pragma unroll
          for (int nt = 0; nt < kC / 8; ++nt) {
            const int i0 = nt * 8 + 2 * t4;
            atomicAdd(&s_out[i0 * kWPitch + g8], z0a + a1 * h[nt][0]);
            atomicAdd(&s_out[(i0 + 1) * kWPitch + g8], z0a + a1 * h[nt][1]);
            atomicAdd(&s_out[i0 * kWPitch + g8 + 8], z0b + a1 * h[nt][2]);
            atomicAdd(&s_out[(i0 + 1) * kWPitch + g8 + 8], z0b + a1 * h[nt][3]);
          }
        }
        continue;
      }
      if (want_out) {
#pragma unroll
        for (int nt = 0; nt < kC / 8; ++nt) {
          const int i0 = nt * 8 + 2 * t4;
          const float x0 = a2 * bf(x[i0 * P + m]), x1 = a2 * bf(x[(i0 + 1) * P + m]);
          atomicAdd(&s_out[i0 * kWPitch + g8], x0 * h[nt][0]);
          atomicAdd(&s_out[(i0 + 1) * kWPitch + g8], x1 * h[nt][1]);
          atomicAdd(&s_out[i0 * kWPitch + g8 + 8], x0 * h[nt][2]);
          atomicAdd(&s_out[(i0 + 1) * kWPitch + g8 + 8], x1 * h[nt][3]);
        }
      }
      if (want_gx) {
        // v[2 nt + q]: this lane's e pair summed for row nt * 8 + 2 t4 + q; then a reduce-scatter
        // over the 8 lanes of one t4 (xor 16, 8, 4) leaves lane (g8, t4) the sums of rows
        // g8 * 8 + 2 t4 + {0, 1} over all 16 e.
        float v[kC / 4];
#pragma unroll
        for (int nt = 0; nt < kC / 8; ++nt) {
          const int i0 = nt * 8 + 2 * t4;
          v[2 * nt] = g[i0 * kWPitch + g8] * h[nt][0] + g[i0 * kWPitch + g8 + 8] * h[nt][2];
          v[2 * nt + 1] = g[(i0 + 1) * kWPitch + g8] * h[nt][1] + g[(i0 + 1) * kWPitch + g8 + 8] * h[nt][3];
        }
        reduce_scatter_step<kC / 8, 16>(v, lane);
        reduce_scatter_step<kC / 16, 8>(v, lane);
        reduce_scatter_step<kC / 32, 4>(v, lane);
        const int i0 = g8 * 8 + 2 * t4;
        s_gx[i0 * GP + m_local0 + mi] = 2.f * a2 * v[0];
        s_gx[(i0 + 1) * GP + m_local0 + mi] = 2.f * a2 * v[1];
      }
    }
  };

  // Type B, warps 1 .. kC / 16, one 16-row tile each (rows r0, r0 + 8 of the chunk):
  //   causal: the in-chunk part, S = X Y^T (16 x 64) under j <= i, out += f(S) W, gx += (f'(S) o G W^T) Y;
  //   with_state: gx[i, t] += a1 sum_e g_ie Z1[t, e], an MMA with B from the bf16 Z1^T tile.
  // All over this CTA's 16 columns e (gx sums over the e slices through the atomics).
  auto lin_rows = [&](int s, bool with_state) {
    const int wi = warp - 1;
    if (wi < 0 || wi >= kC / 16) return;
    const bool intra = p.causal;
    if (!intra && !want_gx) return;
    const T* x = sx(s);
    const T* y = sy(s);
    const float* w = sw(s);
    const float* g = sg(s);
    const int r0 = wi * 16 + g8;
    float gacc[D / 8][4];
    uint32_t ga[4] = {0u, 0u, 0u, 0u};  // G rows r0, r0 + 8 as an A fragment (k = e)
    if (want_gx) {
      ga[0] = pack2<T>(g[r0 * kWPitch + 2 * t4], g[r0 * kWPitch + 2 * t4 + 1]);
      ga[1] = pack2<T>(g[(r0 + 8) * kWPitch + 2 * t4], g[(r0 + 8) * kWPitch + 2 * t4 + 1]);
      ga[2] = pack2<T>(g[r0 * kWPitch + 2 * t4 + 8], g[r0 * kWPitch + 2 * t4 + 9]);
      ga[3] = pack2<T>(g[(r0 + 8) * kWPitch + 2 * t4 + 8], g[(r0 + 8) * kWPitch + 2 * t4 + 9]);
    }
    if (intra) {
      float sc[kC / 8][4];
      zero(sc);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ra[4];
        ldmatrix_x4(ra, x + (wi * 16 + lane % 16) * P + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int np = 0; np < kC / 16; ++np) {
          uint32_t rb[4];
          ldmatrix_x4(rb, y + (np * 16 + lane % 8 + (lane / 16) * 8) * P + kk * 16 + ((lane / 8) % 2) * 8);
          mma_16816<T>(sc[2 * np], ra, rb[0], rb[1]);
          mma_16816<T>(sc[2 * np + 1], ra, rb[2], rb[3]);
        }
      }
      // P = f(S) under the mask as A fragments; sc becomes f'(S) under the mask.
      uint32_t pa[kC / 16][4];
#pragma unroll
      for (int np = 0; np < kC / 16; ++np) {
        float pv[2][4];
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int nt = 2 * np + h2;
            const int i = r0 + (k / 2) * 8, j = nt * 8 + 2 * t4 + (k % 2);
            const float sv = sc[nt][k];
            const bool on = j <= i;
            pv[h2][k] = on ? a0 + sv * (a1 + a2 * sv) : 0.f;
            sc[nt][k] = on ? a1 + 2.f * a2 * sv : 0.f;
          }
        acc_to_a(pa[np], pv[0], pv[1]);
      }
      if (want_out) {
        float o[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          const int j0 = kk * 16 + 2 * t4;
#pragma unroll
          for (int et = 0; et < 2; ++et) {
            const int e = et * 8 + g8;
            const uint32_t b0 = pack2<T>(w[j0 * kWPitch + e], w[(j0 + 1) * kWPitch + e]);
            const uint32_t b1 = pack2<T>(w[(j0 + 8) * kWPitch + e], w[(j0 + 9) * kWPitch + e]);
            mma_16816<T>(o[et], pa[kk], b0, b1);
          }
        }
#pragma unroll
        for (int et = 0; et < 2; ++et) {
          const int e = et * 8 + 2 * t4;
          atomicAdd(&s_out[r0 * kWPitch + e], o[et][0]);
          atomicAdd(&s_out[r0 * kWPitch + e + 1], o[et][1]);
          atomicAdd(&s_out[(r0 + 8) * kWPitch + e], o[et][2]);
          atomicAdd(&s_out[(r0 + 8) * kWPitch + e + 1], o[et][3]);
        }
      }
      zero(gacc);
      if (want_gx) {
        // dA = G W^T over this slice's e, then dS = f'(S) dA, gx += dS Y.
#pragma unroll
        for (int nt = 0; nt < kC / 8; ++nt) {
          const int j = nt * 8 + g8;
          const uint32_t b0 = pack2<T>(w[j * kWPitch + 2 * t4], w[j * kWPitch + 2 * t4 + 1]);
          const uint32_t b1 = pack2<T>(w[j * kWPitch + 2 * t4 + 8], w[j * kWPitch + 2 * t4 + 9]);
          float da[4] = {0.f, 0.f, 0.f, 0.f};
          mma_16816<T>(da, ga, b0, b1);
#pragma unroll
          for (int k = 0; k < 4; ++k) sc[nt][k] *= da[k];
        }
#pragma unroll
        for (int kk = 0; kk < kC / 16; ++kk) {
          uint32_t da_frag[4];
          acc_to_a(da_frag, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
          for (int np = 0; np < D / 16; ++np) {
            uint32_t rY[4];
            ldmatrix_x4_trans(rY, y + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * P + np * 16 + (lane / 16) * 8);
            mma_16816<T>(gacc[2 * np], da_frag, rY[0], rY[1]);
            mma_16816<T>(gacc[2 * np + 1], da_frag, rY[2], rY[3]);
          }
        }
      }
    }
    if (!want_gx) return;
    if (!intra) zero(gacc);
    if (with_state) {
      uint32_t a[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ga[k]));
        a[k] = pack2<T>(a1 * f.x, a1 * f.y);
      }
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t rB[4];
        ldmatrix_x4_trans(rB, s_z1t + (lane % 8 + ((lane / 8) % 2) * 8) * P + np * 16 + (lane / 16) * 8);
        mma_16816<T>(gacc[2 * np], a, rB[0], rB[1]);
        mma_16816<T>(gacc[2 * np + 1], a, rB[2], rB[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int t0 = nt * 8 + 2 * t4;
      s_gx[r0 * GP + t0] = gacc[nt][0];
      s_gx[r0 * GP + t0 + 1] = gacc[nt][1];
      s_gx[(r0 + 8) * GP + t0] = gacc[nt][2];
      s_gx[(r0 + 8) * GP + t0 + 1] = gacc[nt][3];
    }
  };
  const std::true_type kLinT{};
  const std::false_type kQuadT{};
  // Roles: 0 type A, 1 type B warp 0 (linear state), 2 type B warps 1.. (rows). Each role runs its
  // own copy of the loops below, so the state registers are live only where they are used.
  using RoleA = std::integral_constant<int, 0>;
  using RoleLin = std::integral_constant<int, 1>;
  using RoleRows = std::integral_constant<int, 2>;
  // One chunk's query / update (with_state false: causal chunk 0).
  auto do_query = [&](int s, bool with_state, auto role) {
    constexpr int R = decltype(role)::value;
    if constexpr (R == 0) query(s, kQuadT);
    else if constexpr (R == 1) { if (with_state) query(s, kLinT); }
    else lin_rows(s, with_state);
  };
  auto do_update = [&](int s, auto role) {
    constexpr int R = decltype(role)::value;
    if constexpr (R == 0) update(s, kQuadT);
    else if constexpr (R == 1) update(s, kLinT);
  };

  // Adds the chunk's partial sums (rows x0 ..) to global memory and clears s_out.
  auto flush = [&](int x0) {
    if (want_out) {
      const int row = tid / 4, c = tid % 4;
      const float4 v = *reinterpret_cast<const float4*>(&s_out[row * kWPitch + c * 4]);
      if (x0 + row < p.lx) atomic_add4(gout + int64_t(x0 + row) * p.ep + c * 4, v);
      *reinterpret_cast<float4*>(&s_out[row * kWPitch + c * 4]) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (want_gx) {
      const int cols = linear ? D : S::kMcta, col0 = linear ? 0 : ms * S::kMcta;
      for (int idx = tid; idx < kC * cols / 4; idx += kThreads) {
        const int row = idx / (cols / 4), c = idx % (cols / 4);
        if (x0 + row < p.lx)
          atomic_add4(ggx + int64_t(x0 + row) * D + col0 + c * 4,
                      *reinterpret_cast<const float4*>(&s_gx[row * GP + c * 4]));
      }
    }
  };

  auto main_loop = [&](auto role) {
    if constexpr (decltype(role)::value != 2) {
#pragma unroll
      for (int mi = 0; mi < S::kMPW; ++mi) zero(z[mi]);
    }
    if (p.causal) {
      const int nc = p.lx / kC;
      load(0, 0, 0);
      for (int c = 0; c < nc; ++c) {
        if (c + 1 < nc) {
          load((c + 1) & 1, (c + 1) * kC, (c + 1) * kC);
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();
        const int s = c & 1;
        // Type A has nothing to add at chunk 0 (the state is empty); type B has the in-chunk part.
        if (c > 0 || linear) do_query(s, c > 0, role);
        if (linear) __syncthreads();  // s_z1t is read by lin_rows before warp 0 overwrites it
        do_update(s, role);
        __syncthreads();
        if (c > 0 || linear) flush(c * kC);
      }
    } else {
      const int ny = (p.ly + kC - 1) / kC, nx = (p.lx + kC - 1) / kC;
      load(0, -1, 0);
      for (int c = 0; c < ny; ++c) {
        if (c + 1 < ny) {
          load((c + 1) & 1, -1, (c + 1) * kC);
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();
        do_update(c & 1, role);
        __syncthreads();
      }
      load(0, 0, -1);
      for (int c = 0; c < nx; ++c) {
        if (c + 1 < nx) {
          load((c + 1) & 1, (c + 1) * kC, -1);
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();
        do_query(c & 1, true, role);
        __syncthreads();
        flush(c * kC);
      }
    }
  };
  if (!linear) main_loop(RoleA{});
  else if (warp == 0) main_loop(RoleLin{});
  else main_loop(RoleRows{});
}

template <int D>
cudaError_t launch(const FastmaxScanParams& p, cudaStream_t stream) {
  using S = ScanShape<D>;
  const int per_e = (p.p == 2 ? S::kMSlices : 0) + 1;
  const dim3 grid(unsigned(p.ep / kEw * per_e), unsigned(p.n));
  return launch_with_smem(fastmax_scan_kernel<D>, grid, kThreads, S::kSmem, stream, p);
}

}  // namespace

bool fastmax_scan_supported(int d) { return d == 16 || d == 32 || d == 64; }

cudaError_t launch_fastmax_scan(const FastmaxScanParams& p, cudaStream_t stream) {
  if (p.n == 0 || p.lx == 0) return cudaSuccess;
  if (p.ep % kEw != 0 || p.n > 65535 || (p.p != 1 && p.p != 2) || (p.g != nullptr && p.gx == nullptr) ||
      (p.causal && (p.lx != p.ly || p.lx % kC != 0)))
    return cudaErrorInvalidValue;
  switch (p.d) {
    case 16: return launch<16>(p, stream);
    case 32: return launch<32>(p, stream);
    case 64: return launch<64>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace flashcos::cuda
