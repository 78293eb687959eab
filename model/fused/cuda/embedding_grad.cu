// The embedding table's gradient in two passes (math and layout in embedding_grad.h),
//   dW[v][c] (+)= sum_r P[r][v][c],  P[r][v][c] = sum over t in run r with idx[t] = v of dx[t][c],
// bitwise repeatable: every float add has one fixed place in one fixed order, whatever the schedule.
//   pass 1, block = one warp (32-column slice, token run): lane l alone owns column c0 + l of a
//           (V + 1, 32) float32 accumulator in shared memory and adds the run's tokens into it one
//           after another in token order (no atomics; tokens whose index is outside [0, V) go to
//           the spare row V, never written out). A step is 32 tokens: lane u loads token u's index
//           (broadcast by shuffles), every lane its column of the 32 dx rows (128-byte coalesced
//           loads; the next step's are in flight while this one is added). 8 tokens' accumulator
//           values are loaded together; a token whose row came earlier in those 8 takes the latest
//           sum for it instead, and the stores go in token order, so each row gets the sequential
//           sum. Then the rows the run touched go to `partials`, and their flags. Runs: enough
//           (slice, run) warps to fill every SM once (6 a SM at V = 256: 33 KiB each).
//   pass 2, per element of dW: the flagged runs' partials summed in run order (an unflagged run
//           adds nothing; its +0 would give the same bits, the sum never being -0), added to dW
//           (accumulate) or written.
// So P[r][v][c] = ((x_t1 + x_t2) + x_t3) + ... for t1 < t2 < ..., dW = ((P[0] + P[1]) + ...), and
// the runs depend only on N, V, C and the SM count.
#include "model/fused/cuda/embedding_grad.h"

#include <algorithm>

namespace flashcos::cuda {
namespace {

constexpr int kCols = 32;            // columns a block (one warp, one column a lane)
constexpr int kStep = 32;            // tokens a step (one index a lane); two steps in flight
constexpr int kGroup = 8;            // tokens whose accumulator loads issue together
constexpr int kMinRunTokens = 256;   // a run's fixed cost (zero and write the accumulator) is ~8 steps
constexpr int kReduceThreads = 128;  // the reduce: a block takes 128 column pairs of one row
constexpr int kReduceRuns = 32;      // partials in flight a thread in the reduce

int column_blocks(const EmbeddingGradParams& p) { return (p.cols + kCols - 1) / kCols; }
size_t partials_smem(int64_t rows) { return size_t(rows + 1) * kCols * sizeof(float); }
__host__ __device__ int64_t flag_stride(int runs) { return (runs + kReduceRuns - 1) / kReduceRuns * kReduceRuns; }
__host__ __device__ int64_t partials_floats(const EmbeddingGradParams& p, int runs) {
  return (int64_t(runs) * p.rows * p.cols + 3) / 4 * 4;  // the flags 16-byte aligned
}
// touched: (V, flag_stride(runs)) bytes after the partials: 1 where run r wrote row v of its
// partials, 0 where it did not (that row holds garbage), the padding never read.
__host__ __device__ uint8_t* touched_flags(const EmbeddingGradParams& p, int runs) {
  return reinterpret_cast<uint8_t*>(p.partials + partials_floats(p, runs));
}

// One step's 32 tokens from t0: row = token (t0 + lane)'s accumulator row (V when out of range or
// past the run), x[u] = dx[t0 + u][col] (0 past the run; col is clamped into the width).
__device__ __forceinline__ void load_step(const EmbeddingGradParams& p, int64_t t0, int64_t t_end, int col,
                                          int& row, float (&x)[kStep]) {
  const int lane = threadIdx.x;
  const int n = t_end - t0 < kStep ? int(t_end - t0) : kStep;
  row = int(p.rows);
  if (lane < n) {
    const int64_t v = p.idx[t0 + lane];
    if (v >= 0 && v < p.rows) row = int(v);
  }
  const float* src = p.dx + t0 * p.cols + col;
  if (n == kStep) {  // no predicated loads on the full steps (the compiler would wait for them one by one)
#pragma unroll
    for (int u = 0; u < kStep; ++u) x[u] = __ldg(src + int64_t(u) * p.cols);
  } else {
#pragma unroll
    for (int u = 0; u < kStep; ++u) x[u] = u < n ? __ldg(src + int64_t(u) * p.cols) : 0.f;
  }
}

// acc[row of token u][lane] += x[u] for u = 0..31, in order; seen[row] = 1.
__device__ __forceinline__ void add_step(float* acc, uint8_t* seen, int row, const float (&x)[kStep]) {
  const int lane = threadIdx.x;
  seen[row] = 1;
#pragma unroll
  for (int g = 0; g < kStep; g += kGroup) {
    int r[kGroup];
    float s[kGroup], n[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) r[k] = __shfl_sync(0xffffffffu, row, g + k) * kCols + lane;
#pragma unroll
    for (int k = 0; k < kGroup; ++k) s[k] = acc[r[k]];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      float v = s[k];
#pragma unroll
      for (int j = 0; j < k; ++j) v = r[j] == r[k] ? n[j] : v;  // the latest earlier sum of this row
      n[k] = v + x[g + k];
    }
#pragma unroll
    for (int k = 0; k < kGroup; ++k) acc[r[k]] = n[k];  // in token order: the last one of a row stays
  }
}

__global__ void __launch_bounds__(32) embedding_grad_partials_kernel(const EmbeddingGradParams p, int runs,
                                                                     int64_t run_tokens) {
  extern __shared__ float4 smem[];
  float* acc = reinterpret_cast<float*>(smem);  // (V + 1, kCols)
  __shared__ uint8_t seen[kEmbeddingGradMaxRows + 1];
  const int lane = threadIdx.x;
  const int rows = int(p.rows);
  const int64_t run = blockIdx.y;
  const int col = int(blockIdx.x) * kCols + lane;
  for (int i = lane; i < (rows + 1) * (kCols / 4); i += 32) smem[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i = lane; i <= rows; i += 32) seen[i] = 0;
  __syncwarp();
  const int64_t t_begin = run * run_tokens, t_end = min(p.tokens, t_begin + run_tokens);
  const int col_ld = min(col, p.cols - 1);  // lanes past the width add a copy, never written
  // Two steps' buffers, named (a copy from one to the other would wait for the loads in flight).
  int row_a = rows, row_b = rows;
  float xa[kStep], xb[kStep];
  int64_t t0 = t_begin;
  if (t0 < t_end) load_step(p, t0, t_end, col_ld, row_a, xa);
  while (t0 < t_end) {
    const bool has_b = t0 + kStep < t_end;
    if (has_b) load_step(p, t0 + kStep, t_end, col_ld, row_b, xb);
    add_step(acc, seen, row_a, xa);
    if (!has_b) break;
    t0 += 2 * kStep;
    if (t0 < t_end) load_step(p, t0, t_end, col_ld, row_a, xa);
    add_step(acc, seen, row_b, xb);
  }
  __syncwarp();
  // The touched rows to this run's partials (a ballot of 32 rows' flags, then 8 rows' loads at a time).
  float* out = p.partials + run * p.rows * p.cols + col;
  for (int v0 = 0; v0 < rows; v0 += 32) {
    const unsigned touched = __ballot_sync(0xffffffffu, v0 + lane < rows && seen[v0 + lane]);
#pragma unroll
    for (int k0 = 0; k0 < 32; k0 += 8) {
      float a[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) a[k] = acc[min(v0 + k0 + k, rows) * kCols + lane];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if ((touched >> (k0 + k)) & 1u && col < p.cols) out[int64_t(v0 + k0 + k) * p.cols] = a[k];
      }
    }
  }
  if (blockIdx.x == 0) {
    uint8_t* flags = touched_flags(p, runs) + run;
    for (int v = lane; v < rows; v += 32) flags[v * flag_stride(runs)] = seen[v];
  }
}

// dW[v][c..c+1] (+)= the flagged runs' partials in run order. Grid (column chunks, V).
__global__ void __launch_bounds__(kReduceThreads) embedding_grad_reduce_kernel(const EmbeddingGradParams p, int runs) {
  const int64_t v = blockIdx.y;
  const int c = (int(blockIdx.x) * kReduceThreads + int(threadIdx.x)) * 2;  // C is even
  if (c >= p.cols) return;
  const uint4* flags = reinterpret_cast<const uint4*>(touched_flags(p, runs) + v * flag_stride(runs));
  const int64_t n = p.rows * p.cols;
  const float* part = p.partials + v * p.cols + c;
  float2 sum = make_float2(0.f, 0.f);
  for (int r0 = 0; r0 < runs; r0 += kReduceRuns) {
    uint32_t f[kReduceRuns / 4];
#pragma unroll
    for (int k = 0; k < kReduceRuns / 16; ++k) {
      const uint4 w = flags[r0 / 16 + k];
      f[4 * k] = w.x, f[4 * k + 1] = w.y, f[4 * k + 2] = w.z, f[4 * k + 3] = w.w;
    }
    bool on[kReduceRuns];
    float2 x[kReduceRuns];
#pragma unroll
    for (int k = 0; k < kReduceRuns; ++k) {
      on[k] = r0 + k < runs && ((f[k / 4] >> (8 * (k % 4))) & 0xffu) != 0;
      x[k] = on[k] ? *reinterpret_cast<const float2*>(part + int64_t(r0 + k) * n) : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kReduceRuns; ++k) {
      if (on[k]) sum.x += x[k].x, sum.y += x[k].y;
    }
  }
  float* d = p.dw + v * p.cols + c;
  d[0] = p.accumulate ? d[0] + sum.x : sum.x;
  d[1] = p.accumulate ? d[1] + sum.y : sum.y;
}

int blocks_per_sm(int64_t rows) {
  // Once per process (one device a process here; not a stream operation, so graph capture is fine):
  // the largest shared-memory carveout, for 6 accumulators of 33 KiB a SM (a hint only).
  static const bool carveout = [] {
    const cudaError_t e = cudaFuncSetAttribute(embedding_grad_partials_kernel,
                                               cudaFuncAttributePreferredSharedMemoryCarveout,
                                               int(cudaSharedmemCarveoutMaxShared));
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e == cudaSuccess;
  }();
  (void)carveout;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, embedding_grad_partials_kernel, 32, partials_smem(rows)) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    n = 1;
  }
  return std::max(n, 1);
}

void launch_partials(const EmbeddingGradParams& p, int runs, int64_t run_tokens, cudaStream_t stream) {
  embedding_grad_partials_kernel<<<dim3(unsigned(column_blocks(p)), unsigned(runs)), 32, partials_smem(p.rows),
                                   stream>>>(p, runs, run_tokens);
}

void launch_reduce(const EmbeddingGradParams& p, int runs, cudaStream_t stream) {
  const dim3 grid(unsigned((p.cols / 2 + kReduceThreads - 1) / kReduceThreads), unsigned(p.rows));
  embedding_grad_reduce_kernel<<<grid, kReduceThreads, 0, stream>>>(p, runs);
}

}  // namespace

bool embedding_grad_supported(int64_t rows, int64_t cols) {
  return rows >= 1 && rows <= kEmbeddingGradMaxRows && cols >= 2 && cols % 2 == 0 && cols <= (int64_t(1) << 24);
}

int embedding_grad_chunks(const EmbeddingGradParams& p) {
  const int64_t slots = int64_t(blocks_per_sm(p.rows)) * std::max(p.num_sms, 1);
  const int64_t by_sms = std::max<int64_t>(1, slots / column_blocks(p));  // one wave of (slice, run) warps
  const int64_t by_tokens = (p.tokens + kMinRunTokens - 1) / kMinRunTokens;
  return int(std::max<int64_t>(1, std::min<int64_t>({by_sms, by_tokens, 65535})));
}

int64_t embedding_grad_scratch_floats(const EmbeddingGradParams& p) {
  const int runs = embedding_grad_chunks(p);
  return partials_floats(p, runs) + (p.rows * flag_stride(runs) + 3) / 4;  // partials, then the flag bytes
}

cudaError_t run_embedding_grad(const EmbeddingGradParams& p, cudaStream_t stream) {
  if (!embedding_grad_supported(p.rows, p.cols) || p.tokens < 0 || p.dw == nullptr || p.partials == nullptr ||
      (p.tokens > 0 && (p.idx == nullptr || p.dx == nullptr)) || reinterpret_cast<uintptr_t>(p.partials) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int runs = embedding_grad_chunks(p);
  const int64_t run_tokens = std::max<int64_t>(1, (p.tokens + runs - 1) / runs);
  launch_partials(p, runs, run_tokens, stream);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  launch_reduce(p, runs, stream);
  return cudaGetLastError();
}

}  // namespace flashcos::cuda
