// Forward of cosine-sim attention on tensor cores (sm_80+ mma.sync), fp16 / bf16 inputs.
//
//   S = Q K^T (fp32)   P = exp2(S scale log2e + offset + bias log2e)   l = rowsum(P)   O = P V / l
// offset = -scale log2e for the cosine kind (every logit <= bias, so no running row max and no
// rescaling of O), 0 for the exp kind (no l). Masked / non-causal / out-of-range keys give P = 0;
// a row with nothing to attend has l = 0 and writes o = 0.
// o is normalised by the sum of P after its rounding to the 16-bit type (on the tensor cores, P
// times ones), the P that P V multiplies, so o is the exact weighted mean of v for those weights
// (one key: o = v); the l saved for the backward is the fp32 sum of the unrounded P.
// Dynamic range: P goes to P V as fp16 / bf16. exp(scale (cos - 1)) spans 2 scale log2e binades.
// fp16 (normal down to 2^-14) adds a fixed 2^15 to P (l scaled back on the way out), which
// covers scale <= 10; for larger scales or with a bias, fp16 uses the kOnline variant, which
// keeps a running row max m (FlashAttention's online softmax: O, l rescaled when m grows).
// bf16 has fp32's exponent range and takes kOnline only past scale 34 (P < 2^-100).
//
// One CTA owns kBM = 16 kMT kWarps query rows of one (b, h) and streams K, V tiles of kBN keys
// through a two-stage cp.async pipeline. Each warp keeps S (rS) and O (rO) in registers, and its
// Q fragments too where the tile says so (else it re-reads them from shared memory each k-step);
// P never leaves registers (the S accumulator is repacked as the A operand of P V).
#pragma once

#include <type_traits>

#include "attention/common/cuda/mma.cuh"
#include "attention/cosine/cuda/params.h"
#include "attention/cosine/cuda/tuning.h"

namespace flashcos::cuda {

// Tile shapes per head dim and variant (H100, b4 h8 n8192 bf16; docs/kernels-tried.md has the timings).
// Variant 0 is the shape in use; 1..3 are compiled only in FLASHCOS_TUNING builds (tuning.h).
//   warps, m-tiles of 16 rows per warp, keys per pipeline stage, Q fragments held in registers
//   for the whole key loop (else re-read from shared memory each k-step, which frees registers),
//   and the minimum resident CTAs per SM asked of the register allocator (__launch_bounds__).
struct FwdShape {
  int warps, m_tiles, keys;
  bool q_in_regs;
  int min_blocks;
};
template <int D>
constexpr FwdShape fwd_shape(int variant) {
  if (D == 64) {
    // 0: 2 m-tiles halve the K / V reads per mma: 292 vs 242 TFLOP/s with 1 (40 bytes of spills).
    constexpr FwdShape v[] = {
        {4, 2, 64, true, 1}, {4, 2, 64, false, 1}, {4, 2, 32, false, 1}, {4, 1, 64, false, 4}};
    return v[variant];
  }
  if (D == 128) {
    // 0: 2 m-tiles per warp, Q re-read from shared memory, 48 keys per stage (180 bytes of
    // spills): 311 / 272 TFLOP/s vs 299 / 260 with 32 keys (variant 1) and 250 / 241 with the
    // earlier 1 m-tile, Q in registers, 64 keys (variant 3).
    constexpr FwdShape v[] = {
        {4, 2, 48, false, 1}, {4, 2, 32, false, 1}, {8, 2, 32, false, 1}, {4, 1, 64, true, 1}};
    return v[variant];
  }
  return {4, D <= 64 ? 2 : 1, 64, true, 1};
}

template <int D, int V = 0>
struct FwdTile {
  static constexpr FwdShape kShape = fwd_shape<D>(V);
  static constexpr int kWarps = kShape.warps;
  static constexpr int kMT = kShape.m_tiles;
  static constexpr int kBN = kShape.keys;
  static constexpr bool kQInRegs = kShape.q_in_regs;
  static constexpr int kMinBlocks = kShape.min_blocks;
  static constexpr int kBM = 16 * kMT * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPitch = D + 8;
  static constexpr size_t smem_bytes(size_t elem) {
    return (size_t(kBM) + 4 * kBN) * kPitch * elem;
  }
};

// log2 of the fixed factor on P in the non-online cosine path: 2^15 keeps fp16 P normal for
// scale <= (14 + 15) / (2 log2e) = 10.05 and below 2^15 < 65504 (no bias in that path).
template <typename T>
constexpr float kFwdShiftLog2 = std::is_same_v<T, __half> ? 15.f : 0.f;

// A row's sum over the four threads of a quad, which hold its columns in the mma fragments (the
// Hopper epilogue too, hopper/fwd_epilogue.cuh).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <typename T, int D, int V, bool kOnline>
__global__ void __launch_bounds__(FwdTile<D, V>::kThreads, FwdTile<D, V>::kMinBlocks)
    fwd_kernel(const FwdParams p) {
  using Tile = FwdTile<D, V>;
  constexpr bool kQInRegs = Tile::kQInRegs;
  constexpr int kMT = Tile::kMT, kBN = Tile::kBN, kBM = Tile::kBM;
  constexpr int kThreads = Tile::kThreads, kPitch = Tile::kPitch;
  constexpr int kKT = D / 16;   // k-steps of Q K^T
  constexpr int kNT = kBN / 8;  // n8 tiles of S
  constexpr int kDT = D / 8;    // n8 tiles of O

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (kBM, kPitch)
  T* sK = sQ + kBM * kPitch;               // (2, kBN, kPitch)
  T* sV = sK + 2 * kBN * kPitch;           // (2, kBN, kPitch)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest causal blocks first
  const int h = blockIdx.y, b = blockIdx.z;
  const int hkv = h / (p.H / p.Hkv);
  const int I = p.I, J = p.J;
  const int diag = J - I;  // causal: query r sees keys c <= r + diag
  const int m0 = m_block * kBM;
  const int warp_row0 = m0 + warp * kMT * 16;

  const T* gQ = static_cast<const T*>(p.q) + b * p.q_b_stride + h * p.q_h_stride;  // (I, D)
  const T* gK = static_cast<const T*>(p.k) + b * p.k_b_stride + hkv * p.k_h_stride;  // (J, D)
  const T* gV = static_cast<const T*>(p.v) + b * p.v_b_stride + hkv * p.v_h_stride;  // (J, D)

  const int n_end = p.causal ? min(J, m0 + kBM + diag) : J;
  const int n_blocks = n_end > 0 ? (n_end + kBN - 1) / kBN : 0;

  load_tile_async<kBM, D, kThreads>(sQ, gQ + int64_t(m0) * p.q_i_stride, p.q_i_stride, I - m0,
                                    gQ, tid);
  if (n_blocks > 0) {
    load_tile_async<kBN, D, kThreads>(sK, gK, p.k_j_stride, J, gK, tid);
    load_tile_async<kBN, D, kThreads>(sV, gV, p.v_j_stride, J, gV, tid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // This lane's ldmatrix row address of Q's m-tile mt, k-step kk.
  auto q_frag = [&](int mt, int kk) {
    return sQ + (warp * kMT * 16 + mt * 16 + lane % 16) * kPitch + kk * 16 + (lane / 16) * 8;
  };
  uint32_t rQ[kQInRegs ? kMT : 1][kQInRegs ? kKT : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk) ldmatrix_x4(rQ[mt][kk], q_frag(mt, kk));
  }

  float rO[kMT][kDT][4];
  // Row sums of the 16-bit P by the tensor cores: P (16 x 16) times a ones (16 x 8) B operand
  // gives every column the row sum, so rL[mt][0] is row g's l and rL[mt][2] row g + 8's, with no
  // shuffles, and l sums exactly the rounded P that P V uses.
  // rLt: the fp32 row sums of the unrounded P (this thread's columns), stored as l for the
  // backward, which recomputes P = exp(logit) / l in fp32 (one key: P = 1 exactly there too).
  float rL[kMT][4];
  float rLt[kMT][2];
  float rM[kMT][2];  // kOnline: running row max of the log2 logits (-inf: nothing seen yet)
  const uint32_t kOnes = pack2<T>(1.f, 1.f);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    rL[mt][0] = rL[mt][1] = rL[mt][2] = rL[mt][3] = 0.f;
    rLt[mt][0] = rLt[mt][1] = 0.f;
    rM[mt][0] = rM[mt][1] = -INFINITY;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) rO[mt][dt][0] = rO[mt][dt][1] = rO[mt][dt][2] = rO[mt][dt][3] = 0.f;
  }

  const float scale_log2 = p.scale * kLog2e;
  const float offset_log2 = p.exp_kind ? 0.f : kOnline ? -scale_log2 : kFwdShiftLog2<T> - scale_log2;
  const bool has_mask = p.mask != nullptr, has_bias = p.bias != nullptr;
  const float* gBias = nullptr;  // (I, J) slice of this (b, h)
  if (has_bias)
    gBias = static_cast<const float*>(p.bias) + (p.bias_batch_dim ? b : h) * p.bias_0_stride;

  for (int j = 0; j < n_blocks; ++j) {
    const int stage = j & 1;
    if (j + 1 < n_blocks) {
      const int n1 = (j + 1) * kBN;
      T* sK1 = sK + (stage ^ 1) * kBN * kPitch;
      T* sV1 = sV + (stage ^ 1) * kBN * kPitch;
      load_tile_async<kBN, D, kThreads>(sK1, gK + int64_t(n1) * p.k_j_stride, p.k_j_stride,
                                        J - n1, gK, tid);
      load_tile_async<kBN, D, kThreads>(sV1, gV + int64_t(n1) * p.v_j_stride, p.v_j_stride,
                                        J - n1, gV, tid);
      cp_async_commit();
    }
    const T* sKs = sK + stage * kBN * kPitch;
    const T* sVs = sV + stage * kBN * kPitch;

    // S = Q K^T
    float rS[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) rS[mt][nt][0] = rS[mt][nt][1] = rS[mt][nt][2] = rS[mt][nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKT; ++kk) {
      uint32_t rA[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) rA[mt][e] = rQ[mt][kk][e];
        } else {
          ldmatrix_x4(rA[mt], q_frag(mt, kk));
        }
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t rK[4];
        ldmatrix_x4(rK, sKs + (np * 16 + lane % 8 + (lane / 16) * 8) * kPitch + kk * 16 +
                            ((lane / 8) % 2) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(rS[mt][2 * np], rA[mt], rK[0], rK[1]);
          mma_16816<T>(rS[mt][2 * np + 1], rA[mt], rK[2], rK[3]);
        }
      }
    }

    // P = exp2(logit in log2 units); kOnline first keeps the logits (-inf where P = 0).
    const int n0 = j * kBN;
    const bool elementwise = has_mask || has_bias || n0 + kBN > J ||
                             (p.causal && n0 + kBN - 1 > m0 + diag);
    if (!elementwise) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float x = fmaf(rS[mt][nt][e], scale_log2, offset_log2);
            if constexpr (kOnline) {
              rS[mt][nt][e] = x;
            } else {
              const float pe = fast_exp2(x);
              rS[mt][nt][e] = pe;
              rLt[mt][e / 2] += pe;
            }
          }
    } else {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1) {
          const int c = n0 + nt * 8 + 2 * t + e1;
          const bool key_ok = c < J && (!has_mask || p.mask[b * p.mask_b_stride + c * p.mask_j_stride]);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int e0 = 0; e0 < 2; ++e0) {
              const int r = warp_row0 + mt * 16 + g + 8 * e0;
              const bool ok = key_ok && r < I && (!p.causal || c <= r + diag);
              float x = fmaf(rS[mt][nt][2 * e0 + e1], scale_log2, offset_log2);
              if (has_bias && ok) x = fmaf(gBias[r * p.bias_i_stride + c * p.bias_j_stride], kLog2e, x);
              if constexpr (kOnline) {
                rS[mt][nt][2 * e0 + e1] = ok ? x : -INFINITY;
              } else {
                const float pe = ok ? fast_exp2(x) : 0.f;
                rS[mt][nt][2 * e0 + e1] = pe;
                rLt[mt][e0] += pe;
              }
            }
        }
    }
    if constexpr (kOnline) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int e0 = 0; e0 < 2; ++e0) {
          float tmax = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) tmax = fmaxf(tmax, fmaxf(rS[mt][nt][2 * e0], rS[mt][nt][2 * e0 + 1]));
          tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
          tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
          const float m_new = fmaxf(rM[mt][e0], tmax);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no finite logit yet: P = 0
          const float alpha = fast_exp2(rM[mt][e0] - m_use);     // exp2(-inf) = 0 at the start
          rM[mt][e0] = m_new;
          rL[mt][2 * e0] *= alpha;
          rL[mt][2 * e0 + 1] *= alpha;
          rLt[mt][e0] *= alpha;
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt) {
            rO[mt][dt][2 * e0] *= alpha;
            rO[mt][dt][2 * e0 + 1] *= alpha;
          }
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e1 = 0; e1 < 2; ++e1) {
              const float pe = fast_exp2(rS[mt][nt][2 * e0 + e1] - m_use);
              rS[mt][nt][2 * e0 + e1] = pe;
              rLt[mt][e0] += pe;
            }
        }
    }

    // O += P V
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t rP[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        rP[mt][0] = pack2<T>(rS[mt][2 * kk][0], rS[mt][2 * kk][1]);
        rP[mt][1] = pack2<T>(rS[mt][2 * kk][2], rS[mt][2 * kk][3]);
        rP[mt][2] = pack2<T>(rS[mt][2 * kk + 1][0], rS[mt][2 * kk + 1][1]);
        rP[mt][3] = pack2<T>(rS[mt][2 * kk + 1][2], rS[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) mma_16816<T>(rL[mt], rP[mt], kOnes, kOnes);
#pragma unroll
      for (int np = 0; np < kDT / 2; ++np) {
        uint32_t rV[4];
        ldmatrix_x4_trans(rV, sVs + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kPitch +
                                  np * 16 + (lane / 16) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(rO[mt][2 * np], rP[mt], rV[0], rV[1]);
          mma_16816<T>(rO[mt][2 * np + 1], rP[mt], rV[2], rV[3]);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();
  }

  // O / l, written straight from the accumulators (pairs of elements).
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int e0 = 0; e0 < 2; ++e0) {
      const float l = rL[mt][2 * e0];
      const float lt = quad_sum(rLt[mt][e0]);
      const int r = warp_row0 + mt * 16 + g + 8 * e0;
      if (r >= I) continue;
      const float inv = p.exp_kind ? 1.f : (l > 0.f ? 1.f / l : 0.f);
      T* gO = static_cast<T*>(p.o) + b * p.o_b_stride + h * p.o_h_stride + int64_t(r) * p.o_i_stride;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
        *reinterpret_cast<uint32_t*>(gO + dt * 8 + 2 * t) =
            pack2<T>(rO[mt][dt][2 * e0] * inv, rO[mt][dt][2 * e0 + 1] * inv);
      if (t == 0 && p.l != nullptr) {
        // The row sum of exp(scale (cos - 1) + bias): undo the shift (fixed, or the running max).
        const float l_true = kOnline ? lt * exp2f(rM[mt][e0]) : lt * exp2f(-kFwdShiftLog2<T>);
        static_cast<float*>(p.l)[(int64_t(b) * p.H + h) * I + r] = l_true;
      }
    }
}

template <typename T, int D, int V>
cudaError_t launch_fwd_tile(const FwdParams& p, cudaStream_t stream) {
  using Tile = FwdTile<D, V>;
  const size_t smem = Tile::smem_bytes(sizeof(T));
  const bool online = fwd_needs_online(p, std::is_same_v<T, __half>);
  auto kernel = online ? fwd_kernel<T, D, V, true> : fwd_kernel<T, D, V, false>;
  const dim3 grid((p.I + Tile::kBM - 1) / Tile::kBM, p.H, p.B);
  return launch_with_smem(kernel, grid, Tile::kThreads, smem, stream, p);
}

template <typename T, int D>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  if constexpr (kHasTileVariants<D>) {
    [[maybe_unused]] static const int variant = tuning_variant("FLASHCOS_FWD_VARIANT");
    return FLASHCOS_VARIANT_SWITCH(variant, kV, [&] { return launch_fwd_tile<T, D, kV>(p, stream); });
  } else {
    return launch_fwd_tile<T, D, 0>(p, stream);
  }
}

}  // namespace flashcos::cuda
