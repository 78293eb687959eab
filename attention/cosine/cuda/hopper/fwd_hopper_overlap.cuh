// Forward of cosine-sim attention on Hopper, with the next key block's S = Q K^T in flight while
// this block's P V runs (FA3's intra-warpgroup overlap). Same math, layout and output as
// fwd_hopper.cuh (read its header first): P = exp2(S scale log2e + offset), no row max, O = P V / l
// with l the sum of the 16-bit P (the ones block after each V stage), the fp32 sum of the
// unrounded P saved for the backward.
//
// With no running max there is nothing to rescale, so P(j + 1) needs only S(j + 1): per key
// block j, each warpgroup
//   issues S(j + 1) = Q K(j + 1)^T     (SS wgmma, group 1)
//   issues O += P(j) [V(j) | 1]         (RS wgmma from the registers P(j) was packed into, group 2)
//   waits for group 1 only, computes P(j + 1) = exp2(...) and packs it into the second fragment set
//   while the tensor cores still run P(j) V(j), then waits for group 2.
// K / V stream through three cp.async stages (block j + 2 is loaded while j + 1 is consumed and j
// is still read by P V). One __syncthreads per block, as in fwd_hopper.cuh.
#pragma once

#include "attention/cosine/cuda/fwd_kernel.cuh"
#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/hopper/wgmma.cuh"

namespace flashcos::cuda::hopper {

template <int D, int WG>
struct FwdOverlapTile {
  static_assert(D == 64 || D == 128, "the Hopper forward covers head dims 64 and 128");
  static constexpr int kWG = WG;  // warpgroups: 64 query rows each
  static constexpr int kBM = 64 * kWG;
  static constexpr int kBN = 128;  // keys per stage
  static constexpr int kStages = 3;
  static constexpr int kThreads = 128 * kWG;
  static constexpr int kNO = D + 8;  // O accumulator columns (+ the row sums)
  static constexpr int kQBytes = kBM * D * 2;
  static constexpr int kKBytes = kBN * D * 2;
  static constexpr int kVBytes = kBN * (D + 64) * 2;  // V stage + its block of ones
  static constexpr size_t kSmem = size_t(kQBytes) + kStages * (size_t(kKBytes) + kVBytes) + kSw128Atom;
};

template <typename T, int D, int WG>
__global__ void __launch_bounds__(FwdOverlapTile<D, WG>::kThreads, 1) fwd_hopper_overlap_kernel(const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = FwdOverlapTile<D, WG>;
  constexpr int kBM = Tile::kBM, kBN = Tile::kBN, kThreads = Tile::kThreads, kNO = Tile::kNO;
  constexpr int kStages = Tile::kStages;
  constexpr int kKT = D / 16;    // k-steps of Q K^T
  constexpr int kPT = kBN / 16;  // k-steps of P V

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + kSw128Atom - 1) & ~uint32_t(kSw128Atom - 1)) - raw_addr);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + Tile::kQBytes;            // kStages stages
  unsigned char* sV = sK + kStages * Tile::kKBytes;  // kStages stages, each followed by its ones
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

  auto load_kv = [&](int j) {
    const int s = j % kStages, n1 = j * kBN;
    load_tile_sw128<kBN, D, kThreads>(sK + s * Tile::kKBytes, gK + int64_t(n1) * p.k_j_stride, p.k_j_stride, J - n1,
                                      gK, tid);
    load_tile_sw128<kBN, D, kThreads>(sV + s * Tile::kVBytes, gV + int64_t(n1) * p.v_j_stride, p.v_j_stride, J - n1,
                                      gV, tid);
  };
  load_tile_sw128<kBM, D, kThreads>(sQ, gQ + int64_t(m0) * p.q_i_stride, p.q_i_stride, I - m0, gQ, tid);
  if (n_blocks > 0) load_kv(0);
  cp_async_commit();
  if (n_blocks > 1) load_kv(1);
  cp_async_commit();
  {
    // The ones block after each V stage (every byte of it, so the swizzle does not matter).
    const uint32_t one2 = pack2<T>(1.f, 1.f);
    const uint4 ones = make_uint4(one2, one2, one2, one2);
    for (int s = 0; s < kStages; ++s) {
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

  // S(j) = Q K(j)^T, issued (one commit group).
  auto issue_s = [&](float (&rS)[kBN / 2], int j) {
    const uint32_t aKs = aK + (j % kStages) * Tile::kKBytes;
#pragma unroll
    for (int kk = 0; kk < kKT; ++kk) {
      const uint64_t da = make_desc(aQ + (kk / 4) * kBM * kSw128Row + wg * 64 * kSw128Row + (kk % 4) * 32, 16,
                                    kSw128Atom);
      const uint64_t db = make_desc(aKs + (kk / 4) * kBN * kSw128Row + (kk % 4) * 32, 16, kSw128Atom);
      Wgmma<T, kBN>::template ss<0, 0>(rS, da, db, kk > 0);
    }
    wgmma_commit();
  };
  // P(j) = exp2(logit in log2 units) from the completed S(j), packed into A fragments; keys past J
  // and above the causal diagonal give 0.
  auto exp_pack = [&](float (&rS)[kBN / 2], uint32_t (&rP)[kPT][4], int j) {
    const int n0 = j * kBN;
    const bool elementwise = n0 + kBN > J || (p.causal && n0 + kBN - 1 > wg_row0 + diag);
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
        const bool ok = c < J && (!p.causal || c <= r + diag);
        const float pe = ok ? fast_exp2(fmaf(rS[i], scale_log2, offset_log2)) : 0.f;
        rS[i] = pe;
        rLt[(i / 2) % 2] += pe;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kPT; ++kk) acc_to_frag<T>(rP[kk], rS, kk);
  };
  // O += P(j) [V(j) | 1], issued (one commit group).
  auto issue_pv = [&](const uint32_t (&rP)[kPT][4], int j) {
    const uint32_t aVs = aV + (j % kStages) * Tile::kVBytes;
#pragma unroll
    for (int kk = 0; kk < kPT; ++kk) {
      const uint64_t db = make_desc(aVs + kk * 16 * kSw128Row, kBN * kSw128Row, kSw128Atom);
      Wgmma<T, kNO>::template rs<1>(rO, rP[kk], db, 1);
    }
    wgmma_commit();
  };

  uint32_t rP[kPT][4];
  if (n_blocks > 0) {
    cp_async_wait<1>();  // Q, K(0), V(0)
    fence_proxy_async();
    __syncthreads();
    float rS[kBN / 2];
    wgmma_fence();
    issue_s(rS, 0);
    wgmma_wait<0>();
    fence_regs(rS);
    exp_pack(rS, rP, 0);
  }
  for (int j = 0; j < n_blocks; ++j) {
    const bool next = j + 1 < n_blocks;
    cp_async_wait<0>();  // K(j + 1), V(j + 1)
    fence_proxy_async();
    __syncthreads();  // ... landed for every thread; every warpgroup is done with block j - 1's stage
    if (j + 2 < n_blocks) load_kv(j + 2);
    cp_async_commit();
    if (next) {
      float rS[kBN / 2];
      uint32_t rPn[kPT][4];
      wgmma_fence();
      issue_s(rS, j + 1);
      issue_pv(rP, j);
      wgmma_wait<1>();  // S(j + 1); P(j) V(j) may still run
      fence_regs(rS);
      exp_pack(rS, rPn, j + 1);
      wgmma_wait<0>();
      fence_regs(rO);
#pragma unroll
      for (int kk = 0; kk < kPT; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          asm volatile("" : "+r"(rP[kk][e])::"memory");
          rP[kk][e] = rPn[kk][e];
        }
    } else {
      wgmma_fence();
      issue_pv(rP, j);
      wgmma_wait<0>();
      fence_regs(rO);
#pragma unroll
      for (int kk = 0; kk < kPT; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(rP[kk][e])::"memory");
    }
  }

  // O / l, written straight from the accumulators (pairs of elements).
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const float l = rO[4 * (D / 8) + 2 * e0];
    float lt = rLt[e0];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const int r = row0 + 8 * e0;
    if (r >= I) continue;
    const float inv = p.exp_kind ? 1.f : (l > 0.f ? 1.f / l : 0.f);
    T* gO = static_cast<T*>(p.o) + b * p.o_b_stride + h * p.o_h_stride + int64_t(r) * p.o_i_stride;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(gO + dt * 8 + 2 * t) =
          pack2<T>(rO[4 * dt + 2 * e0] * inv, rO[4 * dt + 2 * e0 + 1] * inv);
    if (t == 0 && p.l != nullptr)
      static_cast<float*>(p.l)[(int64_t(b) * p.H + h) * I + r] = lt * exp2f(-kFwdShiftLog2<T>);
  }
#endif
}

}  // namespace flashcos::cuda::hopper

namespace flashcos::cuda {

// d 64 only: at d 128 three K / V stages do not fit in shared memory beside Q.
template <typename T>
cudaError_t launch_fwd_hopper_overlap(const FwdParams& p, cudaStream_t stream) {
  using Tile = hopper::FwdOverlapTile<64, 3>;
  const dim3 grid((p.I + Tile::kBM - 1) / Tile::kBM, p.H, p.B);
  return launch_with_smem(hopper::fwd_hopper_overlap_kernel<T, 64, 3>, grid, Tile::kThreads, Tile::kSmem, stream, p);
}

}  // namespace flashcos::cuda
