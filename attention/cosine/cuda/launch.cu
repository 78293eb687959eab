// The launchers: pick the kernel family for the inputs, the device and the direction, then the
// template instance for (dtype, head dim). Families:
//   * Hopper (attention/cosine/cuda/hopper/, wgmma, sm_90a): fp16 / bf16, every head dim (16 / 32 on
//     the d 64 tiles, 80 / 96 on the d 128 ones, zero-padded), with or without a key mask; the
//     forward also with an attention bias and with the online max (fwd_needs_online), the backward
//     also with a bias and its gradient (hopper_covers_fwd / hopper_covers_bwd below, the one place
//     that decides);
//     used on compute capability 9.0 devices when the build has it (FLASHCOS_HAS_HOPPER) and
//     FLASHCOS_HOPPER is not "0".
//   * sm_80+ mma.sync kernels for every other fp16 / bf16 case (whatever the TMA unit cannot
//     address, and the biased backward with FLASHCOS_HOPPER_BWD_BIAS=0);
//   * SIMT kernels for fp32 / fp64.
#include <atomic>
#include <type_traits>

#include "attention/common/cuda/device_attribute.h"
#include "attention/cosine/cuda/bwd_kernel.cuh"  // launch_delta, and dq_grid.cuh's launch_dq_grid_kv
#include "attention/cosine/cuda/dq_finish.cuh"
#include "attention/common/cuda/env_switch.h"
#include "attention/cosine/cuda/launch_templates.h"
#include "attention/common/cuda/static_switch.h"

namespace flashcos::cuda {
namespace {

enum class Family { kHopper, kSm80Mma, kSimt };

std::atomic<int64_t> g_hopper_fwd_launches{0}, g_hopper_bwd_launches{0};

bool is_16bit(DType dtype) { return dtype == DType::kHalf || dtype == DType::kBFloat16; }

// FLASHCOS_HOPPER=0 turns the Hopper family off (read once per process): for comparisons and for
// running the sm_80 kernels' tests on a Hopper machine.
bool hopper_enabled() {
  static const bool enabled = env_switch_on("FLASHCOS_HOPPER");
  return enabled;
}

bool hopper_device() {  // asked on every launch: the capability is kept per device
  int major = 0, minor = 0;
  if (current_device_attribute<cudaDevAttrComputeCapabilityMajor>(&major) != cudaSuccess) return false;
  if (current_device_attribute<cudaDevAttrComputeCapabilityMinor>(&minor) != cudaSuccess) return false;
  return major == 9 && minor == 0;
}

// The build, the device and FLASHCOS_HOPPER allow the Hopper family for these inputs' dtype and head
// dim. Head dims up to 64 run on the d 64 tiles, the others on the d 128 ones (hopper/tma_map.h: the
// columns past the head dim load as zeros and are not stored).
bool hopper_usable(const CommonParams& p) {
#ifdef FLASHCOS_HAS_HOPPER
  return is_16bit(p.dtype) && supports_head_dim(p.D) && hopper_enabled() && hopper_device();
#else
  (void)p;
  return false;
#endif
}

// FLASHCOS_HOPPER_BWD_BIAS=0 (read once) sends the backward with an attention bias to the sm_80
// kernels (which read the same saved l), for comparisons.
bool hopper_bwd_bias_enabled() {
  static const bool enabled = env_switch_on("FLASHCOS_HOPPER_BWD_BIAS");
  return enabled;
}

// What each direction of the Hopper family covers (with hopper_usable): everything the sm_80
// kernels do (key mask, attention bias with its gradient, the online-max forward;
// hopper/fwd_hopper.cuh, hopper/bwd_hopper.cuh).
bool hopper_covers_fwd(const FwdParams& p) { return hopper_usable(p); }
bool hopper_covers_bwd(const BwdParams& p) {
  return hopper_usable(p) && (p.bias == nullptr || hopper_bwd_bias_enabled());
}

Family pick_family(const CommonParams& p, bool hopper_covers) {
  if (!is_16bit(p.dtype)) return Family::kSimt;
  return hopper_covers ? Family::kHopper : Family::kSm80Mma;
}

}  // namespace

int64_t hopper_fwd_launches() { return g_hopper_fwd_launches.load(); }
int64_t hopper_bwd_launches() { return g_hopper_bwd_launches.load(); }
int64_t hopper_launches() { return hopper_fwd_launches() + hopper_bwd_launches(); }

bool supports_head_dim(int d) {
  return d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128;
}

cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  if (!supports_head_dim(p.D)) return cudaErrorInvalidValue;
  if (p.B == 0 || p.H == 0 || p.I == 0) return cudaSuccess;
  switch (pick_family(p, hopper_covers_fwd(p))) {
#ifdef FLASHCOS_HAS_HOPPER
    case Family::kHopper: {
      const cudaError_t err = FLASHCOS_HALF_SWITCH(p.dtype, T, [&] {
        return p.D <= 64 ? launch_fwd_hopper<T, 64>(p, stream) : launch_fwd_hopper<T, 128>(p, stream);
      });
      // cudaErrorNotSupported: the TMA unit cannot address these inputs; the sm_80 kernels run.
      if (err != cudaErrorNotSupported) {
        ++g_hopper_fwd_launches;
        return err;
      }
      [[fallthrough]];
    }
#endif
    case Family::kSm80Mma:
      return FLASHCOS_HALF_SWITCH(p.dtype, T, [&] {
        return FLASHCOS_HEADDIM_SWITCH(p.D, kD, [&] { return launch_fwd<T, kD>(p, stream); });
      });
    default:
      return FLASHCOS_FLOAT_SWITCH(p.dtype, T, [&] {
        return FLASHCOS_HEADDIM_SWITCH(p.D, kD, [&] { return launch_simt_fwd<T, kD>(p, stream); });
      });
  }
}

cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  if (!supports_head_dim(p.D)) return cudaErrorInvalidValue;
  if (p.B == 0 || p.H == 0 || p.I == 0) return cudaSuccess;
  if (p.J == 0) {  // no keys, no kernel: dq = 0 (all-zero bits in every dtype; 16 bits without dq_out:
                   // the caller's zeroed dq_accum)
    if (p.dq_zero_floats > 0) {  // no delta kernel to zero them
      const cudaError_t err = cudaMemsetAsync(p.dq_accum, 0, size_t(p.dq_zero_floats) * sizeof(float), stream);
      if (err != cudaSuccess) return err;
    }
    void* dq = is_16bit(p.dtype) ? p.dq_out : p.dq;
    if (dq == nullptr) return cudaSuccess;
    const size_t elem = is_16bit(p.dtype) ? 2 : p.dtype == DType::kDouble ? 8 : 4;
    return cudaMemsetAsync(dq, 0, size_t(p.B) * p.H * p.I * p.D * elem, stream);
  }
  switch (pick_family(p, hopper_covers_bwd(p))) {
#ifdef FLASHCOS_HAS_HOPPER
    case Family::kHopper: {
      const cudaError_t err = FLASHCOS_HALF_SWITCH(p.dtype, T, [&] {
        return p.D <= 64 ? launch_bwd_hopper<T, 64>(p, stream) : launch_bwd_hopper<T, 128>(p, stream);
      });
      // cudaErrorNotSupported: the TMA unit cannot address these inputs; the sm_80 kernels run.
      if (err != cudaErrorNotSupported) {
        ++g_hopper_bwd_launches;
        return err;
      }
      [[fallthrough]];
    }
#endif
    case Family::kSm80Mma:
      return FLASHCOS_HALF_SWITCH(p.dtype, T, [&] {
        const cudaError_t err = FLASHCOS_HEADDIM_SWITCH(p.D, kD, [&] { return launch_bwd<T, kD>(p, stream); });
        return err != cudaSuccess || p.dq_out == nullptr ? err : launch_dq_finish<T>(p, 0, stream);
      });
    default:
      return FLASHCOS_FLOAT_SWITCH(p.dtype, T, [&] {
        return FLASHCOS_HEADDIM_SWITCH(p.D, kD, [&] { return launch_simt_bwd<T, kD>(p, stream); });
      });
  }
}

namespace {

// The split tail's slots (hopper_split_slots) of p's Hopper instance, 0 where p runs another family.
template <typename Params>
int64_t split_slots(const Params& p, bool hopper_covers, int* slot_floats) {
  *slot_floats = 0;
  if (!supports_head_dim(p.D) || p.B == 0 || p.H == 0 || p.I == 0 || p.J == 0) return 0;
#ifdef FLASHCOS_HAS_HOPPER
  if (pick_family(p, hopper_covers) == Family::kHopper) {
    if (p.dtype == DType::kHalf) {
      return p.D <= 64 ? hopper_split_slots<__half, 64>(p, slot_floats)
                       : hopper_split_slots<__half, 128>(p, slot_floats);
    }
    return p.D <= 64 ? hopper_split_slots<__nv_bfloat16, 64>(p, slot_floats)
                     : hopper_split_slots<__nv_bfloat16, 128>(p, slot_floats);
  }
#else
  (void)hopper_covers;
#endif
  return 0;
}

}  // namespace

int64_t run_bwd_split_slots(const BwdParams& p, int* slot_floats) {
  return split_slots(p, hopper_covers_bwd(p), slot_floats);
}
int64_t run_fwd_split_slots(const FwdParams& p, int* slot_floats) {
  return split_slots(p, hopper_covers_fwd(p), slot_floats);
}

cudaError_t run_dq_grid(const BwdParams& p, cudaStream_t stream) {
  if (!is_16bit(p.dtype)) return cudaErrorInvalidValue;
  return FLASHCOS_HALF_SWITCH(p.dtype, T, [&] {
    const cudaError_t err = launch_dq_grid_kv<T>(p, stream);
    return err != cudaSuccess ? err : launch_delta<T, float>(p, stream);
  });
}

}  // namespace flashcos::cuda
