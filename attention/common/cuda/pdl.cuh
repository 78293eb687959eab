// Programmatic dependent launch (PDL, compute capability 9.0+): the decode step's chain of small
// dependent kernels (model/decode/cuda/decode_linear.cu, decode_attention.cu) and the backward's dQ
// conversion (attention/cosine/cuda/dq_finish.cuh). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start once every block of the kernel
// before it on the stream has called allow_next_grid() (or exited); it then runs its preamble
// (loads of weights that no kernel of the step writes) and blocks in wait_for_previous_grid() until
// that kernel has completed and its memory is visible. Since every kernel of the chain waits before
// it finishes, that completion covers every earlier kernel too. Rules for a kernel launched so:
//   before the wait: read only what no kernel of the stream writes (weights, LayerNorm parameters);
//   after it: every read of an activation / position / token and every write.
// Both instructions are no-ops when the launch had no such attribute (an sm_90 kernel launched
// plainly) and are compiled out below sm_90, where the launch is plain too. Each user has its own
// switch to launch plainly for timing comparisons (env_switch.h's env_switch_on:
// FLASHCOS_DECODE_PDL=0, FLASHCOS_DQ_FINISH_PDL=0), passed to launch() as `wanted`.
#pragma once

#include <cuda_runtime.h>

#include "attention/common/cuda/device_attribute.h"

namespace flashcos::cuda::pdl {

// griddepcontrol.wait: blocks until the previous grid of the stream has completed and its writes
// are visible. The memory clobber keeps the compiler from moving loads above it.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// griddepcontrol.launch_dependents: this block no longer holds back the launch of the next grid
// (which still waits for this one's completion before it reads anything this one writes).
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether the current device takes the PDL attribute: compute capability 9.0+.
inline bool device_takes_pdl() {
  int major = 0;
  return current_device_attribute<cudaDevAttrComputeCapabilityMajor>(&major) == cudaSuccess && major >= 9;
}

// kKernel<<<grid, block, 0, stream>>>(args...), with programmatic stream serialization where
// `wanted`, the device takes it and the kernel's code was compiled from sm_90+ PTX (looked up at its
// first launch): code JIT-compiled from older PTX has no griddepcontrol.wait and, launched so, would
// read its inputs before the previous kernel is done. Returns the launch's error.
template <auto kKernel, class... Args>
cudaError_t launch(bool wanted, dim3 grid, dim3 block, cudaStream_t stream, const Args&... args) {
  static const bool kernel_waits = [] {
    cudaFuncAttributes attr;
    const bool ok = cudaFuncGetAttributes(&attr, kKernel) == cudaSuccess && attr.ptxVersion >= 90;
    (void)cudaGetLastError();  // a failed look-up only means no PDL
    return ok;
  }();
  if (!wanted || !kernel_waits || !device_takes_pdl()) {
    kKernel<<<grid, block, 0, stream>>>(args...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kKernel, args...);
  const cudaError_t last = cudaGetLastError();  // read and cleared, as on the plain path
  return launched != cudaSuccess ? launched : last;
}

}  // namespace flashcos::cuda::pdl
