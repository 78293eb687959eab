// The launchers: pick the kernel family for the inputs and the device, then the template
// instance for (dtype, head dim). Today there are two families: the sm_80+ mma.sync kernels for
// fp16 / bf16 and the SIMT kernels for fp32 / fp64. A Hopper (wgmma / TMA) family slots in as a
// third case of pick_family() without touching the callers.
#include "attention/cuda/launch_templates.h"
#include "attention/cuda/static_switch.h"

namespace flashcos::cuda {
namespace {

enum class Family { kSm80Mma, kSimt };

Family pick_family(DType dtype) {
  return dtype == DType::kHalf || dtype == DType::kBFloat16 ? Family::kSm80Mma : Family::kSimt;
}

}  // namespace

bool supports_head_dim(int d) {
  return d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128;
}

cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  if (!supports_head_dim(p.D)) return cudaErrorInvalidValue;
  if (p.B == 0 || p.H == 0 || p.I == 0) return cudaSuccess;
  if (pick_family(p.dtype) == Family::kSm80Mma) {
    return FLASHCOS_HALF_SWITCH(p.dtype, T, [&] {
      return FLASHCOS_HEADDIM_SWITCH(p.D, kD, [&] { return launch_fwd<T, kD>(p, stream); });
    });
  }
  return FLASHCOS_FLOAT_SWITCH(p.dtype, T, [&] {
    return FLASHCOS_HEADDIM_SWITCH(p.D, kD, [&] { return launch_simt_fwd<T, kD>(p, stream); });
  });
}

cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  if (!supports_head_dim(p.D)) return cudaErrorInvalidValue;
  if (p.B == 0 || p.H == 0 || p.I == 0 || p.J == 0) return cudaSuccess;
  if (pick_family(p.dtype) == Family::kSm80Mma) {
    return FLASHCOS_HALF_SWITCH(p.dtype, T, [&] {
      return FLASHCOS_HEADDIM_SWITCH(p.D, kD, [&] { return launch_bwd<T, kD>(p, stream); });
    });
  }
  return FLASHCOS_FLOAT_SWITCH(p.dtype, T, [&] {
    return FLASHCOS_HEADDIM_SWITCH(p.D, kD, [&] { return launch_simt_bwd<T, kD>(p, stream); });
  });
}

}  // namespace flashcos::cuda
