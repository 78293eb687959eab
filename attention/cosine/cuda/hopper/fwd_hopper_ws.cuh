// Forward of cosine-sim attention on Hopper (sm_90a, wgmma), fp16 / bf16, d 64 / 128, warp
// specialised: a producer warp loads by TMA, consumer warpgroups only compute. Same math as
// fwd_kernel.cuh (read its header first), every case of it: a key mask or none, an attention bias
// (kBias) or none, the fixed offset or the online row max (kOnline, where fwd_needs_online says so):
//   S (64 x kBN) = Q K^T              wgmma, B = K from shared memory (K-major), A = Q from
//                                     registers (kQRegs, d 128 without a bias) or shared memory
//   x = S scale log2e + offset        in the accumulators (+ bias log2e with kBias); masked = -inf
//   P = exp2(x)                       fixed offset (-scale log2e, + 15 for fp16): |q.k| <= 1 bounds x
//   P = exp2(x - m), m the row max    kOnline: m grows block by block; O, l, lt are then rescaled
//                                     by alpha = exp2(m_old - m_new) (fwd_logits.cuh)
//   O = P V / lt                      wgmma, A = P (16-bit A fragments) from registers, B = V
//                                     (N-major); lt = the fp32 row sum of the unrounded P
// and lt saved for the backward as l (lt 2^-15 for fp16's fixed offset, lt 2^m with kOnline: the sum
// of exp(scale (q.k - 1) + bias), as the sm_80 kernel).
//
// CTA: warpgroup 0 is the producer (setmaxnreg gives its registers away; one thread issues every
// TMA load), warpgroups 1 .. kWG own 64 query rows each (kBM = 64 kWG rows per CTA). Shared memory:
// Q (kBM x D), and K, V in a ring of kStages stages (SW128 tiles, hopper/common.cuh). A CTA runs
// one tile (a row block, fwd_tile_work) or, on a persistent grid (fwd_launch_ws.cuh: d 128 and the
// online max without a causal mask, one CTA an SM), several in turn. mbarriers:
//   bar_q        Q landed (transaction count)
//   bar_q_free   every consumer warp is done with the tile's Q (4 kWG arrivals; a persistent grid's
//                producer waits for it before it loads the next tile's Q)
//   full[s]      K and V of stage s landed (transaction count, the producer's one arrival)
//   empty[s]     every consumer warp finished reading stage s (4 kWG arrivals)
// The normaliser (FwdL below; since 2026-11-26 night the fp32 sum lt of the unrounded P, as
// FlashAttention and cuDNN divide): o = sum_j bf16(p_j) v_j / sum_j p_j, whose weights sum to 1
// within the rounding of P (a one-key row gives o = v (1 + d), |d| <= 2^-8 for bf16 before o's own
// rounding; the sm_80 kernels divide by the sum of the 16-bit P, and give o = v there). The sum of
// the 16-bit P on the tensor cores (FLASHCOS_HOPPER_FWD=ws-rounded): d 64 from 8 extra O columns
// (the P V wgmma reads its last 8 B columns one descriptor LBO past V, from one shared block of
// ones, the LBO chosen per stage), d 128 (no shared memory for 128 ones rows beside a third stage)
// from an extra m64n8k16 wgmma per k-step whose B is a 1 KB block of ones; it cost d 128 4-15 % of
// the forward (H100, run I2 of 2026-11-26 night: bf16 n 8192 non-causal 654 / 690 against 751 /
// 754 TFLOP/s).
//
// kOverlap (the FA3 schedule): inside a warpgroup, block j's S = Q K_j^T is issued together with
// block j - 1's P V, so the exp of block j runs while the tensor cores finish P_{j-1} V_{j-1}; and
// the consumer warpgroups take turns issuing their MMAs (a token passed round a ring of named
// barriers), so that one warpgroup's exp runs while the others' MMAs occupy the tensor cores.
// Without kOverlap each warpgroup runs S, exp, P V in sequence.
// kOnline with kOverlap: block j's exp (new max m_j) runs while P_{j-1} V_{j-1} still adds into O
// under m_{j-1}; so lt is rescaled at once, O (and the 16-bit P's sum: d 64's ones columns of rO,
// d 128's rL) only after the wait for that wgmma and before P_j V_j is issued (rescale_out;
// keep_ahead_of_wait stops ptxas from hoisting that wait above the exps). kBias: the block's bias
// is loaded into registers right after the MMAs are issued, before the wait for S (FwdBias,
// fwd_logits.cuh). Both take 2 consumer warpgroups (kFwdWsWG); d 128 with a bias runs without
// kOverlap (hopper/fwd_hopper.cuh).
// Split tail (fwd_may_split: d 64, fixed offset, no bias; the launcher plans it without a causal
// mask, split_tail.h): the grid's last row blocks run as pieces over shares of their key blocks;
// each piece's O and lt go to a slot, and the piece that counts last adds them (fwd_split_gather).
#pragma once

#include <cuda.h>

#include "attention/cosine/cuda/fwd_kernel.cuh"
#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/hopper/fwd_epilogue.cuh"
#include "attention/cosine/cuda/hopper/fwd_logits.cuh"
#include "attention/cosine/cuda/hopper/head_groups.h"
#include "attention/cosine/cuda/hopper/split_tail.h"
#include "attention/cosine/cuda/hopper/tma.cuh"
#include "attention/cosine/cuda/hopper/tma_map.h"
#include "attention/cosine/cuda/hopper/wgmma.cuh"

namespace flashcos::cuda::hopper {

struct FwdTmaMaps {
  CUtensorMap q, k, v;
};

// Where the normaliser l comes from: the fp32 sum of the unrounded P that the exponentials add up
// anyway (kUnrounded, the default), or the sum of the 16-bit P that P V multiplies: 8 ones columns
// of the P V wgmma (kOnesCols, d 64), an m64n8k16 wgmma per k-step of P V whose B is a 1 KB block of
// ones, read twice through SBO 0 (kOnesMma, d 128), or the packed A fragments summed in fp32
// (kPackedSum; H100 bf16 n 8192, TFLOP/s: 614 against the n8 wgmma's 660 non-causal, 611 against 638
// causal).
enum class FwdL { kOnesCols, kPackedSum, kOnesMma, kUnrounded };
constexpr FwdL kDefaultFwdL = FwdL::kUnrounded;
template <int D>
constexpr FwdL kRoundedFwdL = D == 64 ? FwdL::kOnesCols : FwdL::kOnesMma;

// Consumer warpgroups (64 query rows each; 3 get 160 registers, 2 get 240): d 64 3, but 2 with a
// bias (the 64 bias values a thread loads ahead of the exp) or the online max (with 3, ptxas
// spills 24 bytes in the overlapped loop); d 128 2. kWG2: 2 at d 64 too (short sequences, where
// 192-row blocks leave SMs idle: fwd_two_warpgroups in hopper/fwd_hopper.cuh).
template <int D, bool kBias, bool kOnline, bool kWG2 = false>
constexpr int kFwdWsWG = D == 64 && !kBias && !kOnline && !kWG2 ? 3 : 2;

// The instances that may run a split tail (split_tail.h; the launcher plans it, hopper_fwd_split):
// the fixed offset's (the pieces' O and row sums add as they are) without a bias, at d 64 (the 3 and 2
// consumer warpgroup tiles). d 128 does not split: H100 run AD1 (b4 h8 n 8192 non-causal, forward
// TFLOP/s, four interleaved rounds, split against none) bf16 738.4 / 752.3, fp16 711.4 / 706.6, and
// ncu 0.7-1.1 % more cycles with it, where the plan's model promised 1.5 % fewer (d 64: +2.7 / +3.5 %).
template <int D, FwdL L, bool kBias, bool kOnline>
constexpr bool fwd_may_split = D == 64 && L == FwdL::kUnrounded && !kBias && !kOnline;
// The instances that may run on a persistent grid (fwd_launch_ws.cuh): the others' grid has one CTA
// a tile (the bias's 2-D grid, the split tail's pieces).
template <int D, FwdL L, bool kBias, bool kOnline>
constexpr bool fwd_may_persist = !kBias && !fwd_may_split<D, L, kBias, kOnline>;

template <int D, FwdL L = kDefaultFwdL, int WG = kFwdWsWG<D, false, false>>
struct FwdWsTile {
  static_assert(D == 64 || D == 128, "the Hopper forward covers head dims 64 and 128");
  static_assert(D == 64 || L != FwdL::kOnesCols, "d 128 has no shared memory for ones columns beside 3 stages");
  static_assert(WG == 2 || WG == 3, "2 or 3 consumer warpgroups");
  static constexpr int kWG = WG;  // consumer warpgroups, 64 query rows each
  static constexpr int kBM = 64 * kWG;
  static constexpr int kBN = 128;
  static constexpr int kStages = D == 64 ? 4 : 3;
  static constexpr bool kOnesSum = L == FwdL::kOnesCols;  // l from 8 ones columns of P V
  static constexpr int kThreads = 128 * (kWG + 1);
  static constexpr int kNO = kOnesSum ? D + 8 : D;
  static constexpr int kQBytes = kBM * D * 2;
  static constexpr int kKBytes = kBN * D * 2;
  static constexpr int kOnesBytes = kOnesSum ? kBN * kSw128Row : L == FwdL::kOnesMma ? kSw128Atom : 0;  // after the ring
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kWG == 3 ? 160 : 240;
  static constexpr size_t kSmem = size_t(kQBytes) + size_t(kStages) * 2 * kKBytes + kOnesBytes +
                                  (2 * kStages + 3) * sizeof(uint64_t) + kSw128Atom;  // + bar_q_free, the split flag
  static_assert(kSmem <= 227 * 1024, "shared memory");
  // setmaxnreg moves registers between warpgroups inside the CTA's launch allocation (65536 / threads,
  // rounded down to 8 per thread); asking for more makes the consumers' setmaxnreg.inc wait forever.
  static_assert(128 * (kProducerRegs + kWG * kConsumerRegs) <= (65536 / kThreads) / 8 * 8 * kThreads,
                "registers allocated at launch");
};

// One tile of the forward: a row block of one (b, head), from row m0, over key blocks jb0 ..
// jb0 + n_blocks - 1 (all of the row block's, or a split piece's share). Heaviest causal blocks
// first. kBias: x = (row block, then the dim the bias is shared over) (the launcher's grid), so that
// the CTAs running together read the same bias rows (from L2); one tile per CTA. Otherwise (b, head)s
// in groups of p.head_group (head_groups.h), tile t the t-th block of that order; with the split tail
// (split_tail.h; kMaySplit: d 64, the fixed offset without a bias) tiles from p.split_first on are
// pieces of the last blocks, each over a share of the key blocks.
struct FwdTileWork {
  int m0, h, hkv, b, jb0, n_blocks;
};
template <int kBM, int kBN, bool kBias, bool kMaySplit>
__device__ __forceinline__ FwdTileWork fwd_tile_work(const FwdParams& p, unsigned tile) {
  SplitPiece piece{0, 0, 1, -1};
  int m_block, h, b;
  if constexpr (kBias) {
    const int share = p.bias_batch_dim ? p.H : p.B, s = int(blockIdx.x % unsigned(share));
    m_block = int(gridDim.x / unsigned(share)) - 1 - int(blockIdx.x / unsigned(share));
    h = p.bias_batch_dim ? s : int(blockIdx.y);
    b = p.bias_batch_dim ? int(blockIdx.y) : s;
  } else {
    const int m_blocks = (p.I + kBM - 1) / kBM;
    if constexpr (kMaySplit) {
      piece = split_piece(p, tile);
    } else {
      piece.block = int(tile);
    }
    const GroupedCta g = grouped_cta(unsigned(piece.block), m_blocks, p.B * p.H, p.head_group);
    m_block = m_blocks - 1 - g.rank;
    h = g.hb % p.H;
    b = g.hb / p.H;
  }
  const int m0 = m_block * kBM;
  const int n_end = p.causal ? min(p.J, m0 + kBM + p.J - p.I) : p.J;
  const int n_all = n_end > 0 ? (n_end + kBN - 1) / kBN : 0;
  const int jb0 = split_piece_first(n_all, piece.piece, piece.pieces);
  return {m0, h, h / (p.H / p.Hkv), b, jb0, split_piece_first(n_all, piece.piece + 1, piece.pieces) - jb0};
}

template <typename T, int D, bool kOverlap, FwdL L, bool kBias = false, bool kOnline = false, bool kQRegs = false,
          bool kWG2 = false>
__global__ void __launch_bounds__(FwdWsTile<D, L, kFwdWsWG<D, kBias, kOnline, kWG2>>::kThreads, 1)
    fwd_hopper_ws_kernel(const __grid_constant__ FwdTmaMaps maps, const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = FwdWsTile<D, L, kFwdWsWG<D, kBias, kOnline, kWG2>>;
  constexpr int kWG = Tile::kWG, kBM = Tile::kBM, kBN = Tile::kBN, kNO = Tile::kNO, kStages = Tile::kStages;
  constexpr int kKT = D / 16;    // k-steps of Q K^T
  constexpr int kPT = kBN / 16;  // k-steps of P V
  constexpr int kBlock = kBN * kSw128Row;  // one 64-column block of a K / V stage
  // Named barriers: 1 .. kWG the MMA token of consumer c (id 1 + c), kWG + 1 the consumers' start.
  constexpr int kStartBar = kWG + 1;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw_addr + kSw128Atom - 1) & ~uint32_t(kSw128Atom - 1)) - raw_addr);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + Tile::kQBytes;                   // kStages x kKBytes
  unsigned char* sV = sK + kStages * Tile::kKBytes;         // kStages x kKBytes
  unsigned char* sOnes = sV + kStages * Tile::kKBytes;      // kOnesCols, kOnesMma
  uint64_t* bar_q = reinterpret_cast<uint64_t*>(sOnes + Tile::kOnesBytes);
  uint64_t* bar_full = bar_q + 1;
  uint64_t* bar_empty = bar_full + kStages;
  uint64_t* bar_q_free = bar_empty + kStages;
  int* split_flag = reinterpret_cast<int*>(bar_q_free + 1);  // the split tail's count (fwd_split_gather)

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp = (tid % 128) / 32;
  // This CTA's tiles (fwd_tile_work): first, first + stride, ... below count. A persistent grid
  // (the launcher's choice, without a bias or a split tail) has fewer CTAs than tiles, and each CTA
  // walks several: its producer loads the next tile's Q and first K / V blocks while the consumers
  // finish the last one. The K / V ring and the barriers' phases run on across tiles.
  constexpr bool kMaySplit = fwd_may_split<D, L, kBias, kOnline>;
  const unsigned tile_first = kBias ? 0u : blockIdx.x, tile_stride = kBias ? 1u : gridDim.x;
  const unsigned tile_count = fwd_may_persist<D, L, kBias, kOnline> ? unsigned((p.I + kBM - 1) / kBM) * p.B * p.H
                              : kBias                               ? 1u
                                                                    : gridDim.x;
  const int I = p.I, J = p.J;
  const int diag = J - I;  // causal: query r sees keys c <= r + diag

  if (tid == 0) {
    mbar_init(bar_q, 1);
    mbar_init(bar_q_free, 4 * kWG);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full + s, 1);
      mbar_init(bar_empty + s, 4 * kWG);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // Producer.
    regs_dealloc<Tile::kProducerRegs>();
    if (tid == 0) {
      tma_prefetch_map(&maps.q);
      tma_prefetch_map(&maps.k);
      tma_prefetch_map(&maps.v);
      int kv = 0;  // the K / V blocks loaded for this CTA so far
      for (unsigned tile = tile_first, it = 0; tile < tile_count; tile += tile_stride, ++it) {
        const FwdTileWork w = fwd_tile_work<kBM, kBN, kBias, kMaySplit>(p, tile);
        if (it > 0) mbar_wait(bar_q_free, (it - 1) & 1);  // every consumer warp is done with the last Q
        mbar_arrive_expect_tx(bar_q, Tile::kQBytes);
#pragma unroll
        for (int blk = 0; blk < D / 64; ++blk) {
          tma_load_4d(sQ + blk * kBM * kSw128Row, &maps.q, blk * 64, w.m0, w.h, w.b, bar_q);
        }
        for (int j = 0; j < w.n_blocks; ++j, ++kv) {
          const int s = kv % kStages;
          if (kv >= kStages) mbar_wait(bar_empty + s, ((kv / kStages) - 1) & 1);
          mbar_arrive_expect_tx(bar_full + s, 2 * Tile::kKBytes);
#pragma unroll
          for (int blk = 0; blk < D / 64; ++blk) {
            const int n = (w.jb0 + j) * kBN;
            tma_load_4d(sK + s * Tile::kKBytes + blk * kBlock, &maps.k, blk * 64, n, w.hkv, w.b, bar_full + s);
            tma_load_4d(sV + s * Tile::kKBytes + blk * kBlock, &maps.v, blk * 64, n, w.hkv, w.b, bar_full + s);
          }
        }
      }
    }
    return;
  }

  // Consumers.
  regs_alloc<Tile::kConsumerRegs>();
  const int c = wg - 1, ctid = tid - 128;
  const int g = lane / 4, t = lane % 4;
  if constexpr (L == FwdL::kOnesCols || L == FwdL::kOnesMma) {
    // The block of ones (every byte, so the swizzle does not matter).
    const uint32_t one2 = pack2<T>(1.f, 1.f);
    const uint4 ones = make_uint4(one2, one2, one2, one2);
    uint4* dst = reinterpret_cast<uint4*>(sOnes);
    for (int i = ctid; i < Tile::kOnesBytes / 16; i += 128 * kWG) dst[i] = ones;
    fence_proxy_async();
    named_bar_sync<kStartBar, 128 * kWG>();
  }
  const uint32_t aQ = smem_addr(sQ), aK = smem_addr(sK), aV = smem_addr(sV), aOnes = smem_addr(sOnes);
  const float scale_log2 = p.scale * kLog2e;
  const float offset_log2 = p.exp_kind ? 0.f : kOnline ? -scale_log2 : kFwdShiftLog2<T> - scale_log2;
  // Descriptors as a base plus offsets (desc_add).
  const uint64_t q_desc = make_desc(aQ + c * 64 * kSw128Row, 16, kSw128Atom);
  const uint64_t k_desc = make_desc(aK, 16, kSw128Atom);
  // kQRegs (d 128 without a bias): this warpgroup's Q as A fragments in 32 registers, loaded once
  // by ldmatrix, so that S = Q K^T reads only K from shared memory (6 KB -> 4 KB a k-step).
  constexpr bool kQR = kQRegs && D == 128 && !kBias;
  const bool has_mask = p.mask != nullptr;
  // The consumer warp is done reading `stage` (its P V wgmma completed).
  auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_empty + stage);
  };
  // The consumer warp is done reading this tile's Q (held in registers, or its last S completed).
  auto release_q = [&] {
    fence_proxy_async();
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_q_free);
  };
  // The MMA token: consumer c waits for its turn (id 1 + c), then hands it to c + 1. The last
  // hand-over of the last consumer in a tile is skipped (nobody waits for it); the first turn of
  // consumer 0 in a tile is given by consumer kWG - 1 at its start.
  auto token_wait = [&] {
    if constexpr (kOverlap) asm volatile("bar.sync %0, %1;\n" ::"r"(1 + c), "n"(256) : "memory");
  };
  auto token_pass = [&](bool last) {
    if constexpr (kOverlap) {
      if (!(last && c == kWG - 1)) asm volatile("bar.arrive %0, %1;\n" ::"r"(1 + (c + 1) % kWG), "n"(256) : "memory");
    }
  };

  int kv = 0;  // the K / V blocks consumed so far (the producer's count)
  for (unsigned tile = tile_first, it = 0; tile < tile_count; tile += tile_stride, ++it) {
    const FwdTileWork w = fwd_tile_work<kBM, kBN, kBias, kMaySplit>(p, tile);
    const int m0 = w.m0, h = w.h, b = w.b, jb0 = w.jb0, n_blocks = w.n_blocks;
    const int wg_row0 = m0 + c * 64;
    const int row0 = wg_row0 + warp * 16 + g;  // this thread's rows: row0, row0 + 8

    float rO[kNO / 2];
#pragma unroll
    for (int i = 0; i < kNO / 2; ++i) rO[i] = 0.f;
    float rLt[2] = {0.f, 0.f};  // fp32 row sums of the unrounded P (this thread's columns)
    float rLr[2] = {0.f, 0.f};  // kPackedSum: fp32 row sums of the 16-bit P
    float rL[4] = {0.f, 0.f, 0.f, 0.f};  // kOnesMma: P [1 x 8] (every column a row sum)
    float rM[2] = {-INFINITY, -INFINITY};  // kOnline: running row max of the log2 logits
    float rAlpha[2] = {1.f, 1.f};  // kOnline: the last block's rescale of O and l, applied by rescale_out
    FwdBias<kBN> bias;
    if constexpr (kBias) {
      bias.init(p, b, h, row0, t);
      bias.prefetch(0);  // while Q and K_0 land
    }

    uint32_t rQ[kQR ? kKT : 1][4];
    auto issue_s = [&](float (&rS)[kBN / 2], int stage) {
      const uint64_t k_desc_s = desc_add(k_desc, stage * Tile::kKBytes);
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk) {
        const uint64_t db = desc_add(k_desc_s, (kk / 4) * kBlock + (kk % 4) * 32);
        if constexpr (kQR) {
          Wgmma<T, kBN>::template rs<0>(rS, rQ[kk], db, kk > 0);
        } else {
          const uint64_t da = desc_add(q_desc, (kk / 4) * kBM * kSw128Row + (kk % 4) * 32);
          Wgmma<T, kBN>::template ss<0, 0>(rS, da, db, kk > 0);
        }
      }
    };
    auto issue_pv = [&](const uint32_t (&rP)[kPT][4], int stage) {
      const uint32_t aVs = aV + stage * Tile::kKBytes;
      const uint32_t lbo = Tile::kOnesSum ? aOnes - aVs : uint32_t(kBlock);
      const uint64_t v_desc = make_desc(aVs, lbo, kSw128Atom);
#pragma unroll
      for (int kk = 0; kk < kPT; ++kk) {
        Wgmma<T, kNO>::template rs<1>(rO, rP[kk], desc_add(v_desc, kk * 16 * kSw128Row), 1);
        if constexpr (L == FwdL::kOnesMma) Wgmma<T, 8>::template rs<1>(rL, rP[kk], make_desc(aOnes, 16, 0), 1);
      }
    };
    // rO (and rL) were written by a wgmma that has completed.
    auto fence_out = [&] {
      fence_regs(rO);
      if constexpr (L == FwdL::kOnesMma) fence_regs(rL);
    };
    // kOnline: O and l (the ones columns of rO, or rL) from the previous block's max to the current
    // one, once every P V wgmma under the previous max has completed; the fences keep the products
    // ahead of the next wgmma_fence.
    auto rescale_out = [&] {
      if constexpr (kOnline) {
#pragma unroll
        for (int i = 0; i < kNO / 2; ++i) rO[i] *= rAlpha[(i / 2) % 2];
        if constexpr (L == FwdL::kOnesMma) {
#pragma unroll
          for (int i = 0; i < 4; ++i) rL[i] *= rAlpha[i / 2];
        }
        fence_out();
      }
    };
    // P = exp2(logit in log2 units) in place; keys past J, masked keys and keys above the causal
    // diagonal give 0. The key mask: bit 2 q + e of `keep` is this thread's column n0 + 8 q + 2 t + e.
    // kBias: rB is the block's bias (0 where not loaded). kOnline: the logits (-inf where P = 0) go
    // to online_exp, which sets rAlpha and rescales rLt (rLr) at once.
    const uint8_t* gMask = has_mask ? p.mask + int64_t(b) * p.mask_b_stride : nullptr;
    // j: the CTA's key block (jb0 + j of the row's; kBias never splits, jb0 0 for its bias loads).
    auto exp_block = [&](float (&rS)[kBN / 2], const float (&rB)[kBias ? kBN / 2 : 1], int j) {
      const int n0 = (jb0 + j) * kBN;
      const bool elementwise = has_mask || n0 + kBN > J || (p.causal && n0 + kBN - 1 > wg_row0 + diag);
      uint32_t keep = 0xffffffffu;
      if (has_mask) {
        keep = 0;
#pragma unroll
        for (int q = 0; q < kBN / 8; ++q)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = n0 + 8 * q + 2 * t + e;
            keep |= uint32_t(col < J && gMask[int64_t(col) * p.mask_j_stride] != 0) << (2 * q + e);
          }
      }
      if (!elementwise) {
#pragma unroll
        for (int i = 0; i < kBN / 2; ++i) {
          float x = fmaf(rS[i], scale_log2, offset_log2);
          if constexpr (kBias) x = fmaf(rB[i], kLog2e, x);
          if constexpr (kOnline) {
            rS[i] = x;
          } else {
            const float pe = fast_exp2(x);
            rS[i] = pe;
            rLt[(i / 2) % 2] += pe;
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < kBN / 2; ++i) {
          const int col = n0 + (i / 4) * 8 + 2 * t + (i % 2);
          const int r = row0 + 8 * ((i / 2) % 2);
          const bool ok = col < J && (!p.causal || col <= r + diag) && ((keep >> (2 * (i / 4) + (i % 2))) & 1u);
          if constexpr (kBias || kOnline) {
            float x = fmaf(rS[i], scale_log2, offset_log2);
            if constexpr (kBias) x = fmaf(rB[i], kLog2e, x);
            if constexpr (kOnline) {
              rS[i] = ok ? x : -INFINITY;
            } else {
              const float pe = ok ? fast_exp2(x) : 0.f;
              rS[i] = pe;
              rLt[(i / 2) % 2] += pe;
            }
          } else {  // the measured default's form (the one above compiles the plain kernel differently)
            const float pe = ok ? fast_exp2(fmaf(rS[i], scale_log2, offset_log2)) : 0.f;
            rS[i] = pe;
            rLt[(i / 2) % 2] += pe;
          }
        }
      }
      if constexpr (kOnline) {
        online_exp(rS, rM, rAlpha, rLt);
        if constexpr (L == FwdL::kPackedSum) {
          rLr[0] *= rAlpha[0];  // the packed sums so far (P_{j-1} included: pack_p ran)
          rLr[1] *= rAlpha[1];
        }
      }
    };
    // P -> 16-bit A fragments (and, without the ones columns, their row sums).
    auto pack_p = [&](uint32_t (&rP)[kPT][4], const float (&rS)[kBN / 2]) {
#pragma unroll
      for (int kk = 0; kk < kPT; ++kk) {
        acc_to_frag<T>(rP[kk], rS, kk);
        if constexpr (L == FwdL::kPackedSum) {
          // The two 16-bit values of each packed pair, summed in fp32.
          const float2 p0 = unpack2<T>(rP[kk][0]), p1 = unpack2<T>(rP[kk][1]);
          const float2 p2 = unpack2<T>(rP[kk][2]), p3 = unpack2<T>(rP[kk][3]);
          rLr[0] += (p0.x + p0.y) + (p2.x + p2.y);
          rLr[1] += (p1.x + p1.y) + (p3.x + p3.y);
        }
      }
    };

    mbar_wait(bar_q, it & 1);
    if constexpr (kQR) {
      // Lane l gives row l % 16 of the warp's 16 and 16-byte chunk l / 16 of the k-step (swizzled by
      // the row % 8): matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15), the wgmma A fragment order.
      const int qrow = c * 64 + warp * 16 + lane % 16;
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk) {
        const int chunk = ((kk % 4) * 2 + lane / 16) ^ (qrow % 8);
        ldmatrix_x4(rQ[kk], sQ + (kk / 4) * kBM * kSw128Row + qrow * kSw128Row + chunk * 16);
      }
      release_q();
    }
    if (n_blocks > 0) {
      if constexpr (kOverlap) {
        if (c == kWG - 1) asm volatile("bar.arrive %0, %1;\n" ::"r"(1), "n"(256) : "memory");
        float rS[kBN / 2];
        float rB[kBias ? kBN / 2 : 1];
        uint32_t rP[kPT][4];
        mbar_wait(bar_full + kv % kStages, (kv / kStages) & 1);
        token_wait();
        wgmma_fence();
        issue_s(rS, kv % kStages);
        wgmma_commit();
        token_pass(false);
        if constexpr (kBias) {
          bias.load(rB, 0);
          if (n_blocks > 1) bias.prefetch(kBN);
        }
        wgmma_wait<0>();
        fence_regs(rS);
        exp_block(rS, rB, 0);  // kOnline: O and l are still 0, nothing to rescale
        pack_p(rP, rS);
        for (int j = 1; j < n_blocks; ++j) {
          const int stage = (kv + j) % kStages, prev = (kv + j - 1) % kStages;
          mbar_wait(bar_full + stage, ((kv + j) / kStages) & 1);
          token_wait();
          wgmma_fence();
          issue_s(rS, stage);
          wgmma_commit();
          issue_pv(rP, prev);
          wgmma_commit();
          token_pass(false);
          if constexpr (kBias) {  // in flight while the MMAs run
            bias.load(rB, j * kBN);
            if (j + 1 < n_blocks) bias.prefetch((j + 1) * kBN);
          }
          wgmma_wait<1>();  // S_j
          fence_regs(rS);
          exp_block(rS, rB, j);  // kOnline: the max m_j; lt rescaled, O and l not yet
          if constexpr (kOnline) keep_ahead_of_wait(rLt);
          wgmma_wait<0>();  // P_{j-1} V_{j-1}
          fence_out();
          rescale_out();   // kOnline: O and l (all of P_0 .. P_{j-1} in now) from m_{j-1} to m_j
          hold_frags(rP);  // P_{j-1} stays in its registers until its wgmma completed
          release(prev);
          pack_p(rP, rS);
        }
        token_wait();
        wgmma_fence();
        issue_pv(rP, (kv + n_blocks - 1) % kStages);
        wgmma_commit();
        token_pass(true);
        wgmma_wait<0>();
        fence_out();
        hold_frags(rP);
        release((kv + n_blocks - 1) % kStages);
      } else {
        for (int j = 0; j < n_blocks; ++j) {
          const int stage = (kv + j) % kStages;
          mbar_wait(bar_full + stage, ((kv + j) / kStages) & 1);
          float rS[kBN / 2];
          float rB[kBias ? kBN / 2 : 1];
          wgmma_fence();
          issue_s(rS, stage);
          wgmma_commit();
          if constexpr (kBias) {
            bias.load(rB, j * kBN);
            if (j + 1 < n_blocks) bias.prefetch((j + 1) * kBN);
          }
          wgmma_wait<0>();
          fence_regs(rS);
          exp_block(rS, rB, j);
          rescale_out();  // kOnline: P_{j-1} V_{j-1} completed in the previous step
          uint32_t rP[kPT][4];
          pack_p(rP, rS);
          wgmma_fence();
          issue_pv(rP, stage);
          wgmma_commit();
          wgmma_wait<0>();
          fence_out();
          hold_frags(rP);
          release(stage);
        }
      }
    }
    if constexpr (!kQR) release_q();

    // A piece of a split block: its parts to its slot; the last piece adds them all and goes on (the
    // split grid has one tile a CTA).
    if constexpr (kMaySplit) {  // the piece again (fewer registers live through the loop)
      const SplitPiece tail = split_piece(p, tile);
      if (tail.pieces > 1 && !fwd_split_gather<kWG, kStartBar>(p, tail, rO, rLt, ctid, split_flag)) return;
    }
    // O / l, and lt (the rows' fp32 sums of the unrounded P) for the backward; kUnrounded's l is lt.
    float lt[2], l[2];
#pragma unroll
    for (int e0 = 0; e0 < 2; ++e0) {
      lt[e0] = quad_sum(rLt[e0]);
      l[e0] = Tile::kOnesSum            ? rO[4 * (D / 8) + 2 * e0]
              : L == FwdL::kOnesMma     ? rL[2 * e0]
              : L == FwdL::kPackedSum   ? quad_sum(rLr[e0])
                                        : lt[e0];
    }
    store_fwd_rows<T, D, kOnline>(p, rO, l, lt, rM, b, h, row0, t);
    kv += n_blocks;
  }
#endif
}

}  // namespace flashcos::cuda::hopper
