// The warp-specialised Hopper forward's launch (the kernel: fwd_hopper_ws.cuh): its TMA maps, its
// grid (row blocks in head groups under a causal mask, the split tail of d 64, or a persistent grid
// of one CTA per SM that walks the row blocks) and the launch. Which instance runs: fwd_hopper.cuh.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "attention/common/cuda/env_switch.h"
#include "attention/cosine/cuda/hopper/fwd_hopper_ws.cuh"
#include "attention/cosine/cuda/hopper/fwd_rows.h"
#include "attention/cosine/cuda/hopper/persistent_grid.h"

namespace flashcos::cuda {

// The forward's head groups (head_groups.h) for a grid of m_blocks row blocks per (b, head): 1 (each
// (b, head)'s blocks in turn) but under a causal mask, there grown until a group's CTAs fill the
// SMs. FLASHCOS_HOPPER_FWD_CAUSAL_GROUP=g (read once) fixes it for causal grids, for comparisons.
inline cudaError_t fwd_causal_head_group(const FwdParams& p, unsigned m_blocks, int* group) {
  static const int forced = env_count("FLASHCOS_HOPPER_FWD_CAUSAL_GROUP", 0);
  *group = 1;
  if (!p.causal) return cudaSuccess;
  if (forced > 0) {
    *group = forced;
    return cudaSuccess;
  }
  int sms = 0;
  const cudaError_t err = current_device_sm_count(&sms);
  if (err != cudaSuccess) return err;
  *group = hopper::filling_head_group(1, m_blocks, int64_t(p.B) * p.H, sms);
  return cudaSuccess;
}

// FLASHCOS_HOPPER_FWD_SPLIT=0 (read once): no split tail (hopper/split_tail.h), for comparisons.
inline bool hopper_fwd_split_enabled() {
  static const bool on = env_switch_on("FLASHCOS_HOPPER_FWD_SPLIT");
  return on;
}

// The split tail (hopper/split_tail.h) of a forward without a causal mask or a bias (the fixed
// offset: the instances of hopper::fwd_may_split, d 64), in CTAs of bm query rows, on sms SMs; none
// otherwise. Its steps are the rows' 128-key blocks. At most 2 x sms pieces: their slots take 34 x 384
// floats each (hopper::fwd_split_slot_floats), 13 MiB on 132 SMs.
inline hopper::TailSplit hopper_fwd_split(const FwdParams& p, int bm, int sms) {
  if (!hopper_fwd_split_enabled() || p.causal || p.bias != nullptr) return {};
  const int64_t ctas = int64_t((p.I + bm - 1) / bm) * p.H * p.B;
  return hopper::choose_tail_split(ctas, (p.J + 127) / 128, sms, 2 * int64_t(sms));
}

// The persistent grid's CTAs (hopper::persistent_ctas), or 0. FLASHCOS_HOPPER_FWD_PERSISTENT (read
// once, hopper::persistent_mode): unset, the grid is persistent without a causal mask; "0" never;
// "all" under a causal mask too; a count n >= 1 at most n CTAs, causal or not.
inline int64_t hopper_fwd_persistent_ctas(bool causal, int64_t tiles, int sms) {
  static const int64_t mode = hopper::persistent_mode(std::getenv("FLASHCOS_HOPPER_FWD_PERSISTENT"));
  return hopper::persistent_ctas(mode, !causal, tiles, sms);
}

// The warp-specialised forward, or cudaErrorNotSupported (nothing ran) where the TMA unit cannot
// address the inputs (the caller then runs the sm_80 kernels).
// kBias: p.bias is set; kOnline: fwd_needs_online(p) (the launcher picks both from p).
template <typename T, int D, bool kOverlap, hopper::FwdL L = hopper::kDefaultFwdL, bool kBias = false,
          bool kOnline = false, bool kQRegs = false, bool kWG2 = false>
cudaError_t launch_fwd_hopper_ws(const FwdParams& p, cudaStream_t stream) {
  using Tile = hopper::FwdWsTile<D, L, hopper::kFwdWsWG<D, kBias, kOnline, kWG2>>;
  constexpr DType kDType = std::is_same_v<T, __half> ? DType::kHalf : DType::kBFloat16;
  hopper::FwdTmaMaps maps;
  // The maps have the head dim p.D (<= D): columns past it load as zeros.
  if (p.D > D) return cudaErrorNotSupported;
  const Sw128TileTensor q{p.q, kDType, p.B, p.H, p.I, p.D, p.q_b_stride, p.q_h_stride, p.q_i_stride};
  const Sw128TileTensor k{p.k, kDType, p.B, p.Hkv, p.J, p.D, p.k_b_stride, p.k_h_stride, p.k_j_stride};
  const Sw128TileTensor v{p.v, kDType, p.B, p.Hkv, p.J, p.D, p.v_b_stride, p.v_h_stride, p.v_j_stride};
  cudaError_t mapped = make_sw128_tile_map(&maps.q, q, Tile::kBM);
  if (mapped == cudaSuccess) mapped = make_sw128_tile_map(&maps.k, k, Tile::kBN);
  if (mapped == cudaSuccess) mapped = make_sw128_tile_map(&maps.v, v, Tile::kBN);
  if (mapped != cudaSuccess) return tma_maps_launch_status(mapped);
  // With a bias (H, I, J) the batches of one (row block, head) run side by side, with a (B, I, J)
  // one the heads: the bias rows they read are the same (4 bytes a logit, the biased forward's bound).
  // Without a bias a 1-D grid of tiles (hopper::fwd_tile_work): a CTA for each, or one CTA an SM.
  const unsigned m_blocks = unsigned((p.I + Tile::kBM - 1) / Tile::kBM);
  const int64_t tiles = int64_t(m_blocks) * p.H * p.B;
  if (!kBias && tiles > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
  dim3 grid = !kBias ? dim3(unsigned(tiles))
                     : p.bias_batch_dim ? dim3(m_blocks * p.H, p.B, 1) : dim3(m_blocks * p.B, p.H, 1);
  FwdParams grouped = p;
  grouped.split_first = INT32_MAX;  // launcher-owned, as head_group
  grouped.split_pieces = 1;
  if (!kBias) {
    const cudaError_t err = fwd_causal_head_group(p, m_blocks, &grouped.head_group);
    if (err != cudaSuccess) return err;
  }
  // The split tail, where the caller gave the slots for it (hopper_split_slots).
  if constexpr (hopper::fwd_may_split<D, L, kBias, kOnline>) {
    if (p.split_scratch != nullptr && p.split_count != nullptr && p.split_slots > 0) {
      int sms = 0;
      const cudaError_t err = current_device_sm_count(&sms);
      if (err != cudaSuccess) return err;
      const hopper::TailSplit split = hopper_fwd_split(p, Tile::kBM, sms);
      const int64_t ctas = tiles + int64_t(split.units) * (split.pieces - 1);
      if (split.units > 0 && int64_t(split.units) * split.pieces <= p.split_slots && ctas <= int64_t(INT32_MAX)) {
        grouped.split_first = int(tiles - split.units);
        grouped.split_pieces = split.pieces;
        grid = dim3(unsigned(ctas));
      }
    }
  } else if constexpr (hopper::fwd_may_persist<D, L, kBias, kOnline>) {
    // A persistent grid: one CTA an SM (the tile's shared memory leaves room for no second).
    static_assert(2 * Tile::kSmem > 228 * 1024, "one CTA an SM");
    int sms = 0;
    const cudaError_t err = current_device_sm_count(&sms);
    if (err != cudaSuccess) return err;
    const int64_t ctas = hopper_fwd_persistent_ctas(p.causal, tiles, sms);
    if (ctas > 0) grid = dim3(unsigned(ctas));
  }
  return launch_with_smem(hopper::fwd_hopper_ws_kernel<T, D, kOverlap, L, kBias, kOnline, kQRegs, kWG2>, grid,
                          Tile::kThreads, Tile::kSmem, stream, maps, grouped);
}

}  // namespace flashcos::cuda
