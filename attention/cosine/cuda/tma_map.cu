// Tensor maps for the Hopper family's TMA loads, and a device check that a TMA-loaded tile has
// the SW128 layout of a cp.async-loaded one (hopper/tma_map.h). Compiled for every architecture of
// the build: the TMA instructions exist on compute capability 9.0 only (hopper/tma.cuh guards
// them) and the check refuses other devices.
#include "attention/cosine/cuda/hopper/tma_map.h"

#include <mutex>

#include "attention/cosine/cuda/hopper/common.cuh"
#include "attention/cosine/cuda/hopper/tma.cuh"

namespace flashcos::cuda {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver (nullptr where the driver lacks it), looked up once.
EncodeTiled encode_tiled() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// The encoder, ready to call on this host thread: cudaErrorInvalidValue where the driver lacks it,
// the runtime's error where the current device's primary context cannot be made current. The
// encoder needs a current context, and a thread whose first CUDA work is ours has none: the runtime
// binds the context only in its own calls that need it (the autograd engine's backward thread
// reached the encoder first and got CUDA_ERROR_INVALID_CONTEXT, so its first backward ran the sm_80
// kernels; compute-sanitizer, 2026-11-29). cudaSetDevice binds it (CUDA 12 on); once per thread and
// device.
cudaError_t ready_encoder(EncodeTiled* fn) {
  *fn = encode_tiled();
  if (*fn == nullptr) return cudaErrorInvalidValue;
  thread_local int bound = -1;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess || dev == bound) return err;
  err = cudaSetDevice(dev);
  if (err == cudaSuccess) bound = dev;
  return err;
}

constexpr int kSelftestRows = 64;
constexpr int kSelftestThreads = 128;

template <int D>
__global__ void __launch_bounds__(kSelftestThreads) tma_selftest_kernel(const __grid_constant__ CUtensorMap map,
                                                                         const Sw128TileTensor t, int b, int h,
                                                                         int row0, unsigned long long* counts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kTileBytes = kSelftestRows * D * 2;
  constexpr int kBlockBytes = kSelftestRows * hopper::kSw128Row;  // one 64-column block
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* by_cp_async = smem_raw + (((raw_addr + hopper::kSw128Atom - 1) & ~uint32_t(hopper::kSw128Atom - 1)) - raw_addr);
  unsigned char* by_tma = by_cp_async + kTileBytes;
  uint64_t* bar = reinterpret_cast<uint64_t*>(by_tma + kTileBytes);
  const int tid = threadIdx.x;
  if (tid == 0) {
    hopper::mbar_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid == 0) {
    hopper::tma_prefetch_map(&map);
    hopper::mbar_arrive_expect_tx(bar, kTileBytes);
#pragma unroll
    for (int blk = 0; blk < D / 64; ++blk) hopper::tma_load_4d(by_tma + blk * kBlockBytes, &map, blk * 64, row0, h, b, bar);
  }
  const uint16_t* g = static_cast<const uint16_t*>(t.base) + b * t.b_stride + h * t.h_stride;
  hopper::load_tile_sw128<kSelftestRows, D, kSelftestThreads>(by_cp_async, g + int64_t(row0) * t.row_stride,
                                                              t.row_stride, int(t.rows - row0), g, tid);
  cp_async_commit();
  cp_async_wait<0>();
  hopper::mbar_wait(bar, 0);
  __syncthreads();
  unsigned long long differ = 0, past_end = 0;
  for (int i = tid; i < kTileBytes; i += kSelftestThreads) {
    differ += by_cp_async[i] != by_tma[i];
    const int row = (i % kBlockBytes) / hopper::kSw128Row;
    past_end += row0 + row >= t.rows && by_tma[i] != 0;
  }
  atomicAdd(counts, differ);
  atomicAdd(counts + 1, past_end);
#endif
}

}  // namespace

cudaError_t make_sw128_tile_map(CUtensorMap* map, const Sw128TileTensor& t, int box_rows) {
  const bool shape_ok = t.base != nullptr && reinterpret_cast<uintptr_t>(t.base) % 16 == 0 &&
                        (t.dtype == DType::kHalf || t.dtype == DType::kBFloat16) && t.B >= 1 && t.H >= 1 &&
                        t.rows >= 1 && t.D >= 8 && t.D % 8 == 0 && box_rows >= 1 && box_rows <= 256;
  const bool strides_ok = t.row_stride >= t.D && t.row_stride % 8 == 0 && t.h_stride > 0 && t.h_stride % 8 == 0 &&
                          t.b_stride > 0 && t.b_stride % 8 == 0;
  if (map == nullptr || !shape_ok || !strides_ok) return cudaErrorInvalidValue;
  EncodeTiled encode = nullptr;
  if (const cudaError_t ready = ready_encoder(&encode); ready != cudaSuccess) return ready;
  const cuuint64_t dims[4] = {cuuint64_t(t.D), cuuint64_t(t.rows), cuuint64_t(t.H), cuuint64_t(t.B)};
  const cuuint64_t strides[3] = {cuuint64_t(t.row_stride) * 2, cuuint64_t(t.h_stride) * 2, cuuint64_t(t.b_stride) * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, t.dtype == DType::kHalf ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                            4, const_cast<void*>(t.base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t make_f32_sw128_map(CUtensorMap* map, void* base, int64_t B, int64_t H, int64_t rows, int64_t D,
                               int box_rows) {
  const bool ok = map != nullptr && base != nullptr && reinterpret_cast<uintptr_t>(base) % 16 == 0 && B >= 1 &&
                  H >= 1 && rows >= 1 && D >= 4 && D % 4 == 0 && box_rows >= 1 && box_rows <= 256;
  if (!ok) return cudaErrorInvalidValue;
  EncodeTiled encode = nullptr;
  if (const cudaError_t ready = ready_encoder(&encode); ready != cudaSuccess) return ready;
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(rows), cuuint64_t(H), cuuint64_t(B)};
  const cuuint64_t strides[3] = {cuuint64_t(D) * 4, cuuint64_t(rows * D) * 4, cuuint64_t(H * rows * D) * 4};
  const cuuint32_t box[4] = {32, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, base, dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t hopper_tma_tile_selftest(const Sw128TileTensor& t, int b, int h, int row0, int64_t* mismatches,
                                     int64_t* nonzero_past_end) {
  int dev = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (err != cudaSuccess) return err;
  if (major != 9 || minor != 0) return cudaErrorNotSupported;
  if ((t.D != 64 && t.D != 128) || b < 0 || b >= t.B || h < 0 || h >= t.H || row0 < 0 || row0 >= t.rows ||
      mismatches == nullptr || nonzero_past_end == nullptr) {
    return cudaErrorInvalidValue;
  }
  CUtensorMap map;
  err = make_sw128_tile_map(&map, t, kSelftestRows);
  if (err != cudaSuccess) return err;
  unsigned long long* counts = nullptr;
  err = cudaMalloc(&counts, 2 * sizeof(unsigned long long));
  if (err != cudaSuccess) return err;
  err = cudaMemset(counts, 0, 2 * sizeof(unsigned long long));
  const size_t smem = size_t(2) * kSelftestRows * t.D * 2 + sizeof(uint64_t) + hopper::kSw128Atom;
  if (err == cudaSuccess) {
    auto kernel = t.D == 64 ? tma_selftest_kernel<64> : tma_selftest_kernel<128>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err == cudaSuccess) {
      kernel<<<1, kSelftestThreads, smem>>>(map, t, b, h, row0, counts);
      err = cudaGetLastError();
    }
  }
  unsigned long long host[2] = {0, 0};
  if (err == cudaSuccess) err = cudaMemcpy(host, counts, sizeof(host), cudaMemcpyDeviceToHost);
  const cudaError_t freed = cudaFree(counts);
  if (err == cudaSuccess) err = freed;
  *mismatches = int64_t(host[0]);
  *nonzero_past_end = int64_t(host[1]);
  return err;
}

}  // namespace flashcos::cuda
