// Tile variants for timing sweeps on the GPU machine.
//
// Each tensor-core kernel has a table of tile shapes per head dim (FwdTile / BwdTile); variant 0
// is the shape in use. A build configured with -DFLASHCOS_TUNING=ON also compiles variants
// 1 .. kTuningVariants - 1 and picks one per launch from the environment variables
// FLASHCOS_FWD_VARIANT / FLASHCOS_BWD_VARIANT (unset or out of range: 0), so that one build can
// time every shape with `./train bench` (scripts/gpu_check.sh tune). Normal builds compile
// variant 0 only and ignore the variables.
#pragma once

#include <cstdlib>

namespace flashcos::cuda {

constexpr int kTuningVariants = 4;

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

// Runtime variant -> template argument; only 0 outside tuning builds.
#ifdef FLASHCOS_TUNING
#define FLASHCOS_VARIANT_SWITCH(VARIANT, CONST_NAME, ...)                \
  [&]() -> cudaError_t {                                                 \
    switch (VARIANT) {                                                   \
      case 1: { constexpr int CONST_NAME = 1; return __VA_ARGS__(); }    \
      case 2: { constexpr int CONST_NAME = 2; return __VA_ARGS__(); }    \
      case 3: { constexpr int CONST_NAME = 3; return __VA_ARGS__(); }    \
      default: { constexpr int CONST_NAME = 0; return __VA_ARGS__(); }   \
    }                                                                    \
  }()
#else
#define FLASHCOS_VARIANT_SWITCH(VARIANT, CONST_NAME, ...)                \
  [&]() -> cudaError_t {                                                 \
    (void)(VARIANT);                                                     \
    constexpr int CONST_NAME = 0;                                        \
    return __VA_ARGS__();                                                \
  }()
#endif
