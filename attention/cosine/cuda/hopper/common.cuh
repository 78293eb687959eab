// Shared pieces of the Hopper (sm_90a) kernel family: 128-byte-swizzled shared-memory tiles,
// wgmma matrix descriptors, and the fences a warpgroup MMA needs.
//
// Tile layout ("SW128"): a (ROWS x D) tile of 16-bit elements, D a multiple of 64, is stored as
// D / 64 column blocks of ROWS rows x 128 bytes; inside a block, row r's 16-byte chunk c (elements
// 8c .. 8c + 7) sits at r * 128 + ((c ^ (r % 8)) * 16). Eight rows form a 1024-byte swizzle atom,
// so every tile base is 1024-byte aligned. The same bytes serve as
//   * a K-major operand (rows = M or N, the D columns = K): start at the block of the k-step,
//     + 32 bytes per 16 columns inside it; stride between 8-row groups (SBO) 1024 bytes;
//   * an MN-major operand (the D columns = M or N, rows = K): start at 16 rows (2048 bytes) per
//     k-step; SBO 1024 bytes (the next 8 rows), LBO the block stride ROWS * 128 bytes (the next
//     64 columns of M / N).
// The hardware applies the XOR on the final address bits, which is why offsets inside an atom
// (the 32-byte k-steps, a 64-byte half of a row) work with the same descriptor fields.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/common/cuda/mma.cuh"

namespace flashcos::cuda::hopper {

constexpr int kSw128Row = 128;   // bytes per swizzled row
constexpr int kSw128Atom = 1024; // bytes per 8-row swizzle atom

// Byte offset of element (r, c) in a SW128 tile of `rows` rows.
__device__ __forceinline__ int sw128_offset(int rows, int r, int c) {
  return (c / 64) * rows * kSw128Row + r * kSw128Row + ((((c % 64) / 8) ^ (r % 8)) * 16) + (c % 8) * 2;
}

// wgmma shared-memory descriptor with 128-byte swizzle.
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_byte_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t desc = 0;
  desc |= uint64_t((smem_byte_addr & 0x3FFFF) >> 4);
  desc |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t(1) << 62;  // 128-byte swizzle
  return desc;
}

// The descriptor of smem_byte_addr + byte_off from that of smem_byte_addr: a 32-bit add on the low
// word (address and leading byte offset) instead of make_desc's masks and shifts. The 14-bit
// address field cannot carry into the offset (shared memory ends below 256 KB); the high word
// (stride, swizzle) stays a constant, which a 64-bit add would not let the compiler see.
__device__ __forceinline__ uint64_t desc_add(uint64_t desc, uint32_t byte_off) {
  const uint32_t lo = uint32_t(desc) + (byte_off >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy shared-memory writes (cp.async, st.shared) made visible to the async proxy
// (wgmma operand reads); each writing thread fences, then the CTA synchronises.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// *addr += v, an fp32 reduction in L2 (no value returned, relaxed).
__device__ __forceinline__ void red_add(float* addr, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;\n" ::"l"(addr), "f"(v) : "memory");
#endif
}
// Four 8 x 8 16-bit matrices to shared memory (stmatrix .x4): register i of every thread holds
// row lane / 4, columns 2 (lane % 4), + 1 of matrix i (mma.sync's fragment layout); lanes 8 i .. 8 i + 7
// give the addresses of matrix i's rows 0 .. 7 (16 bytes each, 16-byte aligned).
__device__ __forceinline__ void stmatrix_x4(uint32_t row_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(row_addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
#endif
}
// The same four matrices transposed (stmatrix .x4 .trans): lanes 8 i .. 8 i + 7 give the addresses
// of the stored rows 0 .. 7 of matrix i, row r holding column r of the fragment's matrix.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t row_addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                                  uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(row_addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#endif
}
// One fp32 store to a shared-memory byte address (32-bit: no generic address per store).
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
// Keeps the compiler from moving register reads / writes of an accumulator across the
// asynchronous wgmma that owns it (between issue and wait).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// mbarriers (shared-memory 64-bit barrier objects) and named barriers, for pipelines whose
// warpgroups run out of step. A phase completes when `count` arrivals have been made; waiters
// name the phase by its parity (0 for the first completion, 1 for the second, ...).
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}
// One arrival, releasing this thread's earlier writes (and, after a __syncwarp, its warp's).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}
// One arrival made by the hardware once every earlier cp.async of this thread has landed.
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}
// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads: arrive without waiting,
// or arrive and wait.
template <int kId, int kThreads>
__device__ __forceinline__ void named_bar_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
template <int kId, int kThreads>
__device__ __forceinline__ void named_bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// The split tail's count (split_tail.h), by the kThreads threads that stored a piece's part: one
// count on the split block's counter p.split_count[piece.slot] (Params: FwdParams or BwdParams; the
// pattern of CUDA's threadFenceReduction sample: stores, __threadfence, barrier kBar, atomic), true
// in every thread of the piece that counted last, once the other pieces' stores are visible to it.
// Piece: a SplitPiece. `flag`: an int of shared memory; ctid: 0 .. kThreads - 1.
template <int kBar, int kThreads, typename Params, typename Piece>
__device__ __forceinline__ bool split_counted_last(const Params& p, const Piece& piece, int ctid, int* flag) {
  __threadfence();
  named_bar_sync<kBar, kThreads>();
  if (ctid == 0) *flag = atomicAdd(p.split_count + piece.slot, 1);
  named_bar_sync<kBar, kThreads>();
  if (*reinterpret_cast<volatile int*>(flag) != piece.pieces - 1) return false;
  __threadfence();
  return true;
}

// Warp specialisation: a warpgroup lowers (the producer) or raises (the consumers) its register
// limit; every thread of the warpgroup executes it.
template <int kRegs>
__device__ __forceinline__ void regs_dealloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void regs_alloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// Copies a (ROWS x D) tile of 16-bit elements (row pitch g_stride elements) into a SW128 tile;
// rows >= valid_rows are zero-filled (their source address is replaced by g_safe).
template <int ROWS, int D, int THREADS, typename T>
__device__ __forceinline__ void load_tile_sw128(unsigned char* s_tile, const T* g_tile, int64_t g_stride,
                                                int valid_rows, const T* g_safe, int tid) {
  constexpr int kChunksPerRow = D / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < (kChunks + THREADS - 1) / THREADS; ++i) {
    const int c = tid + i * THREADS;
    if (kChunks % THREADS != 0 && c >= kChunks) break;
    const int row = c / kChunksPerRow;
    const int ch = c % kChunksPerRow;
    const bool valid = row < valid_rows;
    const T* src = valid ? g_tile + row * g_stride + ch * 8 : g_safe;
    cp_async_16(s_tile + (ch / 8) * ROWS * kSw128Row + row * kSw128Row + (((ch % 8) ^ (row % 8)) * 16), src,
                valid);
  }
}

// The elementwise product of two packed pairs of T (bf16 or fp16), rounded once to T: sm_90's bf16x2
// / f16x2 multiply, one instruction for two elements.
template <typename T>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  uint32_t d;
  if constexpr (std::is_same_v<T, __half>) {
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "bf16 or fp16 pairs");
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
}

// Accumulator pairs -> one A fragment (k-step kk covers accumulator n8 blocks 2kk, 2kk + 1).
template <typename T, int R>
__device__ __forceinline__ void acc_to_frag(uint32_t (&a)[4], const float (&acc)[R], int kk) {
  a[0] = pack2<T>(acc[8 * kk + 0], acc[8 * kk + 1]);
  a[1] = pack2<T>(acc[8 * kk + 2], acc[8 * kk + 3]);
  a[2] = pack2<T>(acc[8 * kk + 4], acc[8 * kk + 5]);
  a[3] = pack2<T>(acc[8 * kk + 6], acc[8 * kk + 7]);
}

}  // namespace flashcos::cuda::hopper
