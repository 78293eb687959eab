// The Hopper family's backward launchers: the tensor maps and the launch of bwd_hopper_ws.cuh's
// kernel (launch_bwd_hopper_ws), and which instance runs, with how many query rows per step. The
// kernel, its math and its synchronisation: bwd_hopper_ws.cuh. The cp.async backward that every
// thread loaded for (the default until 2026-11-25; backward TFLOP/s H100 bf16 b4 h8 n 8192 d64 /
// d128: 308 / 363 against 347 / 432 then) was removed once the warp-specialised kernel replaced it;
// inputs the TMA unit cannot address go to the sm_80 kernels (launch.cu).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "attention/cosine/cuda/hopper/bwd_hopper_ws.cuh"
#include "attention/cosine/cuda/tuning.h"

namespace flashcos::cuda {

// The deterministic backward's rotated order (not causal) and head groups with backward steps
// (causal; hopper::DqTurns), on unless FLASHCOS_HOPPER_DET_ROTATE=0 (read once): key-block order
// over every head, as before 2026-11-26 night, for comparison.
inline bool hopper_det_rotate() {
  static const bool on = [] {
    const char* env = std::getenv("FLASHCOS_HOPPER_DET_ROTATE");
    return env == nullptr || std::string(env) != "0";
  }();
  return on;
}

// The backward's CTA order (BwdParams::key_band): causal 1 (key block slowest), not causal every key
// block (fastest); deterministic and not causal, bands of 64 key blocks in the rotated order (the
// launcher keeps a band within the SMs), 8 (d 64 tiles) / 16 (d 128) in key-block order, or
// FLASHCOS_HOPPER_DET_BAND (read once). H100 bf16 b4 h8 n 8192 (64 key blocks), deterministic
// backward ms (run F2 of 2026-11-26 night): rotated, bands 8 / 16 / 32 / 64: d64 4.71 / 2.94-2.99 /
// 2.79-2.84 / 2.85-2.87, d128 8.11 (16) / 5.58 (32) / 5.48-5.50 (64); key-block order with 8 / 16:
// 3.07-3.11 and 5.95-5.96; not deterministic 2.47-2.65 and 4.84-4.93. Narrow rotated bands read
// many heads' Q / dO at once, spread over each head (16 heads' 2 or 4 MiB at band 8 / 16: past
// what L2 holds); in key-block order the block r of a band waits r steps before its first add.
template <int D>
int hopper_bwd_key_band(const BwdParams& p, int block_keys) {
  static const int det_band = [] {
    const char* env = std::getenv("FLASHCOS_HOPPER_DET_BAND");
    return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : hopper_det_rotate() ? 64 : D == 128 ? 16 : 8;
  }();
  const int n_blocks = (p.J + block_keys - 1) / block_keys;
  // A bias: key block slowest too, so that the CTAs running together are one key block's (b, head)s,
  // which share the bias rows they read and the dbias rows they add to (bwd_hopper_ws_kernel).
  if (p.causal || p.bias != nullptr) return 1;
  return p.dq_semaphore != nullptr ? std::min(det_band, n_blocks) : n_blocks;
}

// The causal backward's (b, kv head) groups (hopper::bwd_cta): FLASHCOS_HOPPER_CAUSAL_GROUP (read
// once; 0: key block slowest over every head, the order before 2026-11-26 night), else 2. H100 bf16
// b4 h8, causal backward TFLOP/s by group 0 / 1 / 2 / 4 / 8 (run F3, two rounds), n 8192 d64:
// 479-478 / 493-491 / 509-508 / 508-502 / 510-508, d128: 490-491 / 531-552 / 544-542 / 538-542 /
// 516-535; n 16384 d64: 460-449 / 520-519 / 516-510 / 515-517 / 505-511, d128: 515-511 / 582-580 /
// 580-580 / 577-574 / 565-567.
inline int hopper_bwd_head_group() {
  static const int group = [] {
    const char* env = std::getenv("FLASHCOS_HOPPER_CAUSAL_GROUP");
    return env != nullptr && std::atoi(env) >= 0 ? std::atoi(env) : 2;
  }();
  return group;
}

// Deterministic and causal: FLASHCOS_HOPPER_DET_CAUSAL_GROUP=G (read once) runs the key blocks in
// head groups of G with their steps forwards, in key-block order (0: over every head, the order
// before 2026-11-26 night); unset (-1), the default of launch_bwd_hopper_ws.
inline int hopper_det_causal_group() {
  static const int group = [] {
    const char* env = std::getenv("FLASHCOS_HOPPER_DET_CAUSAL_GROUP");
    return env != nullptr ? std::max(0, std::atoi(env)) : -1;
  }();
  return group;
}

// The delta kernel, then the backward; cudaErrorNotSupported (before anything ran) where the TMA
// unit cannot address the inputs, so that the caller can run the sm_80 kernels instead.
template <typename T, int D, int BM, bool kTmaDq, bool kDetAhead = false>
cudaError_t launch_bwd_hopper_ws(const BwdParams& p, cudaStream_t stream) {
  if constexpr (kTmaDq && hopper::BwdWsTile<D, BM, false>::kNQ != 64) {
    return launch_bwd_hopper_ws<T, D, BM, false>(p, stream);  // the 64-row d64 step (tuning variant 1)
  } else {
    constexpr DType kDType = std::is_same_v<T, __half> ? DType::kHalf : DType::kBFloat16;
    using Tile = hopper::BwdWsTile<D, BM, kTmaDq>;
    hopper::BwdTmaMaps maps;
    // The maps have the head dim p.D (<= D): columns past it load as zeros.
    if (p.D > D) return cudaErrorNotSupported;
    const Sw128TileTensor q{p.q, kDType, p.B, p.H, p.I, p.D, p.q_b_stride, p.q_h_stride, p.q_i_stride};
    const Sw128TileTensor dout{p.dout, kDType, p.B, p.H, p.I, p.D, p.do_b_stride, p.do_h_stride, p.do_i_stride};
    const Sw128TileTensor k{p.k, kDType, p.B, p.Hkv, p.J, p.D, p.k_b_stride, p.k_h_stride, p.k_j_stride};
    const Sw128TileTensor v{p.v, kDType, p.B, p.Hkv, p.J, p.D, p.v_b_stride, p.v_h_stride, p.v_j_stride};
    if (make_sw128_tile_map(&maps.q, q, BM) != cudaSuccess ||
        make_sw128_tile_map(&maps.dout, dout, BM) != cudaSuccess ||
        make_sw128_tile_map(&maps.k, k, Tile::kBN) != cudaSuccess ||
        make_sw128_tile_map(&maps.v, v, Tile::kBN) != cudaSuccess ||
        (kTmaDq && make_f32_sw128_map(&maps.dq, p.dq_accum, p.B, p.H, p.I, p.D, 64) != cudaSuccess)) {
      return cudaErrorNotSupported;
    }
    const int64_t blocks = (int64_t(p.J) + Tile::kBN - 1) / Tile::kBN * p.Hkv * p.B;
    if (blocks > int64_t(INT32_MAX)) return cudaErrorInvalidConfiguration;
    const cudaError_t err = launch_delta<T, float>(p, stream);
    if (err != cudaSuccess) return err;
    BwdParams banded = p;
    banded.key_band = hopper_bwd_key_band<D>(p, Tile::kBN);
    const bool det = p.dq_semaphore != nullptr;
    // Deterministic and causal: at d 64 head groups of 16 with the steps forwards, in key-block order
    // (the blocks of a group that start together wait for the ones below them; past the first wave
    // a block mostly launches after the one below it has passed its diagonal); at d 128 the plain
    // kernel's groups of 2 with each block's steps backwards (DqTurns). H100 bf16 b4 h8 causal
    // backward ms, n 8192 / 16384 (run F10; not deterministic d64 1.35 / 5.25-5.35, d128 2.41-2.63 /
    // 9.50-9.53): d64 forwards in groups of 2 / 4 / 8 / 16: 2.60 / 2.03 / 1.65 / 1.54 and 7.69 / 6.40-6.52
    // / 5.88-6.01 / 5.92-6.03, key-block order over every head 1.65 / 6.22, backwards in groups of
    // 2 1.89 / 6.47 (F6); d128 forwards 4.39-4.48 / 3.59-3.61 / 3.21 / 3.10-3.11 and 13.44-13.57 /
    // 11.90-12.18 / 11.59 / 11.45-11.52, backwards in groups of 2 2.90-2.91 / 11.03-11.04.
    if (p.causal && p.bias == nullptr) {
      const int det_group = hopper_det_causal_group() >= 0 ? hopper_det_causal_group() : D == 64 ? 16 : -1;
      if (!det) {
        banded.head_group = hopper_bwd_head_group();
      } else if (hopper_det_rotate() && det_group > 0) {
        banded.head_group = det_group;  // key-block order, each block's steps forwards
      } else if (hopper_det_rotate() && det_group < 0) {
        banded.head_group = hopper_bwd_head_group();
        banded.det_reverse = banded.head_group > 0;
      }
    }
    if (det && banded.key_band > 1 && hopper_det_rotate()) {
      // The rotated order (hopper::DqTurns) needs a band's CTAs resident together: one CTA per SM.
      int device = 0, sms = 0;
      cudaError_t attr = cudaGetDevice(&device);
      if (attr == cudaSuccess) attr = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      if (attr != cudaSuccess) return attr;
      banded.det_rotate = true;
      banded.key_band = std::min(banded.key_band, std::max(1, sms));
    }
    auto kernel = p.bias != nullptr ? (det ? hopper::bwd_hopper_ws_kernel<T, D, BM, true, kTmaDq, kDetAhead, true>
                                           : hopper::bwd_hopper_ws_kernel<T, D, BM, false, kTmaDq, false, true>)
                                    : (det ? hopper::bwd_hopper_ws_kernel<T, D, BM, true, kTmaDq, kDetAhead>
                                           : hopper::bwd_hopper_ws_kernel<T, D, BM, false, kTmaDq>);
    return launch_with_smem(kernel, dim3(unsigned(blocks)), Tile::kThreads, Tile::kSmem, stream, maps, banded);
  }
}

// Query rows per backward step by tile variant (attention/cosine/cuda/tuning.h): variant 0 is in use,
// d64 variant 1 is the 64-row step (H100 bf16 n8192, TFLOP/s, cp.async kernel: 128 rows 298, 64
// rows 278; docs/kernels.md). d128 has one shape: 128-row steps spill heavily there.
template <int D>
constexpr int hopper_bwd_rows(int variant) {
  return D == 64 && variant != 1 ? 128 : 64;
}

// Which kernel (FLASHCOS_HOPPER_BWD, read once): "ws" (default) dQ added by the producer's TMA
// reductions from shared memory, "ws-atomic" by the consumers' atomics, "ws-det-serial" the default
// with the deterministic mode's counter polled only once the consumer's tile is there (kDetAhead
// off; the default until 2026-11-26). Timings of each: docs/performance.md section 1 and
// docs/kernels.md, "Timings of the versions".
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

// The delta kernel and the backward, or cudaErrorNotSupported (nothing ran) where the TMA unit
// cannot address the inputs.
template <typename T, int D>
cudaError_t launch_bwd_hopper(const BwdParams& p, cudaStream_t stream) {
  [[maybe_unused]] static const int variant = tuning_variant("FLASHCOS_HOPPER_BWD_VARIANT");
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
