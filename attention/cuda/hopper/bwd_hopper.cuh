// Backward of cosine-sim attention on Hopper warpgroup MMAs (wgmma, sm_90a), fp16 / bf16, d 64 / 128.
//
// Same math and scratch as bwd_kernel.cuh (read its header first); no key mask, no bias (launch.cu
// sends those to the sm_80 kernels). One CTA owns kBN = 128 keys of one (b, kv head) and loops
// over every query head of the group and every block of kBM (64 or 128) query rows; Q, dO, c_i and D_i
// are double-buffered by cp.async. Warpgroup w owns keys 64w .. 64w + 63 and, per step:
//   S^T = K_w Q^T, dP^T = V_w dO^T      wgmma, A (K-major) and B (K-major) from shared memory
//   P^T, dS^T = P^T (dP^T - D)           in registers; dS^T also to shared memory (swizzled)
//   dV += P^T dO, dK += dS^T Q           wgmma, A from registers, B = dO / Q N-major
//   dQ = dS K                            wgmma, A = dS (M-major, the dS^T tile), B = K N-major;
//                                        64-row steps: warpgroup w takes half the columns,
//                                        128-row steps: rows 64w .. 64w + 63
// dK, dV stay in registers for the whole loop (no atomics for grouped heads); dQ is added to the
// zeroed fp32 buffer with vector atomics (scale folded in).
#pragma once

#include "attention/cuda/bwd_kernel.cuh"
#include "attention/cuda/hopper/common.cuh"
#include "attention/cuda/hopper/wgmma.cuh"

namespace flashcos::cuda::hopper {

template <int D, int BM>
struct BwdHopperTile {
  static_assert(D == 64 || D == 128, "the Hopper backward covers head dims 64 and 128");
  static_assert(BM == 64 || BM == 128, "64 or 128 query rows per step");
  static constexpr int kBN = 128;  // keys per CTA, 64 per warpgroup
  static constexpr int kBM = BM;   // query rows per step
  static constexpr int kThreads = 256;
  static constexpr int kMinBlocks = 1;
  static constexpr bool kSplitRows = BM == 128;  // dQ: warpgroup w takes rows 64w.., else columns
  static constexpr int kNQ = kSplitRows ? D : D / 2;  // dQ columns per warpgroup
  static constexpr int kKBytes = kBN * D * 2;
  static constexpr int kQBytes = kBM * D * 2;
  // dS^T (keys x rows) as BM / 64 blocks of kBN keys x 128 bytes (64 rows), swizzled.
  static constexpr int kSBytes = kBN * kBM * 2;
  static constexpr size_t kSmem =
      size_t(2) * kKBytes + 4 * size_t(kQBytes) + kSBytes + 4 * kBM * sizeof(float) + kSw128Atom;
};

template <typename T, int D, int BM>
__global__ void __launch_bounds__(BwdHopperTile<D, BM>::kThreads, BwdHopperTile<D, BM>::kMinBlocks)
    bwd_hopper_kernel(const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = BwdHopperTile<D, BM>;
  constexpr int kBN = Tile::kBN, kBM = Tile::kBM, kThreads = Tile::kThreads;
  constexpr int kKT = D / 16;    // k-steps over the head dim
  constexpr int kMT = kBM / 16;  // k-steps over the query rows
  constexpr int kNT = kBN / 16;  // k-steps over the keys (dQ)
  constexpr bool kSplitRows = Tile::kSplitRows;
  constexpr int kNQ = Tile::kNQ;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + kSw128Atom - 1) & ~uint32_t(kSw128Atom - 1)) - raw_addr);
  unsigned char* sK = smem;
  unsigned char* sV = sK + Tile::kKBytes;
  unsigned char* sQ = sV + Tile::kKBytes;      // 2 stages
  unsigned char* sdO = sQ + 2 * Tile::kQBytes;  // 2 stages
  unsigned char* sdS = sdO + 2 * Tile::kQBytes;
  float* sRowC = reinterpret_cast<float*>(sdS + Tile::kSBytes);  // (2, kBM)
  float* sDelta = sRowC + 2 * kBM;                                // (2, kBM)
  const uint32_t aK = smem_addr(sK), aV = smem_addr(sV), aQ = smem_addr(sQ), adO = smem_addr(sdO);
  const uint32_t adS = smem_addr(sdS);

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp = (tid % 128) / 32;
  const int g = lane / 4, t = lane % 4;
  const int n_block = blockIdx.x;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const int group = p.H / p.Hkv;
  const int I = p.I, J = p.J, H = p.H;
  const int diag = J - I;
  const int n0 = n_block * kBN;
  const int wg_key0 = n0 + wg * 64;
  const int key_local0 = wg * 64 + warp * 16 + g;  // this thread's keys: + 0, + 8 (in the CTA)

  const T* gK = static_cast<const T*>(p.k) + b * p.k_b_stride + hkv * p.k_h_stride;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_b_stride + hkv * p.v_h_stride;

  const int m_blocks = (I + kBM - 1) / kBM;
  const int m_start = p.causal ? max(0, n0 - diag) / kBM : 0;
  const int per_head = max(0, m_blocks - m_start);
  const int n_iters = group * per_head;

  const float scale_log2 = p.scale * kLog2e;

  auto load_step = [&](int it, int stage) {
    const int h = hkv * group + it / per_head;
    const int m0 = (m_start + it % per_head) * kBM;
    const T* gQ = static_cast<const T*>(p.q) + b * p.q_b_stride + h * p.q_h_stride;
    const T* gdO = static_cast<const T*>(p.dout) + b * p.do_b_stride + h * p.do_h_stride;
    load_tile_sw128<kBM, D, kThreads>(sQ + stage * Tile::kQBytes, gQ + int64_t(m0) * p.q_i_stride, p.q_i_stride,
                                      I - m0, gQ, tid);
    load_tile_sw128<kBM, D, kThreads>(sdO + stage * Tile::kQBytes, gdO + int64_t(m0) * p.do_i_stride,
                                      p.do_i_stride, I - m0, gdO, tid);
    load_row_stats_async<kBM>(sRowC + stage * kBM, sDelta + stage * kBM, p, b, h, m0, tid);
  };

  load_tile_sw128<kBN, D, kThreads>(sK, gK + int64_t(n0) * p.k_j_stride, p.k_j_stride, J - n0, gK, tid);
  load_tile_sw128<kBN, D, kThreads>(sV, gV + int64_t(n0) * p.v_j_stride, p.v_j_stride, J - n0, gV, tid);
  if (n_iters > 0) load_step(0, 0);
  cp_async_commit();

  float rdK[D / 2], rdV[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) rdK[i] = rdV[i] = 0.f;

  // d 64 (kDeferDq): dQ(it) is copied out of the accumulators (rdQc) at the end of step it and added
  // to global memory in step it + 1, while that step's S^T / dP^T MMAs run. The copy is an asm mov
  // so that ptxas does not see registers written by an MMA read there (it would insert a wait,
  // C7517); the first step adds the zero-initialised copy. Keeping dQ / dV / dK themselves in
  // flight across steps made ptxas serialise the wgmma pipeline (C7511 / C7514), so every step
  // still ends with wait<0>. d 128 has no registers to spare and adds dQ(it) at the end of step it.
  constexpr bool kDeferDq = D == 64;
  // d 128: S^T and dP^T as two MMA groups, P^T computed while dP^T runs and dS^T while dV runs
  // (4096: 294 vs 279 TFLOP/s); at d 64 the same order spills and loses 5%.
  constexpr bool kSplitSdP = D == 128;
  float rdQ[kNQ / 2];
  float rdQc[kDeferDq ? kNQ / 2 : 1];
#pragma unroll
  for (int i = 0; i < (kDeferDq ? kNQ / 2 : 1); ++i) rdQc[i] = 0.f;
  uint32_t rPf[kMT][4], rdSf[kMT][4];
  auto flush_dq = [&](int it, const auto& acc) {
    const int h = hkv * group + it / per_head;
    const int m0 = (m_start + it % per_head) * kBM;
    float* gdQ = static_cast<float*>(p.dq_accum) + (int64_t(b) * H + h) * I * D;
    // Rows past I hold exact zeros (P = 0 there): they add 0 to row I - 1 instead of branching,
    // since a divergent branch here, while S^T / dP^T are in flight, serialises the wgmma pipeline.
#pragma unroll
    for (int e0 = 0; e0 < 2; ++e0) {
      const int r = min(m0 + (kSplitRows ? wg * 64 : 0) + warp * 16 + g + 8 * e0, I - 1);
#pragma unroll
      for (int i = 0; i < kNQ / 8; ++i)
        atomic_add2(gdQ + int64_t(r) * D + (kSplitRows ? 0 : wg * kNQ) + i * 8 + 2 * t, acc[4 * i + 2 * e0] * p.scale,
                    acc[4 * i + 2 * e0 + 1] * p.scale);
    }
  };

  for (int it = 0; it < n_iters; ++it) {
    const int stage = it & 1;
    const int m0 = (m_start + it % per_head) * kBM;
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // step it landed; both warpgroups are done with step it - 1 (dS^T included)
    if (it + 1 < n_iters) {
      load_step(it + 1, stage ^ 1);
      cp_async_commit();
    }
    const uint32_t aQs = aQ + stage * Tile::kQBytes, adOs = adO + stage * Tile::kQBytes;
    const float* sRowCs = sRowC + stage * kBM;
    const float* sDeltas = sDelta + stage * kBM;

    const bool elementwise = wg_key0 + 64 > J || (p.causal && wg_key0 + 63 > m0 + diag);
    float rS[kBM / 2], rdP[kBM / 2];
    // S^T = K_w Q^T (kWhich & 1) and / or dP^T = V_w dO^T (kWhich & 2), interleaved per k-step
    // (64 keys x kBM rows per warpgroup; A, B K-major).
    auto issue_s_dp = [&](auto which) {
      constexpr int kWhich = decltype(which)::value;
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk) {
        const uint32_t a_off = (kk / 4) * kBN * kSw128Row + wg * 64 * kSw128Row + (kk % 4) * 32;
        const uint32_t b_off = (kk / 4) * kBM * kSw128Row + (kk % 4) * 32;
        if constexpr ((kWhich & 1) != 0)
          Wgmma<T, kBM>::template ss<0, 0>(rS, make_desc(aK + a_off, 16, kSw128Atom),
                                           make_desc(aQs + b_off, 16, kSw128Atom), kk > 0);
        if constexpr ((kWhich & 2) != 0)
          Wgmma<T, kBM>::template ss<0, 0>(rdP, make_desc(aV + a_off, 16, kSw128Atom),
                                           make_desc(adOs + b_off, 16, kSw128Atom), kk > 0);
      }
    };
    // dV += P^T dO or dK += dS^T Q (k = the kBM query rows; dO / Q N-major).
    auto issue_kv_grad = [&](float (&acc)[D / 2], const uint32_t (&frag)[kMT][4], uint32_t b_base) {
#pragma unroll
      for (int kk = 0; kk < kMT; ++kk)
        Wgmma<T, D>::template rs<1>(acc, frag[kk], make_desc(b_base + kk * 16 * kSw128Row, kBM * kSw128Row, kSw128Atom),
                                    1);
    };
    // The dS^T fragments to shared memory: key row kr, query rows 16kk + 2t (+ 8), swizzled
    // 16-byte chunks (block kk / 4 of 64 rows).
    auto store_ds = [&] {
#pragma unroll
      for (int e0 = 0; e0 < 2; ++e0) {
        const int kr = key_local0 + 8 * e0;
        unsigned char* row = sdS + kr * kSw128Row + 4 * t;
#pragma unroll
        for (int kk = 0; kk < kMT; ++kk) {
          unsigned char* blk = row + (kk / 4) * kBN * kSw128Row;
          *reinterpret_cast<uint32_t*>(blk + ((((2 * kk) % 8) ^ (kr % 8)) * 16)) = rdSf[kk][e0];
          *reinterpret_cast<uint32_t*>(blk + ((((2 * kk + 1) % 8) ^ (kr % 8)) * 16)) = rdSf[kk][2 + e0];
        }
      }
    };
    // P^T and dS^T of accumulator element i (column = query row 8 (i / 4) + 2t + i % 2) are
    // computed inline below: fused in one loop for d64 and split around the dV MMAs for d128 (the
    // register allocation of either differs enough that one shared helper spilled, see kernels.md).
    if constexpr (kSplitSdP) {
      // Two groups, so that P^T is computed while dP^T runs and dS^T while dV runs (groups
      // complete in order).
      wgmma_fence();
      issue_s_dp(std::integral_constant<int, 1>{});
      wgmma_commit();
      issue_s_dp(std::integral_constant<int, 2>{});
      wgmma_commit();
      if constexpr (kDeferDq) flush_dq(max(it - 1, 0), rdQc);
      wgmma_wait<1>();  // S^T
      fence_regs(rS);
#pragma unroll
      for (int i = 0; i < kBM / 2; ++i) {
        const int rl = (i / 4) * 8 + 2 * t + (i % 2);
        const float x = fmaf(rS[i], scale_log2, sRowCs[rl]);
        bool ok = true;
        if (elementwise) {
          const int c = n0 + key_local0 + 8 * ((i / 2) % 2);
          ok = c < J && (!p.causal || c <= m0 + rl + diag);
        }
        rS[i] = ok ? fast_exp2(x) : 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < kMT; ++kk) acc_to_frag<T>(rPf[kk], rS, kk);
      wgmma_fence();
      issue_kv_grad(rdV, rPf, adOs);
      wgmma_commit();
      wgmma_wait<1>();  // dP^T (dV may still run)
      fence_regs(rdP);
#pragma unroll
      for (int i = 0; i < kBM / 2; ++i) {
        const int rl = (i / 4) * 8 + 2 * t + (i % 2);
        rdP[i] = rS[i] * (rdP[i] - sDeltas[rl]);
      }
#pragma unroll
      for (int kk = 0; kk < kMT; ++kk) acc_to_frag<T>(rdSf[kk], rdP, kk);
      store_ds();
      wgmma_fence();
      issue_kv_grad(rdK, rdSf, aQs);
      wgmma_commit();
    } else {
      wgmma_fence();
      issue_s_dp(std::integral_constant<int, 3>{});
      wgmma_commit();
      if constexpr (kDeferDq) flush_dq(max(it - 1, 0), rdQc);
      wgmma_wait<0>();
      fence_regs(rS);
      fence_regs(rdP);
#pragma unroll
      for (int i = 0; i < kBM / 2; ++i) {
        const int rl = (i / 4) * 8 + 2 * t + (i % 2);
        const float x = fmaf(rS[i], scale_log2, sRowCs[rl]);
        bool ok = true;
        if (elementwise) {
          const int c = n0 + key_local0 + 8 * ((i / 2) % 2);
          ok = c < J && (!p.causal || c <= m0 + rl + diag);
        }
        const float pe = ok ? fast_exp2(x) : 0.f;
        rS[i] = pe;
        rdP[i] = pe * (rdP[i] - sDeltas[rl]);
      }
#pragma unroll
      for (int kk = 0; kk < kMT; ++kk) {
        acc_to_frag<T>(rPf[kk], rS, kk);
        acc_to_frag<T>(rdSf[kk], rdP, kk);
      }
      store_ds();
      wgmma_fence();
      issue_kv_grad(rdV, rPf, adOs);
      issue_kv_grad(rdK, rdSf, aQs);
      wgmma_commit();
    }
    fence_proxy_async();
    __syncthreads();  // dS^T complete

    // dQ = dS K: A = dS (rows M-major in the dS^T tile), B = K (N-major). 128-row steps: this
    // warpgroup's 64 rows (row block wg of the dS^T tile), every column; 64-row steps: every row,
    // half the columns (d 64: 64 bytes into the swizzled rows; d 128: the second column block).
    wgmma_fence();
    const uint32_t s_off = kSplitRows ? wg * kBN * kSw128Row : 0;
    const uint32_t k_off = kSplitRows ? 0 : D == 64 ? wg * 64 : wg * kBN * kSw128Row;
#pragma unroll
    for (int kk = 0; kk < kNT; ++kk)
      Wgmma<T, kNQ>::template ss<1, 1>(rdQ, make_desc(adS + s_off + kk * 16 * kSw128Row, kBN * kSw128Row, kSw128Atom),
                                       make_desc(aK + k_off + kk * 16 * kSw128Row, kBN * kSw128Row, kSw128Atom),
                                       kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(rdQ);
    fence_regs(rdV);
    fence_regs(rdK);
#pragma unroll
    for (int kk = 0; kk < kMT; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(rPf[kk][e]), "+r"(rdSf[kk][e])::"memory");
    if constexpr (kDeferDq) {
#pragma unroll
      for (int i = 0; i < kNQ / 2; ++i) asm volatile("mov.b32 %0, %1;" : "=f"(rdQc[i]) : "f"(rdQ[i]));
    } else {
      flush_dq(it, rdQ);
    }
  }
  if (kDeferDq && n_iters > 0) flush_dq(n_iters - 1, rdQc);

  // dK = scale dS^T Q, dV: (B, Hkv, J, D) contiguous.
  const int64_t kv_base = (int64_t(b) * p.Hkv + hkv) * J;
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const int c = n0 + key_local0 + 8 * e0;
    if (c >= J) continue;
    T* gdK = static_cast<T*>(p.dk) + (kv_base + c) * D;
    T* gdV = static_cast<T*>(p.dv) + (kv_base + c) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(gdK + dt * 8 + 2 * t) =
          pack2<T>(rdK[4 * dt + 2 * e0] * p.scale, rdK[4 * dt + 2 * e0 + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(gdV + dt * 8 + 2 * t) = pack2<T>(rdV[4 * dt + 2 * e0], rdV[4 * dt + 2 * e0 + 1]);
    }
  }
#endif
}

}  // namespace flashcos::cuda::hopper

namespace flashcos::cuda {

// Query rows per backward step by tile variant (attention/cuda/tuning.h): variant 0 is in use,
// d64 variant 1 is the 64-row step (H100 bf16 n8192: 128 rows 284 TFLOP/s, 64 rows 267;
// docs/kernels.md). d128 has one shape: 128-row steps spill heavily there.
template <int D>
constexpr int hopper_bwd_rows(int variant) {
  return D == 64 && variant != 1 ? 128 : 64;
}

template <typename T, int D>
cudaError_t launch_bwd_hopper(const BwdParams& p, cudaStream_t stream) {
  {
    const cudaError_t err = launch_delta<T, float>(p, stream);
    if (err != cudaSuccess) return err;
  }
  [[maybe_unused]] static const int variant = tuning_variant("FLASHCOS_HOPPER_BWD_VARIANT");
  return FLASHCOS_VARIANT_SWITCH(variant, kV, [&] {
    constexpr int kBM = hopper_bwd_rows<D>(kV);
    using Tile = hopper::BwdHopperTile<D, kBM>;
    const dim3 grid((p.J + Tile::kBN - 1) / Tile::kBN, p.Hkv, p.B);
    return launch_with_smem(hopper::bwd_hopper_kernel<T, D, kBM>, grid, Tile::kThreads, Tile::kSmem,
                                    stream, p);
  });
}

}  // namespace flashcos::cuda
