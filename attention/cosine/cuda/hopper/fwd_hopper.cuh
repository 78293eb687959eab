// The Hopper family's forward launcher: which kernel of fwd_hopper_ws.cuh runs. The kernel, its
// math and its synchronisation: fwd_hopper_ws.cuh. It takes every 16-bit forward (key mask or none,
// attention bias or none, fixed offset or online max): four instances per schedule, with or without
// a bias (kBias) and the online max (kOnline, fwd_needs_online in params.h). The cp.async forward
// that every thread loaded for (the default until 2026-11-25; forward TFLOP/s H100 bf16 b4 h8
// n 8192 d64 / d128: 383 / 426 against 570 / 660 for the default now) was removed once the
// warp-specialised kernel replaced it; inputs the TMA unit cannot address go to the sm_80 kernels
// (launch.cu).
#pragma once

#include <cstdlib>
#include <string>
#include <type_traits>

#include "attention/common/cuda/env_switch.h"
#include "attention/cosine/cuda/hopper/fwd_launch_ws.cuh"
#include "attention/cosine/cuda/hopper/fwd_rows.h"

namespace flashcos::cuda {

// Which Hopper forward runs (FLASHCOS_HOPPER_FWD, read once): "ws-overlap" (default) the
// warp-specialised kernel with its overlapped schedule, "ws" the same without the overlap; o divided
// by the fp32 sum of the unrounded P in both. "ws-rounded" the default schedule dividing by the sum
// of the 16-bit P from the tensor cores (d 64 ones columns, d 128 an n8 wgmma: the default until
// 2026-11-26 night), "ws-packed" that sum from the packed P (FwdL::kPackedSum, d 128). d 128 with a
// bias runs without the overlap whatever the choice: overlapped, S_j, P_{j-1}, O, l and the block's
// 64 bias values would live in registers at once (228 of the 240 with the n8 wgmma's l), and ptxas
// spilled 140 to 350 bytes; without the overlap nothing spills. The bias forward is bound by the
// bias's bandwidth anyway (fwd_logits.cuh). Not timed yet. At d 128 without a bias every overlapped
// kind holds Q in registers as S's A operand (kQRegs, since 2026-11-27); "ws-qsmem" is the default
// with Q read from shared memory instead (H100 run N5: 1-3 % slower).
enum class HopperFwdKind { kOverlap, kPlain, kOverlapPackedSum, kOverlapRounded, kOverlapQSmem };
inline HopperFwdKind hopper_fwd_kind() {
  static const HopperFwdKind kind = [] {
    const char* env = std::getenv("FLASHCOS_HOPPER_FWD");
    const std::string s = env != nullptr ? env : "";
    return s == "ws"             ? HopperFwdKind::kPlain
           : s == "ws-packed"    ? HopperFwdKind::kOverlapPackedSum
           : s == "ws-rounded"   ? HopperFwdKind::kOverlapRounded
           : s == "ws-qsmem"     ? HopperFwdKind::kOverlapQSmem
                                 : HopperFwdKind::kOverlap;
  }();
  return kind;
}

// d 64 without a bias or the online max: 2 consumer warpgroups (128-row CTAs) instead of 3 (192-row
// CTAs) where the grid estimate says so (hopper/fwd_rows.h: short sequences), into *two.
// FLASHCOS_HOPPER_FWD_WG=2 or 3 (read once) forces one, for tests and comparisons.
inline cudaError_t fwd_two_warpgroups(const FwdParams& p, bool* two) {
  static const int forced = env_count("FLASHCOS_HOPPER_FWD_WG", 0);
  if (forced == 2 || forced == 3) {
    *two = forced == 2;
    return cudaSuccess;
  }
  hopper::FwdGridShape shape;
  const cudaError_t err = current_device_sm_count(&shape.sms);
  if (err != cudaSuccess) return err;
  shape.heads_batches = int64_t(p.B) * p.H;
  shape.I = p.I;
  shape.J = p.J;
  shape.causal = p.causal;
  *two = hopper::fwd_prefer_128_rows(shape);
  return cudaSuccess;
}

// One schedule: the instance for the bias and the online max of p.
template <typename T, int D, bool kOverlap, hopper::FwdL L, bool kQRegs = false>
cudaError_t launch_fwd_hopper_case(const FwdParams& p, cudaStream_t stream) {
  const bool online = fwd_needs_online(p, std::is_same_v<T, __half>);
  if (p.bias != nullptr) {
    constexpr bool kBiasOverlap = kOverlap && D == 64;  // d 128: see hopper_fwd_kind
    constexpr hopper::FwdL kBiasL = D == 128 && L == hopper::FwdL::kPackedSum ? hopper::kDefaultFwdL : L;
    return online ? launch_fwd_hopper_ws<T, D, kBiasOverlap, kBiasL, true, true>(p, stream)
                  : launch_fwd_hopper_ws<T, D, kBiasOverlap, kBiasL, true, false>(p, stream);
  }
  if constexpr (D == 64 && kOverlap && L == hopper::kDefaultFwdL && kQRegs) {  // the default kind only
    bool two = false;
    if (!online) {
      const cudaError_t err = fwd_two_warpgroups(p, &two);
      if (err != cudaSuccess) return err;
    }
    if (two) return launch_fwd_hopper_ws<T, D, true, L, false, false, true, true>(p, stream);
  }
  return online ? launch_fwd_hopper_ws<T, D, kOverlap, L, false, true, kQRegs>(p, stream)
                : launch_fwd_hopper_ws<T, D, kOverlap, L, false, false, kQRegs>(p, stream);
}

// The pieces of p's split tail (0: none; hopper/split_tail.h) and, in *slot_floats, the floats of a
// piece's slot in FwdParams::split_scratch, for the caller to allocate with as many zeroed counters
// (run_fwd_split_slots, launch.cu). The CTA rows are those launch_fwd_hopper_case picks: 64 per
// consumer warpgroup, d 64 128 where fwd_two_warpgroups says so; the instances that may split are the
// fixed offset's without a bias at d 64 (hopper::fwd_may_split), and a slot fits the larger tile.
template <typename T, int D>
int64_t hopper_split_slots(const FwdParams& p, int* slot_floats) {
  constexpr int kWG = hopper::kFwdWsWG<D, false, false>;
  *slot_floats = hopper::fwd_split_slot_floats(D / 2, kWG);
  const HopperFwdKind kind = hopper_fwd_kind();
  if (!hopper::fwd_may_split<D, hopper::kDefaultFwdL, false, false> || p.bias != nullptr || p.causal ||
      fwd_needs_online(p, std::is_same_v<T, __half>) ||
      kind == HopperFwdKind::kOverlapPackedSum || kind == HopperFwdKind::kOverlapRounded) {
    return 0;
  }
  int bm = 64 * kWG;
  if (D == 64 && kind == HopperFwdKind::kOverlap) {
    bool two = false;
    if (fwd_two_warpgroups(p, &two) != cudaSuccess) return 0;
    if (two) bm = 128;
  }
  int sms = 0;
  if (current_device_sm_count(&sms) != cudaSuccess) return 0;
  const hopper::TailSplit split = hopper_fwd_split(p, bm, sms);
  return int64_t(split.units) * split.pieces;
}

// The forward, or cudaErrorNotSupported (nothing ran) where the TMA unit cannot address the inputs.
template <typename T, int D>
cudaError_t launch_fwd_hopper(const FwdParams& p, cudaStream_t stream) {
  constexpr hopper::FwdL kDefault = hopper::kDefaultFwdL;
  constexpr hopper::FwdL kPacked = D == 128 ? hopper::FwdL::kPackedSum : hopper::FwdL::kOnesCols;
  switch (hopper_fwd_kind()) {
    case HopperFwdKind::kPlain:
      return launch_fwd_hopper_case<T, D, false, kDefault>(p, stream);
    case HopperFwdKind::kOverlapPackedSum:
      return launch_fwd_hopper_case<T, D, true, kPacked, true>(p, stream);
    case HopperFwdKind::kOverlapQSmem:
      return launch_fwd_hopper_case<T, D, true, kDefault>(p, stream);
    case HopperFwdKind::kOverlapRounded:
      return launch_fwd_hopper_case<T, D, true, hopper::kRoundedFwdL<D>, true>(p, stream);
    default:
      return launch_fwd_hopper_case<T, D, true, kDefault, true>(p, stream);
  }
}

}  // namespace flashcos::cuda
