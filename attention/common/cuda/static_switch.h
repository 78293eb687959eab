// Runtime dtype / head dim -> template arguments, in one place (flash-attention's seam).
// Callers check supports_head_dim() first; the default branches only guard against misuse.
#pragma once

#define FLASHCOS_HEADDIM_SWITCH(HEADDIM, CONST_NAME, ...)                 \
  [&]() -> cudaError_t {                                                 \
    switch (HEADDIM) {                                                   \
      case 16: { constexpr int CONST_NAME = 16; return __VA_ARGS__(); }  \
      case 32: { constexpr int CONST_NAME = 32; return __VA_ARGS__(); }  \
      case 64: { constexpr int CONST_NAME = 64; return __VA_ARGS__(); }  \
      case 80: { constexpr int CONST_NAME = 80; return __VA_ARGS__(); }  \
      case 96: { constexpr int CONST_NAME = 96; return __VA_ARGS__(); }  \
      case 128: { constexpr int CONST_NAME = 128; return __VA_ARGS__(); } \
      default: return cudaErrorInvalidValue;                             \
    }                                                                    \
  }()

// DType -> element type for the 16-bit tensor-core kernels.
#define FLASHCOS_HALF_SWITCH(DTYPE, TYPE_NAME, ...)                                  \
  [&]() -> cudaError_t {                                                             \
    if ((DTYPE) == DType::kHalf) { using TYPE_NAME = __half; return __VA_ARGS__(); } \
    using TYPE_NAME = __nv_bfloat16;                                                 \
    return __VA_ARGS__();                                                            \
  }()

// DType -> element type for the fp32 / fp64 SIMT kernels.
#define FLASHCOS_FLOAT_SWITCH(DTYPE, TYPE_NAME, ...)                                  \
  [&]() -> cudaError_t {                                                              \
    if ((DTYPE) == DType::kDouble) { using TYPE_NAME = double; return __VA_ARGS__(); } \
    using TYPE_NAME = float;                                                          \
    return __VA_ARGS__();                                                             \
  }()

// Tile variant (attention/cosine/cuda/tuning.h) -> template argument; only 0 outside FLASHCOS_TUNING builds.
#ifdef FLASHCOS_TUNING
#define FLASHCOS_VARIANT_SWITCH(VARIANT, CONST_NAME, ...)              \
  [&]() -> cudaError_t {                                               \
    switch (VARIANT) {                                                 \
      case 1: { constexpr int CONST_NAME = 1; return __VA_ARGS__(); }  \
      case 2: { constexpr int CONST_NAME = 2; return __VA_ARGS__(); }  \
      case 3: { constexpr int CONST_NAME = 3; return __VA_ARGS__(); }  \
      default: { constexpr int CONST_NAME = 0; return __VA_ARGS__(); } \
    }                                                                  \
  }()
#else
#define FLASHCOS_VARIANT_SWITCH(VARIANT, CONST_NAME, ...) \
  [&]() -> cudaError_t {                                  \
    constexpr int CONST_NAME = 0;                         \
    return __VA_ARGS__();                                 \
  }()
#endif
