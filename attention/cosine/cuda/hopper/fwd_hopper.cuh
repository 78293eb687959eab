// Forward of cosine-sim attention on Hopper warpgroup MMAs (wgmma, sm_90a), fp16 / bf16, d 64 / 128.
//
// Same math as fwd_kernel.cuh (read its header first): P = exp2(S scale log2e + offset), no row
// max, O = P V / l with l the sum of the 16-bit P, the fp32 sum of the unrounded P saved for the
// backward. This family covers a key mask or none, no bias, and scales inside the fixed-offset
// range (launch.cu sends everything else to the sm_80 kernels).
//
// One CTA owns kBM = 64 kWG query rows of one (b, h); warpgroup w owns rows 64w .. 64w + 63.
// K, V tiles of kBN keys stream through two cp.async stages into 128-byte-swizzled shared memory
// (hopper/common.cuh). Per key block, each warpgroup:
//   S (64 x kBN) = Q K^T   wgmma, A = Q and B = K from shared memory (K-major)
//   P = exp2(...)          in the accumulator registers, then packed to 16-bit A fragments
//   O (64 x (D + 8)) += P [V | 1]   wgmma, A = P from registers, B = V (N-major) from shared
// memory. The 8 extra B columns are ones (a constant block after each V stage, reached through
// the descriptor's LBO), so O's columns D .. D + 7 are the row sums of the rounded P, computed by
// the tensor cores with no shuffles (the sm_80 kernel does the same with a ones B fragment).
#pragma once

#include <cstdlib>
#include <string>
#include <type_traits>

#include "attention/cosine/cuda/fwd_kernel.cuh"
#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/hopper/fwd_epilogue.cuh"
#include "attention/cosine/cuda/hopper/fwd_hopper_ws.cuh"
#include "attention/cosine/cuda/hopper/wgmma.cuh"

namespace flashcos::cuda::hopper {

template <int D>
struct FwdHopperTile {
  static_assert(D == 64 || D == 128, "the Hopper forward covers head dims 64 and 128");
  static constexpr int kWG = D == 64 ? 3 : 2;  // warpgroups: 64 query rows each
  static constexpr int kBM = 64 * kWG;
  static constexpr int kBN = 128;               // keys per stage
  static constexpr int kThreads = 128 * kWG;
  static constexpr int kNO = D + 8;             // O accumulator columns (+ the row sums)
  static constexpr int kQBytes = kBM * D * 2;
  static constexpr int kKBytes = kBN * D * 2;
  static constexpr int kVBytes = kBN * (D + 64) * 2;  // V stage + its block of ones
  static constexpr size_t kSmem = size_t(kQBytes) + 2 * kKBytes + 2 * kVBytes + kSw128Atom;
};

template <typename T, int D>
__global__ void __launch_bounds__(FwdHopperTile<D>::kThreads, 1) fwd_hopper_kernel(const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = FwdHopperTile<D>;
  constexpr int kBM = Tile::kBM, kBN = Tile::kBN, kThreads = Tile::kThreads, kNO = Tile::kNO;
  constexpr int kKT = D / 16;    // k-steps of Q K^T
  constexpr int kPT = kBN / 16;  // k-steps of P V

  extern __shared__ unsigned char smem_raw[];
  // 1024-byte alignment for the swizzle atoms (the launch adds one atom of slack).
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + kSw128Atom - 1) & ~uint32_t(kSw128Atom - 1)) - raw_addr);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + Tile::kQBytes;      // 2 stages
  unsigned char* sV = sK + 2 * Tile::kKBytes;  // 2 stages, each followed by kBN x 128 bytes of ones
  const uint32_t aQ = smem_addr(sQ), aK = smem_addr(sK), aV = smem_addr(sV);

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp = (tid % 128) / 32;
  const int g = lane / 4, t = lane % 4;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest causal blocks first
  const int h = blockIdx.y, b = blockIdx.z;
  const int hkv = h / (p.H / p.Hkv);
  const int I = p.I, J = p.J;
  const int diag = J - I;  // causal: query r sees keys c <= r + diag
  const int m0 = m_block * kBM;
  const int wg_row0 = m0 + wg * 64;
  const int row0 = wg_row0 + warp * 16 + g;  // this thread's rows: row0, row0 + 8

  const T* gQ = static_cast<const T*>(p.q) + b * p.q_b_stride + h * p.q_h_stride;
  const T* gK = static_cast<const T*>(p.k) + b * p.k_b_stride + hkv * p.k_h_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_b_stride + hkv * p.v_h_stride;

  const int n_end = p.causal ? min(J, m0 + kBM + diag) : J;
  const int n_blocks = n_end > 0 ? (n_end + kBN - 1) / kBN : 0;

  load_tile_sw128<kBM, D, kThreads>(sQ, gQ + int64_t(m0) * p.q_i_stride, p.q_i_stride, I - m0, gQ, tid);
  if (n_blocks > 0) {
    load_tile_sw128<kBN, D, kThreads>(sK, gK, p.k_j_stride, J, gK, tid);
    load_tile_sw128<kBN, D, kThreads>(sV, gV, p.v_j_stride, J, gV, tid);
  }
  cp_async_commit();
  {
    // The ones block after each V stage (every byte of it, so the swizzle does not matter).
    const uint32_t one2 = pack2<T>(1.f, 1.f);
    const uint4 ones = make_uint4(one2, one2, one2, one2);
    for (int s = 0; s < 2; ++s) {
      uint4* dst = reinterpret_cast<uint4*>(sV + s * Tile::kVBytes + kBN * D * 2);
      for (int i = tid; i < kBN * 128 / 16; i += kThreads) dst[i] = ones;
    }
  }

  float rO[kNO / 2];
#pragma unroll
  for (int i = 0; i < kNO / 2; ++i) rO[i] = 0.f;
  float rLt[2] = {0.f, 0.f};  // fp32 row sums of the unrounded P (this thread's columns)

  const float scale_log2 = p.scale * kLog2e;
  const float offset_log2 = p.exp_kind ? 0.f : kFwdShiftLog2<T> - scale_log2;

  for (int j = 0; j < n_blocks; ++j) {
    const int stage = j & 1;
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // block j landed; every warpgroup is done with block j - 1 (the other stage)
    if (j + 1 < n_blocks) {
      const int n1 = (j + 1) * kBN;
      load_tile_sw128<kBN, D, kThreads>(sK + (stage ^ 1) * Tile::kKBytes, gK + int64_t(n1) * p.k_j_stride,
                                        p.k_j_stride, J - n1, gK, tid);
      load_tile_sw128<kBN, D, kThreads>(sV + (stage ^ 1) * Tile::kVBytes, gV + int64_t(n1) * p.v_j_stride,
                                        p.v_j_stride, J - n1, gV, tid);
      cp_async_commit();
    }
    const uint32_t aKs = aK + stage * Tile::kKBytes;
    const uint32_t aVs = aV + stage * Tile::kVBytes;

    // S = Q K^T
    float rS[kBN / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKT; ++kk) {
      const uint64_t da = make_desc(aQ + (kk / 4) * kBM * kSw128Row + wg * 64 * kSw128Row + (kk % 4) * 32, 16,
                                    kSw128Atom);
      const uint64_t db = make_desc(aKs + (kk / 4) * kBN * kSw128Row + (kk % 4) * 32, 16, kSw128Atom);
      Wgmma<T, kBN>::template ss<0, 0>(rS, da, db, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(rS);

    // P = exp2(logit in log2 units); keys past J, masked keys and keys above the causal diagonal give 0.
    const int n0 = j * kBN;
    const bool elementwise = p.mask != nullptr || n0 + kBN > J || (p.causal && n0 + kBN - 1 > wg_row0 + diag);
    if (!elementwise) {
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) {
        const float pe = fast_exp2(fmaf(rS[i], scale_log2, offset_log2));
        rS[i] = pe;
        rLt[(i / 2) % 2] += pe;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) {
        const int c = n0 + (i / 4) * 8 + 2 * t + (i % 2);
        const int r = row0 + 8 * ((i / 2) % 2);
        const bool ok = c < J && (!p.causal || c <= r + diag) &&
                        (p.mask == nullptr || p.mask[int64_t(b) * p.mask_b_stride + int64_t(c) * p.mask_j_stride]);
        const float pe = ok ? fast_exp2(fmaf(rS[i], scale_log2, offset_log2)) : 0.f;
        rS[i] = pe;
        rLt[(i / 2) % 2] += pe;
      }
    }

    // O += P [V | 1]
    uint32_t rP[kPT][4];
#pragma unroll
    for (int kk = 0; kk < kPT; ++kk) acc_to_frag<T>(rP[kk], rS, kk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPT; ++kk) {
      const uint64_t db = make_desc(aVs + kk * 16 * kSw128Row, kBN * kSw128Row, kSw128Atom);
      Wgmma<T, kNO>::template rs<1>(rO, rP[kk], db, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(rO);
    hold_frags(rP);
  }

  // O / l (l from the ones columns), and l for the backward.
  const float l[2] = {rO[4 * (D / 8)], rO[4 * (D / 8) + 2]};
  store_fwd_rows<T, D>(p, rO, l, rLt, b, h, row0, t);
#endif
}

}  // namespace flashcos::cuda::hopper

namespace flashcos::cuda {

// Which Hopper forward runs (FLASHCOS_HOPPER_FWD, read once): "ws-overlap" (default) the
// warp-specialised kernel with its overlapped schedule (fwd_hopper_ws.cuh), "ws" the same without
// the overlap, "cp" this file's cp.async kernel, "ws-packed" the default with d 128's l summed from
// the packed P (fwd_hopper_ws.cuh, FwdL::kPackedSum; the default takes it from an n8 wgmma). The
// warp-specialised ones fall back to "cp" where the TMA unit cannot address the inputs.
inline int hopper_fwd_kind() {
  static const int kind = [] {
    const char* env = std::getenv("FLASHCOS_HOPPER_FWD");
    const std::string s = env != nullptr ? env : "";
    return s == "cp" ? 0 : s == "ws" ? 1 : s == "ws-packed" ? 3 : 2;
  }();
  return kind;
}

template <typename T, int D>
cudaError_t launch_fwd_hopper(const FwdParams& p, cudaStream_t stream) {
  if (const int kind = hopper_fwd_kind(); kind != 0) {
    constexpr hopper::FwdL kPacked = D == 128 ? hopper::FwdL::kPackedSum : hopper::FwdL::kOnesCols;
    const cudaError_t err = kind == 3   ? launch_fwd_hopper_ws<T, D, true, kPacked>(p, stream)
                            : kind == 2 ? launch_fwd_hopper_ws<T, D, true>(p, stream)
                                        : launch_fwd_hopper_ws<T, D, false>(p, stream);
    if (err != cudaErrorNotSupported) return err;
  }
  using Tile = hopper::FwdHopperTile<D>;
  const dim3 grid((p.I + Tile::kBM - 1) / Tile::kBM, p.H, p.B);
  return launch_with_smem(hopper::fwd_hopper_kernel<T, D>, grid, Tile::kThreads, Tile::kSmem, stream, p);
}

}  // namespace flashcos::cuda
