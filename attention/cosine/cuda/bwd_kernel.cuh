// Backward of cosine-sim attention on tensor cores (sm_80+ mma.sync), fp16 / bf16 inputs.
//
// With P_ij = exp(logit_ij) / l_i (l = 1 for the exp kind), D_i = do_i . o_i (0 for exp):
//   dV = P^T dO     dS = P o (dP - D), dP = dO V^T     dQ = scale dS K     dK = scale dS^T Q
//   dbias = dS (summed over the broadcast dim by fp32 atomics)
// FA2-style: one CTA owns kBN = 16 kWarps keys of one (b, kv head) and loops over every query
// head of its group and every query block of kBM rows (Q, dO double-buffered by cp.async).
// Each warp owns 16 keys and computes S^T = K Q^T and dP^T = V dO^T directly in the transposed
// orientation, so P^T and dS^T are already the A operands of dV and dK (kept in registers).
// dS^T goes through shared memory once for dQ = dS K, which is added to a zeroed fp32 buffer
// with atomics (scale folded in). D_i and the row offset c_i = -scale log2e - log2 l_i (P =
// exp2(S scale log2e + c_i)) come from delta_kernel, run first.
#pragma once

#include "attention/common/cuda/mma.cuh"
#include "attention/cosine/cuda/params.h"
#include "attention/cosine/cuda/tuning.h"
#include "attention/cosine/cuda/dq_grid.cuh"
#include "attention/cosine/cuda/dq_semaphore.cuh"

namespace flashcos::cuda {

// Tile shapes per head dim and variant: warps (16 keys each), query rows per step, and the
// minimum resident CTAs per SM asked of the register allocator (__launch_bounds__). Variant 0 is
// in use; 1..3 are compiled only in FLASHCOS_TUNING builds (tuning.h). Timed on the H100 (b4 h8
// n8192 bf16, docs/kernels.md); d128: 8 warps x 64 rows (192 / 181 TFLOP/s; 8 x 32: 184 / 171,
// 4 x 64: 174 / 167, 4 x 32: 184 / 171); the other head dims keep 8 warps x 64 rows.
struct BwdShape {
  int warps, rows, min_blocks;
};
template <int D>
constexpr BwdShape bwd_shape(int variant) {
  if (D == 64) {
    // 0: 8 warps = 128 keys per CTA (half the dQ atomics of 64 keys), at most 128 registers so
    // that 2 CTAs fit per SM: 179 / 158 TFLOP/s vs 136 / 128 with 4 warps x 32 rows at 206
    // registers (variant 2) and 157 / 147 with those capped at 128 (variant 3).
    constexpr BwdShape v[] = {{8, 32, 2}, {16, 32, 1}, {4, 32, 1}, {4, 32, 4}};
    return v[variant];
  }
  if (D == 128) {
    constexpr BwdShape v[] = {{8, 64, 1}, {8, 32, 1}, {4, 64, 2}, {4, 32, 2}};
    return v[variant];
  }
  return {8, 64, 1};
}

template <int D, int V = 0>
struct BwdTile {
  static constexpr BwdShape kShape = bwd_shape<D>(V);
  static constexpr int kWarps = kShape.warps;
  static constexpr int kMinBlocks = kShape.min_blocks;
  static constexpr int kBN = 16 * kWarps;        // keys per CTA (16 per warp)
  static constexpr int kBM = kShape.rows;        // query rows per step
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPitch = D + 8;
  static constexpr int kPitchS = kBM + 8;     // dS^T tile (kBN, kBM)
  static constexpr int kMTq = kBM / 16;       // m-tiles of dQ
  static constexpr int kWq = kWarps / kMTq;   // warps sharing one dQ m-tile (split along D)
  static constexpr int kNQ = D / 8 / kWq;     // n8 tiles of dQ per warp
  static_assert((D / 8) % kWq == 0, "dQ tiles must split evenly over the warps");
  static constexpr size_t smem_bytes(size_t elem) {
    return (2 * size_t(kBN) * kPitch + 4 * size_t(kBM) * kPitch + size_t(kBN) * kPitchS) * elem +
           4 * size_t(kBM) * sizeof(float);
  }
};

// Writes D_i of `row` and, when p.row_offset is set, c_i = -scale log2e - log2 l_i (-inf for an
// empty row, 0 for the exp kind).
template <typename Acc>
__device__ __forceinline__ void store_row_stats(const BwdParams& p, int64_t row, Acc delta) {
  static_cast<Acc*>(p.delta)[row] = delta;
  if (p.row_offset != nullptr) {
    float c = 0.f;
    if (!p.exp_kind) {
      const float l = static_cast<const float*>(p.l)[row];
      c = l > 0.f ? -p.scale * kLog2e - log2f(l) : -INFINITY;
    }
    static_cast<float*>(p.row_offset)[row] = c;
  }
}

// The delta kernels' other job (BwdParams::dq_zero_floats): zero dq_accum and the counters after it,
// 16 bytes a thread and turn over the kernel's grid (dq_accum comes from the caching allocator,
// 256-byte aligned), the last n % 4 floats by the first threads.
__device__ __forceinline__ void zero_dq_accum(const BwdParams& p) {
  const int64_t n = p.dq_zero_floats;
  if (n <= 0) return;
  float* z = static_cast<float*>(p.dq_accum);
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, threads = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = t; k < n / 4; k += threads) reinterpret_cast<float4*>(z)[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (t < n % 4) z[n / 4 * 4 + t] = 0.f;
}

// D_i = do_i . o_i in fp32 (one warp per row; 0 for the exp kind), and c_i (store_row_stats).
template <typename T, typename Acc>
__global__ void delta_kernel(const BwdParams p) {
  zero_dq_accum(p);
  const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t(p.B) * p.H * p.I;
  if (row >= rows) return;
  const int i = int(row % p.I);
  const int h = int((row / p.I) % p.H);
  const int b = int(row / (int64_t(p.I) * p.H));
  const T* o = static_cast<const T*>(p.o) + b * p.o_b_stride + h * p.o_h_stride + int64_t(i) * p.o_i_stride;
  const T* dout = static_cast<const T*>(p.dout) + b * p.do_b_stride + h * p.do_h_stride +
                  int64_t(i) * p.do_i_stride;
  // |do_i|^2 only for the deterministic mode's dQ grid (p.dq_grid; the same for every thread).
  const bool grid = p.dq_grid != nullptr;
  Acc acc = 0;
  float ss = 0.f;
  if (!p.exp_kind)
    for (int d = lane; d < p.D; d += 32) {
      acc += Acc(o[d]) * Acc(dout[d]);
      if (grid) ss = fmaf(float(dout[d]), float(dout[d]), ss);
    }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (grid) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  }
  if (lane == 0) {
    store_row_stats<Acc>(p, row, acc);
    if (grid) store_dq_grid_row(p, row, b, h, ss);
  }
}

// The same for fp16 / bf16 with 16-byte loads: kLanes = D / 8 lanes per row (8 or 16), lane t holds
// elements 8t .. 8t + 7 (the operands' rows are 16-byte aligned, attention/cosine/cuda_ops.cpp makes
// them so). With 16 lanes a row whatever D, half the lanes of a d64 launch idled, and 64-bit index
// divisions per row cost more than the loads (H100 d64: 46 us for 67 MB per layer, 1.5 TB/s).
template <typename T, int kLanes>
__global__ void delta_kernel_16bit(const BwdParams p) {
  constexpr int kRowsPerBlock = 256 / kLanes;
  const uint32_t row = blockIdx.x * uint32_t(kRowsPerBlock) + threadIdx.x / kLanes;  // rows < 2^31 (launcher)
  const int lane = threadIdx.x % kLanes;
  const uint32_t rows = uint32_t(p.B) * uint32_t(p.H) * uint32_t(p.I);
  const bool grid = p.dq_grid != nullptr;  // |do_i|^2 only for the dQ grid, as delta_kernel
  zero_dq_accum(p);
  float acc = 0.f, ss = 0.f;
  const uint32_t bh = row / uint32_t(p.I);
  const int h = int(bh % uint32_t(p.H));
  const int b = int(bh / uint32_t(p.H));
  if (row < rows && !p.exp_kind && lane * 8 < p.D) {
    const int i = int(row - bh * uint32_t(p.I));
    const uint4 ov = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.o) + b * p.o_b_stride +
                                                     h * p.o_h_stride + int64_t(i) * p.o_i_stride + lane * 8);
    const uint4 dv = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.dout) + b * p.do_b_stride +
                                                     h * p.do_h_stride + int64_t(i) * p.do_i_stride + lane * 8);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += float(oe[e]) * float(de[e]);
    if (grid) {
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = fmaf(float(de[e]), float(de[e]), ss);
    }
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (grid) {
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  }
  if (lane == 0 && row < rows) {
    store_row_stats<float>(p, int64_t(row), acc);
    if (grid) store_dq_grid_row(p, int64_t(row), b, h, ss);
  }
}

template <typename T, typename Acc>
cudaError_t launch_delta(const BwdParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.B) * p.H * p.I;
  if constexpr (sizeof(T) == 2) {
    if (p.D <= 128 && p.D % 8 == 0 && rows < (int64_t(1) << 31)) {
      if (p.D <= 64) {
        delta_kernel_16bit<T, 8><<<unsigned((rows + 31) / 32), 256, 0, stream>>>(p);
      } else {
        delta_kernel_16bit<T, 16><<<unsigned((rows + 15) / 16), 256, 0, stream>>>(p);
      }
      return cudaGetLastError();
    }
  }
  delta_kernel<T, Acc><<<unsigned((rows + 7) / 8), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

// -inf, the c_i of query rows past I, as a cp.async source.
static __device__ float g_neg_inf_row_offset = -INFINITY;

// c_i and D_i of the query rows m0 .. m0 + kRows - 1 of (b, h) into shared memory, by 4-byte
// cp.async from threads 0 .. kRows - 1 (a synchronous load costs a global-memory round trip per
// step). Rows past I get c = -inf (so P = 0 there) and D = 0, also by cp.async, so that whatever
// tracks the thread's copies (cp.async.wait_group, or an mbarrier in the Hopper backward) covers
// every write.
template <int kRows>
__device__ __forceinline__ void load_row_stats_async(float* s_rowc, float* s_delta, const BwdParams& p, int b,
                                                     int h, int m0, int tid) {
  if (tid < kRows) {
    const int r = m0 + tid;
    const int64_t row = (int64_t(b) * p.H + h) * p.I + min(r, p.I - 1);
    cp_async_4(s_rowc + tid, r < p.I ? static_cast<const float*>(p.row_offset) + row : &g_neg_inf_row_offset, true);
    cp_async_4(s_delta + tid, static_cast<const float*>(p.delta) + row, r < p.I);
  }
}

// kDet: dq added in key-block order (p.dq_semaphore, dq_semaphore.cuh), as its own instance.
template <typename T, int D, int V, bool kDet>
__global__ void __launch_bounds__(BwdTile<D, V>::kThreads, BwdTile<D, V>::kMinBlocks)
    bwd_kernel(const BwdParams p) {
  using Tile = BwdTile<D, V>;
  constexpr int kBN = Tile::kBN, kBM = Tile::kBM, kThreads = Tile::kThreads;
  constexpr int kPitch = Tile::kPitch, kPitchS = Tile::kPitchS;
  constexpr int kKT = D / 16;   // k-steps of K Q^T and V dO^T
  constexpr int kMT8 = kBM / 8; // n8 tiles of S^T (query columns)
  constexpr int kDT = D / 8;    // n8 tiles of dK, dV
  constexpr int kMTq = Tile::kMTq, kNQ = Tile::kNQ;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);  // (kBN, kPitch)
  T* sV = sK + kBN * kPitch;               // (kBN, kPitch)
  T* sQ = sV + kBN * kPitch;               // (2, kBM, kPitch)
  T* sdO = sQ + 2 * kBM * kPitch;          // (2, kBM, kPitch)
  T* sdS = sdO + 2 * kBM * kPitch;         // (kBN, kPitchS): dS^T
  float* sRowC = reinterpret_cast<float*>(sdS + kBN * kPitchS);  // (2, kBM): c_i, -inf off range
  float* sDelta = sRowC + 2 * kBM;                                 // (2, kBM)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int n_block = blockIdx.x;  // low key blocks see the most causal queries: first
  const int hkv = blockIdx.y, b = blockIdx.z;
  const int group = p.H / p.Hkv;
  const int I = p.I, J = p.J, H = p.H;
  const int diag = J - I;
  const int n0 = n_block * kBN;

  const T* gK = static_cast<const T*>(p.k) + b * p.k_b_stride + hkv * p.k_h_stride;  // (J, D)
  const T* gV = static_cast<const T*>(p.v) + b * p.v_b_stride + hkv * p.v_h_stride;  // (J, D)

  const int m_blocks = (I + kBM - 1) / kBM;
  const int m_start = p.causal ? max(0, n0 - diag) / kBM : 0;
  const int per_head = max(0, m_blocks - m_start);
  const int n_iters = group * per_head;

  const float scale_log2 = p.scale * kLog2e;
  const bool has_mask = p.mask != nullptr, has_bias = p.bias != nullptr;

  // This thread's two key rows: c = n0 + warp * 16 + g + 8 e0.
  bool key_ok[2];
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const int c = n0 + warp * 16 + g + 8 * e0;
    key_ok[e0] = c < J && (!has_mask || p.mask[b * p.mask_b_stride + c * p.mask_j_stride]);
  }

  // Issues the loads of iteration `it` into `stage`, all by cp.async: Q, dO, c_i and D_i.
  auto load_step = [&](int it, int stage) {
    const int h = hkv * group + it / per_head;
    const int m0 = (m_start + it % per_head) * kBM;
    const T* gQ = static_cast<const T*>(p.q) + b * p.q_b_stride + h * p.q_h_stride;
    const T* gdO = static_cast<const T*>(p.dout) + b * p.do_b_stride + h * p.do_h_stride;
    load_tile_async<kBM, D, kThreads>(sQ + stage * kBM * kPitch, gQ + int64_t(m0) * p.q_i_stride,
                                      p.q_i_stride, I - m0, gQ, tid);
    load_tile_async<kBM, D, kThreads>(sdO + stage * kBM * kPitch,
                                      gdO + int64_t(m0) * p.do_i_stride, p.do_i_stride, I - m0,
                                      gdO, tid);
    load_row_stats_async<kBM>(sRowC + stage * kBM, sDelta + stage * kBM, p, b, h, m0, tid);
  };

  load_tile_async<kBN, D, kThreads>(sK, gK + int64_t(n0) * p.k_j_stride, p.k_j_stride, J - n0, gK, tid);
  load_tile_async<kBN, D, kThreads>(sV, gV + int64_t(n0) * p.v_j_stride, p.v_j_stride, J - n0, gV, tid);
  if (n_iters > 0) load_step(0, 0);
  cp_async_commit();

  float rdK[kDT][4], rdV[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) rdK[dt][e] = rdV[dt][e] = 0.f;

  const T* sKw = sK + warp * 16 * kPitch;  // this warp's 16 keys
  const T* sVw = sV + warp * 16 * kPitch;

  for (int it = 0; it < n_iters; ++it) {
    const int stage = it & 1;
    const int h = hkv * group + it / per_head;
    const int m0 = (m_start + it % per_head) * kBM;
    if (it + 1 < n_iters) {
      load_step(it + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* sQs = sQ + stage * kBM * kPitch;
    const T* sdOs = sdO + stage * kBM * kPitch;
    const float* sRowCs = sRowC + stage * kBM;
    const float* sDeltas = sDelta + stage * kBM;

    // S^T = K Q^T and dP^T = V dO^T, (16 keys, kBM queries) per warp.
    float rS[kMT8][4], rdP[kMT8][4];
#pragma unroll
    for (int nt = 0; nt < kMT8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) rS[nt][e] = rdP[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKT; ++kk) {
      uint32_t rK[4], rV[4];
      ldmatrix_x4(rK, sKw + (lane % 16) * kPitch + kk * 16 + (lane / 16) * 8);
      ldmatrix_x4(rV, sVw + (lane % 16) * kPitch + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < kMT8 / 2; ++np) {
        const int off = (np * 16 + lane % 8 + (lane / 16) * 8) * kPitch + kk * 16 + ((lane / 8) % 2) * 8;
        uint32_t rQ[4], rdO[4];
        ldmatrix_x4(rQ, sQs + off);
        ldmatrix_x4(rdO, sdOs + off);
        mma_16816<T>(rS[2 * np], rK, rQ[0], rQ[1]);
        mma_16816<T>(rS[2 * np + 1], rK, rQ[2], rQ[3]);
        mma_16816<T>(rdP[2 * np], rV, rdO[0], rdO[1]);
        mma_16816<T>(rdP[2 * np + 1], rV, rdO[2], rdO[3]);
      }
    }

    // P^T, dS^T in place of S^T, dP^T.
    const bool elementwise = has_mask || has_bias || (p.causal && n0 + kBN - 1 > m0 + diag);
    const float* gBias = nullptr;
    float* gdBias = nullptr;
    if (has_bias) {
      const int lead = p.bias_batch_dim ? b : h;
      gBias = static_cast<const float*>(p.bias) + lead * p.bias_0_stride;
      gdBias = static_cast<float*>(p.dbias_accum) + (p.dbias_per_head ? int64_t(b) * H + h : int64_t(lead)) * I * J;
    }
    // Blocks with nothing to mask get their own loop: with the test inside every element's
    // exponential the compiler branches around each of them (see the Hopper backward's note).
    if (!elementwise) {
#pragma unroll
      for (int nt = 0; nt < kMT8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rl = nt * 8 + 2 * t + (e % 2);
          const float pe = fast_exp2(fmaf(rS[nt][e], scale_log2, sRowCs[rl]));
          rdP[nt][e] = pe * (rdP[nt][e] - sDeltas[rl]);
          rS[nt][e] = pe;
        }
    } else {
#pragma unroll
      for (int nt = 0; nt < kMT8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int e0 = e / 2;
          const int rl = nt * 8 + 2 * t + (e % 2);  // query row within the block
          float x = fmaf(rS[nt][e], scale_log2, sRowCs[rl]);
          const int c = n0 + warp * 16 + g + 8 * e0;
          const int r = m0 + rl;
          const bool ok = key_ok[e0] && r < I && (!p.causal || c <= r + diag);
          if (has_bias && ok) x = fmaf(gBias[r * p.bias_i_stride + c * p.bias_j_stride], kLog2e, x);
          const float pe = ok ? fast_exp2(x) : 0.f;
          const float ds = pe * (rdP[nt][e] - sDeltas[rl]);
          rS[nt][e] = pe;
          rdP[nt][e] = ds;
          if (has_bias && ok) atomicAdd(gdBias + int64_t(r) * J + c, ds);
        }
    }

    // dV += P^T dO, dK += dS^T Q (k = the kBM query rows); dS^T -> shared memory for dQ.
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      uint32_t rP[4], rdS[4];
      rP[0] = pack2<T>(rS[2 * kk][0], rS[2 * kk][1]);
      rP[1] = pack2<T>(rS[2 * kk][2], rS[2 * kk][3]);
      rP[2] = pack2<T>(rS[2 * kk + 1][0], rS[2 * kk + 1][1]);
      rP[3] = pack2<T>(rS[2 * kk + 1][2], rS[2 * kk + 1][3]);
      rdS[0] = pack2<T>(rdP[2 * kk][0], rdP[2 * kk][1]);
      rdS[1] = pack2<T>(rdP[2 * kk][2], rdP[2 * kk][3]);
      rdS[2] = pack2<T>(rdP[2 * kk + 1][0], rdP[2 * kk + 1][1]);
      rdS[3] = pack2<T>(rdP[2 * kk + 1][2], rdP[2 * kk + 1][3]);
      T* sdSw = sdS + (warp * 16 + g) * kPitchS + kk * 16 + 2 * t;
      *reinterpret_cast<uint32_t*>(sdSw) = rdS[0];
      *reinterpret_cast<uint32_t*>(sdSw + 8 * kPitchS) = rdS[1];
      *reinterpret_cast<uint32_t*>(sdSw + 8) = rdS[2];
      *reinterpret_cast<uint32_t*>(sdSw + 8 * kPitchS + 8) = rdS[3];
#pragma unroll
      for (int np = 0; np < kDT / 2; ++np) {
        const int off = (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kPitch + np * 16 + (lane / 16) * 8;
        uint32_t rdO[4], rQ[4];
        ldmatrix_x4_trans(rdO, sdOs + off);
        ldmatrix_x4_trans(rQ, sQs + off);
        mma_16816<T>(rdV[2 * np], rP, rdO[0], rdO[1]);
        mma_16816<T>(rdV[2 * np + 1], rP, rdO[2], rdO[3]);
        mma_16816<T>(rdK[2 * np], rdS, rQ[0], rQ[1]);
        mma_16816<T>(rdK[2 * np + 1], rdS, rQ[2], rQ[3]);
      }
    }
    __syncthreads();

    // dQ (kBM, D) += dS K: warp -> m-tile warp % kMTq, columns d0 .. d0 + 8 kNQ.
    {
      const int mq = warp % kMTq;
      const int d0 = (warp / kMTq) * kNQ * 8;
      float rdQ[kNQ][4];
#pragma unroll
      for (int i = 0; i < kNQ; ++i) rdQ[i][0] = rdQ[i][1] = rdQ[i][2] = rdQ[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t rA[4];
        ldmatrix_x4_trans(rA, sdS + (kk * 16 + lane % 8 + (lane / 16) * 8) * kPitchS + mq * 16 +
                                  ((lane / 8) % 2) * 8);
        const T* sKk = sK + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kPitch + d0;
#pragma unroll
        for (int np = 0; np < kNQ / 2; ++np) {
          uint32_t rB[4];
          ldmatrix_x4_trans(rB, sKk + np * 16 + (lane / 16) * 8);
          mma_16816<T>(rdQ[2 * np], rA, rB[0], rB[1]);
          mma_16816<T>(rdQ[2 * np + 1], rA, rB[2], rB[3]);
        }
        if constexpr (kNQ % 2 == 1) {
          uint32_t rB[2];
          ldmatrix_x2_trans(rB, sKk + (kNQ - 1) * 8);
          mma_16816<T>(rdQ[kNQ - 1], rA, rB[0], rB[1]);
        }
      }
      float* gdQ = static_cast<float*>(p.dq_accum) + (int64_t(b) * H + h) * I * D;
      int* unit = kDet ? dq_unit_counter(p.dq_semaphore, b, H, h, I, m0) : nullptr;
      if (kDet) {  // deterministic: after every lower key block's adds (dq_semaphore.cuh)
        if (tid == 0) dq_unit_wait(unit, n_block);
        __syncthreads();
      }
#pragma unroll
      for (int e0 = 0; e0 < 2; ++e0) {
        const int r = m0 + mq * 16 + g + 8 * e0;
        if (r >= I) continue;
#pragma unroll
        for (int i = 0; i < kNQ; ++i)
          atomic_add2(gdQ + int64_t(r) * D + d0 + i * 8 + 2 * t, rdQ[i][2 * e0] * p.scale,
                      rdQ[i][2 * e0 + 1] * p.scale);
      }
      if (kDet) {
        __threadfence();
        __syncthreads();
        if (tid == 0) dq_unit_done(unit);
      }
    }
  }

  // dK = scale dS^T Q, dV: (B, Hkv, J, D) with their strides.
#pragma unroll
  for (int e0 = 0; e0 < 2; ++e0) {
    const int c = n0 + warp * 16 + g + 8 * e0;
    if (c >= J) continue;
    T* gdK = static_cast<T*>(p.dk) + b * p.dk_b_stride + hkv * p.dk_h_stride + int64_t(c) * p.dk_j_stride;
    T* gdV = static_cast<T*>(p.dv) + b * p.dv_b_stride + hkv * p.dv_h_stride + int64_t(c) * p.dv_j_stride;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      *reinterpret_cast<uint32_t*>(gdK + dt * 8 + 2 * t) =
          pack2<T>(rdK[dt][2 * e0] * p.scale, rdK[dt][2 * e0 + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(gdV + dt * 8 + 2 * t) =
          pack2<T>(rdV[dt][2 * e0], rdV[dt][2 * e0 + 1]);
    }
  }
}

template <typename T, int D, int V>
cudaError_t launch_bwd_tile(const BwdParams& p, cudaStream_t stream) {
  using Tile = BwdTile<D, V>;
  const size_t smem = Tile::smem_bytes(sizeof(T));
  const dim3 grid((p.J + Tile::kBN - 1) / Tile::kBN, p.Hkv, p.B);
  return p.dq_semaphore != nullptr ? launch_with_smem(bwd_kernel<T, D, V, true>, grid, Tile::kThreads, smem, stream, p)
                                   : launch_with_smem(bwd_kernel<T, D, V, false>, grid, Tile::kThreads, smem, stream, p);
}

template <typename T, int D>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  {
    const cudaError_t err = launch_delta<T, float>(p, stream);
    if (err != cudaSuccess) return err;
  }
  if constexpr (kHasTileVariants<D>) {
    [[maybe_unused]] static const int variant = tuning_variant("FLASHCOS_BWD_VARIANT");
    return FLASHCOS_VARIANT_SWITCH(variant, kV, [&] { return launch_bwd_tile<T, D, kV>(p, stream); });
  } else {
    return launch_bwd_tile<T, D, 0>(p, stream);
  }
}

}  // namespace flashcos::cuda
