// Declarations of the per-(dtype, head dim) launchers. Their definitions live in the kernel
// headers and are instantiated once each in the files kernels.cmake generates, so that the
// instances compile in parallel and launch.cu stays small.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/cosine/cuda/params.h"

namespace flashcos::cuda {

template <typename T, int D>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream);  // fwd_kernel.cuh
template <typename T, int D>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream);  // bwd_kernel.cuh
// Hopper family (attention/cosine/cuda/hopper/), d 64 / 128 only, built where FLASHCOS_HAS_HOPPER is set.
template <typename T, int D>
cudaError_t launch_fwd_hopper(const FwdParams& p, cudaStream_t stream);  // hopper/fwd_hopper.cuh; cudaErrorNotSupported: use launch_fwd
template <typename T, int D>
cudaError_t launch_bwd_hopper(const BwdParams& p, cudaStream_t stream);  // hopper/bwd_hopper.cuh; cudaErrorNotSupported: use launch_bwd
// The split tail's pieces (0: none) and the floats of each one's slot: hopper/bwd_hopper.cuh, hopper/fwd_hopper.cuh.
template <typename T, int D>
int64_t hopper_split_slots(const BwdParams& p, int* slot_floats);
template <typename T, int D>
int64_t hopper_split_slots(const FwdParams& p, int* slot_floats);
template <typename T, int D>
cudaError_t launch_simt_fwd(const FwdParams& p, cudaStream_t stream);  // simt_kernels.cuh
template <typename T, int D>
cudaError_t launch_simt_bwd(const BwdParams& p, cudaStream_t stream);  // simt_kernels.cuh

}  // namespace flashcos::cuda
