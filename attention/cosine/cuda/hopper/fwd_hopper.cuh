// The Hopper family's forward launcher: which kernel of fwd_hopper_ws.cuh runs. The kernel, its
// math and its synchronisation: fwd_hopper_ws.cuh. The cp.async forward that every thread loaded
// for (the default until 2026-11-25; forward TFLOP/s H100 bf16 b4 h8 n 8192 d64 / d128: 383 / 426
// against 570 / 660 for the default now) was removed once the warp-specialised kernel replaced it;
// inputs the TMA unit cannot address go to the sm_80 kernels (launch.cu).
#pragma once

#include <cstdlib>
#include <string>

#include "attention/cosine/cuda/hopper/fwd_hopper_ws.cuh"

namespace flashcos::cuda {

// Which Hopper forward runs (FLASHCOS_HOPPER_FWD, read once): "ws-overlap" (default) the
// warp-specialised kernel with its overlapped schedule, "ws" the same without the overlap,
// "ws-packed" the default with d 128's l summed from the packed P (FwdL::kPackedSum; the default
// takes it from an n8 wgmma).
enum class HopperFwdKind { kOverlap, kPlain, kOverlapPackedSum };
inline HopperFwdKind hopper_fwd_kind() {
  static const HopperFwdKind kind = [] {
    const char* env = std::getenv("FLASHCOS_HOPPER_FWD");
    const std::string s = env != nullptr ? env : "";
    return s == "ws" ? HopperFwdKind::kPlain : s == "ws-packed" ? HopperFwdKind::kOverlapPackedSum : HopperFwdKind::kOverlap;
  }();
  return kind;
}

// The forward, or cudaErrorNotSupported (nothing ran) where the TMA unit cannot address the inputs.
template <typename T, int D>
cudaError_t launch_fwd_hopper(const FwdParams& p, cudaStream_t stream) {
  constexpr hopper::FwdL kPacked = D == 128 ? hopper::FwdL::kPackedSum : hopper::FwdL::kOnesCols;
  switch (hopper_fwd_kind()) {
    case HopperFwdKind::kPlain:
      return launch_fwd_hopper_ws<T, D, false>(p, stream);
    case HopperFwdKind::kOverlapPackedSum:
      return launch_fwd_hopper_ws<T, D, true, kPacked>(p, stream);
    default:
      return launch_fwd_hopper_ws<T, D, true>(p, stream);
  }
}

}  // namespace flashcos::cuda
