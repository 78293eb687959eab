// Host side of the Hopper family's TMA loads (tma.cuh): tensor maps over the kernels' 16-bit
// (B, H, rows, D) operands whose box is one SW128 column block, (box_rows rows x 64 elements,
// 128-byte swizzled): exactly the shared-memory layout load_tile_sw128 (common.cuh) writes with
// cp.async, so either load feeds the same wgmma descriptors. A D = 128 tile is two boxes, at
// columns 0 and 64, into consecutive column blocks. Rows past `rows` come back as zeros.
//
// cuTensorMapEncodeTiled is a driver function: it is reached through the runtime's
// cudaGetDriverEntryPointByVersion, so nothing links libcuda directly; it needs a current context,
// so the maps first make the current device's primary context current on the calling thread. The
// Hopper forward's and backward's launchers use them; hopper_tma_tile_selftest checks the layout
// claim on a device.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

struct Sw128TileTensor {
  const void* base = nullptr;  // 16-byte aligned
  DType dtype = DType::kBFloat16;  // kHalf or kBFloat16
  // D a multiple of 8 (16-byte rows). A kernel that tiles D up to the next multiple of 64 (head dims
  // 16 .. 96 on the d 64 / d 128 kernels) gets zeros for the columns past D, as for rows past `rows`.
  int64_t B = 0, H = 0, rows = 0, D = 0;
  int64_t b_stride = 0, h_stride = 0, row_stride = 0;  // elements; multiples of 8; the last dim contiguous
};

// Fills `map` for tiles of `box_rows` (1..256) rows of `t`; cudaErrorInvalidValue for a tensor the
// TMA unit cannot address (dtype, alignment, strides, sizes) or a driver without the entry point;
// the runtime's error where the current device's context cannot be made current.
cudaError_t make_sw128_tile_map(CUtensorMap* map, const Sw128TileTensor& t, int box_rows);

// Fills `map` for boxes of `box_rows` (1..256) rows x 32 columns of a contiguous fp32 (B, H, rows, D)
// tensor (D a multiple of 4; a reduction into a box past D adds only its columns below D), 128-byte swizzled (row r's 16-byte chunk c at r * 128 + (c ^ (r % 8)) * 16): the dQ
// accumulator of the Hopper backward, added to by TMA reductions. cudaErrorInvalidValue as above.
cudaError_t make_f32_sw128_map(CUtensorMap* map, void* base, int64_t B, int64_t H, int64_t rows, int64_t D,
                               int box_rows);

// What a Hopper launcher returns when making its maps failed: cudaErrorNotSupported (the sm_80
// kernels run instead) where the TMA unit cannot address the inputs (cudaErrorInvalidValue), the
// runtime's own error otherwise (not a reason to fall back). cudaSuccess stays cudaSuccess.
inline cudaError_t tma_maps_launch_status(cudaError_t mapped) {
  return mapped == cudaErrorInvalidValue ? cudaErrorNotSupported : mapped;
}

// Loads the (64 rows x D) tile of head (b, h) starting at row0 twice, by TMA and by
// load_tile_sw128's cp.async, into shared memory and counts the bytes that differ (written to
// *mismatches, a host pointer), and the nonzero bytes of the TMA tile's rows past `rows`
// (*nonzero_past_end). For tests on a compute capability 9.0 device; cudaErrorNotSupported
// elsewhere or in a build without the Hopper family.
cudaError_t hopper_tma_tile_selftest(const Sw128TileTensor& t, int b, int h, int row0, int64_t* mismatches,
                                     int64_t* nonzero_past_end);

}  // namespace flashcos::cuda
