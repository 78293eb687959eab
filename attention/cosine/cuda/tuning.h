// Tile variants for timing sweeps on the GPU machine.
//
// Each tensor-core kernel has a table of tile shapes per head dim (FwdTile / BwdTile); variant 0
// is the shape in use. A build configured with -DFLASHCOS_TUNING=ON also compiles variants
// 1 .. kTuningVariants - 1 and picks one per launch from the environment variables
// FLASHCOS_FWD_VARIANT / FLASHCOS_BWD_VARIANT (the Hopper backward: FLASHCOS_HOPPER_BWD_VARIANT;
// unset or out of range: 0; read once per process and kernel), so that one build can time every
// shape with `./train bench` (scripts/gpu_check.sh tune). Normal builds compile variant 0 only and ignore the variables. The switch from the
// runtime variant to the template argument is FLASHCOS_VARIANT_SWITCH in static_switch.h.
#pragma once

#include <cstdlib>

#include "attention/common/cuda/static_switch.h"

namespace flashcos::cuda {

constexpr int kTuningVariants = 4;

// Head dims whose kernels have a table of tile variants (the others have one shape).
template <int D>
constexpr bool kHasTileVariants = D == 64 || D == 128;

// The variant named by the environment variable `env` in tuning builds, else 0.
inline int tuning_variant(const char* env) {
#ifdef FLASHCOS_TUNING
  const char* s = std::getenv(env);
  const int v = s != nullptr ? std::atoi(s) : 0;
  return v >= 0 && v < kTuningVariants ? v : 0;
#else
  (void)env;
  return 0;
#endif
}

}  // namespace flashcos::cuda
