// The Hopper family's backward launchers: the tensor maps and the launch of bwd_hopper_ws.cuh's
// kernel (launch_bwd_hopper_ws), and which instance runs, with how many query rows per step. The
// kernel, its math and its synchronisation: bwd_hopper_ws.cuh. The cp.async backward that every
// thread loaded for (the default until 2026-11-25; backward TFLOP/s H100 bf16 b4 h8 n 8192 d64 /
// d128: 308 / 363 against 347 / 432 then) was removed once the warp-specialised kernel replaced it;
// inputs the TMA unit cannot address go to the sm_80 kernels (launch.cu).
#pragma once

#include <cstdlib>
#include <string>
#include <type_traits>

#include "attention/cosine/cuda/dq_finish.cuh"
#include "attention/cosine/cuda/dq_grid.cuh"
#include "attention/common/cuda/env_switch.h"
#include "attention/cosine/cuda/hopper/bwd_hopper_ws.cuh"
#include "attention/cosine/cuda/hopper/persistent_grid.h"
#include "attention/cosine/cuda/tuning.h"

namespace flashcos::cuda {

// The knobs of the backward's order of work (hopper::choose_bwd_order, where the defaults and their
// timings are), read once from the environment: FLASHCOS_HOPPER_DET_ROTATE=0 (the deterministic
// mode in key-block order over every head, as before 2026-11-26 night), FLASHCOS_HOPPER_DET_BAND,
// FLASHCOS_HOPPER_CAUSAL_GROUP (a fixed group size, 0: key block slowest over every head; unset:
// 2, grown on short sequences) and
// FLASHCOS_HOPPER_DET_CAUSAL_GROUP (head groups with the steps forwards for the deterministic causal
// backward; 0: over every head).
inline const hopper::BwdOrderKnobs& hopper_bwd_order_knobs() {
  static const hopper::BwdOrderKnobs knobs = [] {
    hopper::BwdOrderKnobs k;
    k.det_orders = env_switch_on("FLASHCOS_HOPPER_DET_ROTATE");
    k.det_band = env_count("FLASHCOS_HOPPER_DET_BAND", k.det_band);
    k.causal_group = env_count("FLASHCOS_HOPPER_CAUSAL_GROUP", k.causal_group);
    k.causal_group_fixed = env_count("FLASHCOS_HOPPER_CAUSAL_GROUP", -1) >= 0;
    k.det_causal_group = env_count("FLASHCOS_HOPPER_DET_CAUSAL_GROUP", k.det_causal_group);
    return k;
  }();
  return knobs;
}

// FLASHCOS_HOPPER_BWD_DS_FP32=1 (read once): the plain kernel, in 80-row steps at d 128 too, with
// dS = P (dP - D_i) in fp32, rounded once, as before the paired product (kPairDs in bwd_hopper_ws.cuh,
// bwd_ds.cuh; a comparison variant, on a grid of a CTA an item). fp16's exp kind always forms dS so: its
// P is not <= 1, so the paired product's shifted P could overflow (FLASHCOS_HOPPER_BWD=ws-atomic's fp16
// instances form every dS so: bwd_hopper_ws.cuh, kPairDs).
inline bool hopper_bwd_ds_fp32() {
  static const bool on = env_count("FLASHCOS_HOPPER_BWD_DS_FP32", 0) > 0;
  return on;
}

// FLASHCOS_HOPPER_BWD_ROW_GRID=1 (read once): the causal 80-row steps on the 80-row grid, as before
// 2026-11-28, instead of from the first row that sees the key block (hopper::bwd_rows; a comparison
// variant).
inline bool hopper_bwd_rows_on_grid() {
  static const bool on = env_count("FLASHCOS_HOPPER_BWD_ROW_GRID", 0) > 0;
  return on;
}

// FLASHCOS_HOPPER_BWD_EARLY_LOADS=0 (read once): the backward's K, V and each stage's Q, dO requested
// where they were before 2026-11-29 (BwdParams::bwd_early_loads; a comparison variant).
inline bool hopper_bwd_early_loads() {
  static const bool on = env_switch_on("FLASHCOS_HOPPER_BWD_EARLY_LOADS");
  return on;
}

// Which kernel (FLASHCOS_HOPPER_BWD, read once): "ws" (default) dQ added by the producer's TMA
// reductions from shared memory, "ws-atomic" by the consumers' atomics, "ws-det-serial" the default
// with the deterministic mode's counter polled only once the consumer's tile is there (kDetAhead
// off; the default until 2026-11-26). Timings of each: docs/performance.md section 1 and
// docs/kernels-tried.md, "Timings of the versions".
enum class HopperBwdKind { kTma, kAtomic, kTmaDetSerial };
inline HopperBwdKind hopper_bwd_kind() {
  static const HopperBwdKind kind = [] {
    const char* env = std::getenv("FLASHCOS_HOPPER_BWD");
    const std::string s = env != nullptr ? env : "";
    return s == "ws-atomic" ? HopperBwdKind::kAtomic
           : s == "ws-det-serial" ? HopperBwdKind::kTmaDetSerial
                                  : HopperBwdKind::kTma;
  }();
  return kind;
}

// FLASHCOS_HOPPER_BWD_SPLIT=0 (read once): no split tail (hopper/split_tail.h), for comparisons.
inline bool hopper_bwd_split_enabled() {
  static const bool on = env_switch_on("FLASHCOS_HOPPER_BWD_SPLIT");
  return on;
}

// The split tail (hopper/split_tail.h) of the plain backward's default kind without a causal mask, in
// steps of bm query rows, on sms SMs; none otherwise. At most 2 x sms pieces: their dK / dV slots
// (BwdParams::split_scratch) take 256 x 128 floats each at d 128, 33 MiB on 132 SMs.
inline hopper::TailSplit hopper_bwd_split(const BwdParams& p, int bm, int sms) {
  if (!hopper_bwd_split_enabled() || p.causal || p.bias != nullptr || p.dq_semaphore != nullptr ||
      hopper_bwd_kind() != HopperBwdKind::kTma) {
    return {};
  }
  const int64_t blocks = int64_t((p.J + 127) / 128) * p.Hkv * p.B;  // 128 keys a CTA (BwdWsTile::kBN)
  const int steps = (p.H / p.Hkv) * ((p.I + bm - 1) / bm);
  return hopper::choose_tail_split(blocks, steps, sms, 2 * int64_t(sms));
}

// The persistent grid's CTAs (hopper::persistent_ctas) for the plain instance's `items` (key blocks
// and split pieces, hopper::bwd_grid_items), or 0. FLASHCOS_HOPPER_BWD_PERSISTENT (read once,
// hopper::persistent_mode): unset, hopper::bwd_persistent_by_default; "0" never; "all" always; a count
// n >= 1 at most n CTAs (for tests).
inline int64_t hopper_bwd_persistent_ctas(bool by_default, int64_t items, int sms) {
  static const int64_t mode = hopper::persistent_mode(std::getenv("FLASHCOS_HOPPER_BWD_PERSISTENT"));
  return hopper::persistent_ctas(mode, by_default, items, sms);
}

// The delta kernel, then the backward; cudaErrorNotSupported (before anything ran) where the TMA
// unit cannot address the inputs, so that the caller can run the sm_80 kernels instead.
template <typename T, int D, int BM, bool kTmaDq, bool kDetAhead = false>
cudaError_t launch_bwd_hopper_ws(const BwdParams& p, cudaStream_t stream) {
  if constexpr (kTmaDq && hopper::BwdWsTile<D, BM, true>::kNQ != 64) {
    return launch_bwd_hopper_ws<T, D, BM, false>(p, stream);  // the 64-row d64 step (tuning variant 1)
  } else {
    constexpr DType kDType = std::is_same_v<T, __half> ? DType::kHalf : DType::kBFloat16;
    using Tile = hopper::BwdWsTile<D, BM, kTmaDq>;
    // Whether the kernel leaves the softmax scale out of dq_accum (for dq's conversion, or without
    // dq_out for the caller, through dq_scale_left, to apply).
    constexpr bool kUnscaled = hopper::bwd_dq_unscaled<T, Tile::kDqT>();
    if (kUnscaled && p.dq_out == nullptr && p.dq_scale_left == nullptr) return cudaErrorInvalidValue;
    hopper::BwdTmaMaps maps;
    // The maps have the head dim p.D (<= D): columns past it load as zeros.
    if (p.D > D) return cudaErrorNotSupported;
    // Deterministic with p.dq_grid: the kFixed instance (dQ rounded to each row's grid, whose sums
    // do not depend on the order of the adds) in the plain kernel's order. Not for
    // FLASHCOS_HOPPER_BWD=ws-det-serial (!kDetAhead), a comparison variant of the ordered adds.
    constexpr bool kMayFix = kTmaDq && kDetAhead;
    const bool fixed = kMayFix && p.dq_semaphore != nullptr && p.dq_grid != nullptr && p.dq_grid_kv != nullptr;
    const Sw128TileTensor q{p.q, kDType, p.B, p.H, p.I, p.D, p.q_b_stride, p.q_h_stride, p.q_i_stride};
    const Sw128TileTensor dout{p.dout, kDType, p.B, p.H, p.I, p.D, p.do_b_stride, p.do_h_stride, p.do_i_stride};
    const Sw128TileTensor k{p.k, kDType, p.B, p.Hkv, p.J, p.D, p.k_b_stride, p.k_h_stride, p.k_j_stride};
    const Sw128TileTensor v{p.v, kDType, p.B, p.Hkv, p.J, p.D, p.v_b_stride, p.v_h_stride, p.v_j_stride};
    cudaError_t mapped = make_sw128_tile_map(&maps.q, q, BM);
    if (mapped == cudaSuccess) mapped = make_sw128_tile_map(&maps.dout, dout, BM);
    if (mapped == cudaSuccess) mapped = make_sw128_tile_map(&maps.k, k, Tile::kBN);
    if (mapped == cudaSuccess) mapped = make_sw128_tile_map(&maps.v, v, Tile::kBN);
    if (mapped == cudaSuccess && kTmaDq) {
      mapped = make_f32_sw128_map(&maps.dq, p.dq_accum, p.B, p.H, p.I, p.D, Tile::kDqRows);
    }
    if (mapped != cudaSuccess) return tma_maps_launch_status(mapped);
    const int64_t key_blocks = (int64_t(p.J) + Tile::kBN - 1) / Tile::kBN;
    const int64_t blocks = key_blocks * p.Hkv * p.B;
    if (blocks > int64_t(INT32_MAX)) return cudaErrorInvalidConfiguration;
    if (fixed) {  // the rows' grid constants (dq_grid.cuh)
      const cudaError_t grid = launch_dq_grid_kv<T>(p, stream);  // the delta kernel writes the rows
      if (grid != cudaSuccess) return grid;
    }
    const cudaError_t err = launch_delta<T, float>(p, stream);
    if (err != cudaSuccess) return err;
    const bool det = p.dq_semaphore != nullptr && !fixed;
    int sms = 0;  // the deterministic rotated order keeps a band within the SMs; causal head groups fill them
    const cudaError_t attr = current_device_sm_count(&sms);
    if (attr != cudaSuccess) return attr;
    BwdParams banded = p;
    if (fixed) banded.dq_semaphore = nullptr;  // no turns: the plain kernel's order
    hopper::choose_bwd_order(banded, D, Tile::kBN, sms, hopper_bwd_order_knobs());
    banded.bwd_rows_on_grid = hopper_bwd_rows_on_grid();
    // The split tail, where the caller gave the slots for it (hopper_split_slots; none in the
    // deterministic mode: hopper_bwd_split).
    int64_t grid = blocks;
    banded.split_first = INT32_MAX;  // launcher-owned, as the order fields above
    banded.split_pieces = 1;
    if constexpr (kTmaDq && kDetAhead) {
      const hopper::TailSplit split = hopper_bwd_split(p, BM, sms);
      if (split.units > 0 && p.split_scratch != nullptr && p.split_count != nullptr &&
          int64_t(split.units) * split.pieces <= p.split_slots) {
        banded.split_first = int(blocks - split.units);
        banded.split_pieces = split.pieces;
        grid += int64_t(split.units) * (split.pieces - 1);
        if (grid > int64_t(INT32_MAX)) return cudaErrorInvalidConfiguration;
      }
    }
    const auto plain = hopper::bwd_hopper_ws_kernel<T, D, BM, false, kTmaDq>;
    auto kernel = plain;
    if constexpr (Tile::kDqT) {  // 80-row steps: the plain instance only (launch_bwd_hopper sends no other)
      if (det || fixed || p.bias != nullptr) return cudaErrorNotSupported;
    } else {
      if (p.bias != nullptr) {
        kernel = det ? hopper::bwd_hopper_ws_kernel<T, D, BM, true, kTmaDq, kDetAhead, true>
                     : hopper::bwd_hopper_ws_kernel<T, D, BM, false, kTmaDq, false, true>;
      } else if (det) {
        kernel = hopper::bwd_hopper_ws_kernel<T, D, BM, true, kTmaDq, kDetAhead>;
      }
      if constexpr (kMayFix) {
        if (fixed) {
          kernel = p.bias != nullptr ? hopper::bwd_hopper_ws_kernel<T, D, BM, false, true, false, true, true>
                                     : hopper::bwd_hopper_ws_kernel<T, D, BM, false, true, false, false, true>;
        }
      }
    }
    if constexpr (kTmaDq) {  // any step size
      const bool fp32_ds = hopper_bwd_ds_fp32() || (std::is_same_v<T, __half> && p.exp_kind);
      if (fp32_ds && !det && !fixed && p.bias == nullptr) {
        kernel = hopper::bwd_hopper_ws_kernel<T, D, BM, false, true, false, false, false, true>;
      }
    }
    // dq_out: converted by dq_finish_kernel, overlapped with the last wave where the dQ warps count
    // (kTmaDq: two counts per CTA), else after the kernel.
    const bool counted = kTmaDq && p.dq_out != nullptr && p.dq_done != nullptr;
    if (!counted) banded.dq_done = nullptr;
    // A persistent grid (the kernel's kPersist) where the plain instance of the default kind runs, on
    // tiles with room for its item queue, given the caller's counter; the others' grid has a CTA an
    // item (the deterministic orders' turns want the blocks of a band resident together, bwd_order.h).
    [[maybe_unused]] bool persistent = false;
    if constexpr (kTmaDq && kDetAhead && Tile::kMayPersist) {
      if (kernel == plain && p.item_counter != nullptr) {  // one CTA an SM (no room for a second)
        static_assert(2 * Tile::kSmem > 228 * 1024, "one CTA an SM");
        const bool by_default = hopper::bwd_persistent_by_default(std::is_same_v<T, __half>, D, p.causal);
        const int64_t ctas = hopper_bwd_persistent_ctas(by_default, grid, sms);
        if (ctas > 0) {
          grid = ctas;
          kernel = hopper::bwd_hopper_ws_kernel<T, D, BM, false, true, false, false, false, false, true>;
          persistent = true;
        }
      }
    }
    // Read by the 80-row instances on a grid of a CTA an item only (bwd_hopper_ws.cuh, kEarlyLoads).
    banded.bwd_early_loads = hopper_bwd_early_loads();
#ifdef FLASHCOS_BWD_TIMELINE
    // The plain instance's launches, on either grid (bwd_timeline.cuh).
    long long* const stamps = persistent || kernel == plain ? hopper::BwdTimeline::get().next(stream) : nullptr;
#endif
    const cudaError_t run =
        launch_with_smem(kernel, dim3(unsigned(grid)), Tile::kThreads, Tile::kSmem, stream, maps, banded);
#ifdef FLASHCOS_BWD_TIMELINE
    if (run == cudaSuccess && stamps != nullptr) {
      hopper::BwdTimeline::get().write(stream, int(grid), blocks, p.I, p.J, D, p.causal);
    }
#endif
    if (run != cudaSuccess) return run;
    // The scale the kernel left out of dq_accum (1 where it is in).
    const float dq_scale = kUnscaled ? p.scale : 1.f;
    if (p.dq_out == nullptr) {  // the caller keeps dq_accum
      if (kUnscaled) *p.dq_scale_left = dq_scale;
      return cudaSuccess;
    }
    // A whole block counts split_pieces per dQ warp, a piece 1 (bwd_dq_reduce).
    return launch_dq_finish<T>(banded, counted ? int(2 * key_blocks * banded.split_pieces) : 0, stream, dq_scale);
  }
}

// Query rows per backward step by tile variant (attention/cosine/cuda/tuning.h): variant 0 is in use,
// d64 variant 1 is the 64-row step (H100 bf16 n8192, TFLOP/s, cp.async kernel: 128 rows 298, 64
// rows 278; docs/kernels.md). d128: 64 here (128-row steps spill heavily there); launch_bwd_hopper
// takes 80-row steps instead where hopper_bwd_80_rows says so.
template <int D>
constexpr int hopper_bwd_rows(int variant) {
  return D == 64 && variant != 1 ? 128 : 64;
}

// Whether the d 128 backward takes 80-row steps (BwdWsTile::kDqT: 25 % more work per step for
// the same K / V operands, dQ^T by the consumers' column halves) instead of 64: the plain instance
// (not deterministic, no bias), causal or not. H100 run AA1 (b4 h8, backward TFLOP/s, three
// interleaved rounds): +2.5 to +5.5 % in six of the eight bf16 / fp16 x n 8192 / 16384 cases,
// -0.5 % at non-causal fp16 n 8192 and -1.2 % at causal bf16 n 8192, within those rounds' spread
// (docs/kernels-tried.md, "Versions tried" 20).
// FLASHCOS_HOPPER_BWD_ROWS=64 (read once) keeps 64-row steps everywhere.
inline bool hopper_bwd_80_rows(const BwdParams& p) {
  static const bool rows_64 = env_count("FLASHCOS_HOPPER_BWD_ROWS", 80) == 64;
  return !rows_64 && p.dq_semaphore == nullptr && p.bias == nullptr;
}

// The tile variant (FLASHCOS_HOPPER_BWD_VARIANT in tuning builds, read once; 0 otherwise).
inline int hopper_bwd_variant() {
  static const int variant = tuning_variant("FLASHCOS_HOPPER_BWD_VARIANT");
  return variant;
}

// Query rows per step of the backward that launch_bwd_hopper runs for p (the one place that decides).
template <int D>
int hopper_bwd_step_rows(const BwdParams& p) {
  if (D == 128 && hopper_bwd_kind() == HopperBwdKind::kTma && hopper_bwd_80_rows(p)) return 80;
  return hopper_bwd_rows<D>(hopper_bwd_variant());
}

// The pieces of p's split tail (0: none), each a slot of *slot_floats = 256 x D floats in
// BwdParams::split_scratch and a counter in split_count, for the caller to allocate
// (run_bwd_split_slots, launch.cu; the forward's overload: fwd_hopper.cuh).
template <typename T, int D>  // T: one instantiation per generated file (hopper/CMakeLists.txt)
int64_t hopper_split_slots(const BwdParams& p, int* slot_floats) {
  *slot_floats = 256 * D;
  int sms = 0;
  if (current_device_sm_count(&sms) != cudaSuccess) return 0;
  const hopper::TailSplit split = hopper_bwd_split(p, hopper_bwd_step_rows<D>(p), sms);
  return int64_t(split.units) * split.pieces;
}

// The delta kernel and the backward, or cudaErrorNotSupported (nothing ran) where the TMA unit
// cannot address the inputs.
template <typename T, int D>
cudaError_t launch_bwd_hopper(const BwdParams& p, cudaStream_t stream) {
  if constexpr (D == 128) {
    if (hopper_bwd_step_rows<D>(p) == 80) return launch_bwd_hopper_ws<T, 128, 80, true, true>(p, stream);
  }
  [[maybe_unused]] const int variant = hopper_bwd_variant();
  return FLASHCOS_VARIANT_SWITCH(variant, kV, [&] {
    constexpr int kBM = hopper_bwd_rows<D>(kV);
    switch (hopper_bwd_kind()) {
      case HopperBwdKind::kAtomic:
        return launch_bwd_hopper_ws<T, D, kBM, false>(p, stream);
      case HopperBwdKind::kTmaDetSerial:
        return launch_bwd_hopper_ws<T, D, kBM, true, false>(p, stream);
      default:
        return launch_bwd_hopper_ws<T, D, kBM, true, true>(p, stream);
    }
  });
}

}  // namespace flashcos::cuda
