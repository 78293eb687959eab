// Fused decode attention for one query row (math in decode_attention.h).
//   grid (NH, splits), 128 threads. Launched with programmatic dependent launch on sm_90+
//   (pdl.cuh): each block loads its rope frequencies, lets the next kernel launch and waits for
//   the previous one before it reads anything else. Every block then l2-normalises and rotates q
//   in shared memory (the owner of slot s = pos mod L also k, and writes k, v into the rings); then
//   groups of T = HS / 8 lanes take one key each (8 features per lane, 16-byte loads), the dot
//   product by T-lane shuffles, and accumulate P_j V_j and P_j in float32 registers; the block
//   sums its groups into one partial row (sum P V, sum P) and the last block of the head (atomic
//   counter) combines the partial rows in a fixed order. Of the `splits` blocks per head only
//   ceil(n / 64) (at most `splits`) work: the rest return before touching anything.
#include "model/decode/cuda/decode_attention.h"

#include <algorithm>

#include "attention/common/cuda/env_switch.h"
#include "attention/common/cuda/pdl.cuh"
#include "model/fused/cuda/vec.cuh"

namespace flashcos::cuda {
namespace {

using namespace fused;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHead = 256;
constexpr int kPerThread = kMaxHead / kThreads;  // q / k features one thread prepares
constexpr int kMinKeysPerSplit = 64;
constexpr int kUnroll = 4;  // keys per group whose loads are in flight together
constexpr int kCombineLoads = 8;  // partial rows per thread whose loads are in flight together
static_assert(kCombineLoads == 8, "the combine's tree_sum adds 8 accumulators");

__global__ void __launch_bounds__(kThreads) decode_attention_kernel(const DecodeAttentionParams p) {
  __shared__ float q_s[kMaxHead];
  __shared__ float k_s[kMaxHead + 1];
  __shared__ float red[kWarps][kMaxHead + 1];
  __shared__ bool last_block;

  const int HS = p.head_dim, L = p.max_len, gs = HS / p.groups, inner = p.heads * HS;
  // Before the grid dependency wait (pdl.cuh): only the rope frequencies, which no kernel writes.
  float freq[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int t = threadIdx.x + i * kThreads;
    freq[i] = p.inv_freq != nullptr && t < HS ? p.inv_freq[(t % gs) / 2] : 0.f;
  }
  pdl::allow_next_grid();
  pdl::wait_for_previous_grid();  // pos, qkv, the rings and the scratch: from here on
  const int64_t pos = *p.pos;
  const int n = static_cast<int>(pos + 1 < L ? pos + 1 : L);  // filled slots 0 .. n - 1
  // The launch has p.splits blocks per head (fixed: a CUDA graph replays one launch); only the
  // first S take part, at least kMinKeysPerSplit keys each, so a short context does not pay for
  // dozens of near-empty blocks and their combine. The rest leave at once.
  const int h = blockIdx.x, split = blockIdx.y;
  const int S = max(1, min(p.splits, (n + kMinKeysPerSplit - 1) / kMinKeysPerSplit));
  if (split >= S) return;
  const int s = static_cast<int>(pos % L);                     // this token's slot
  const int chunk = (n + S - 1) / S;
  const int begin = min(n, split * chunk), end = min(n, begin + chunk);
  const bool owner = s >= begin && s < end;
  const int64_t head_base = int64_t(h) * L * HS;

  // 1. q (and, in the owner, k): float32, l2-normalised per group, rotated at pos.
  for (int t = threadIdx.x; t < HS; t += kThreads) {
    q_s[t] = load1(p.qkv, p.dtype, int64_t(h) * HS + t);
    if (owner) k_s[t] = load1(p.qkv, p.dtype, int64_t(inner) + h * HS + t);
  }
  __syncthreads();
  float qv[kPerThread], kv[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int t = threadIdx.x + i * kThreads;
    qv[i] = kv[i] = 0.f;
    if (t >= HS) continue;
    const int g0 = t / gs * gs;
    float sq = 0.f, sk = 0.f;
    for (int e = g0; e < g0 + gs; ++e) {
      sq += q_s[e] * q_s[e];
      sk += owner ? k_s[e] * k_s[e] : 0.f;
    }
    qv[i] = q_s[t] / fmaxf(sqrtf(sq), 1e-12f);
    if (owner) kv[i] = k_s[t] / fmaxf(sqrtf(sk), 1e-12f);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int t = threadIdx.x + i * kThreads;
    if (t < HS) q_s[t] = qv[i], k_s[t] = kv[i];
  }
  __syncthreads();
  if (p.inv_freq != nullptr) {
    const float fpos = static_cast<float>(pos);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int t = threadIdx.x + i * kThreads;
      if (t >= HS) continue;
      const float angle = fpos * freq[i];
      float sn, cs;
      sincosf(angle, &sn, &cs);
      const int e = t & ~1;  // the pair (e, e + 1): (a, b) -> (a cos - b sin, a sin + b cos)
      qv[i] = (t & 1) ? q_s[e] * sn + q_s[e + 1] * cs : q_s[e] * cs - q_s[e + 1] * sn;
      kv[i] = (t & 1) ? k_s[e] * sn + k_s[e + 1] * cs : k_s[e] * cs - k_s[e + 1] * sn;
    }
    __syncthreads();
  }
  // q and k as the attention takes them: rounded to the cache dtype. The owner writes slot s.
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int t = threadIdx.x + i * kThreads;
    if (t >= HS) continue;
    q_s[t] = round_to(p.dtype, qv[i]);
    if (owner) {
      store1(p.k_cache, p.dtype, head_base + int64_t(s) * HS + t, kv[i]);
      store1(p.v_cache, p.dtype, head_base + int64_t(s) * HS + t,
             load1(p.qkv, p.dtype, int64_t(2) * inner + h * HS + t));
    }
  }
  __syncthreads();  // slot s written (visible to this block) and q_s complete

  // 2. Groups of T lanes, one key each: P_j = exp(scale q.k_j - shift), acc += P_j V_j.
  const int T = HS / kVec, sub = threadIdx.x % T, group = threadIdx.x / T, groups = kThreads / T;
  float q[kVec], acc[kVec], l = 0.f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) q[i] = q_s[sub * kVec + i], acc[i] = 0.f;
  // kUnroll keys per group per round, all loads issued before any is used (one memory latency
  // per round, not per key). The same trip count for the whole block.
  for (int base = begin; base < end; base += groups * kUnroll) {
    float kr[kUnroll][kVec], vr[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * groups + group;
      if (j < end) {
        const int64_t off = head_base + int64_t(j) * HS + sub * kVec;
        load8(p.k_cache, p.dtype, off, kr[u]);
        load8(p.v_cache, p.dtype, off, vr[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool valid = base + u * groups + group < end;
      float dot = 0.f;
      if (valid) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot = fmaf(q[i], kr[u][i], dot);
      }
      for (int m = T / 2; m >= 1; m >>= 1) dot += __shfl_xor_sync(kFullMask, dot, m);
      if (valid) {
        const float pj = expf(p.scale * dot - p.shift);
        l += pj;
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] = fmaf(pj, vr[u][i], acc[i]);
      }
    }
  }
  // Sum the groups of each warp (lanes with the same `sub`), then the warps.
  for (int m = T; m < 32; m <<= 1) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] += __shfl_xor_sync(kFullMask, acc[i], m);
    l += __shfl_xor_sync(kFullMask, l, m);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane < T) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) red[warp][sub * kVec + i] = acc[i];
    if (lane == 0) red[warp][HS] = l;
  }
  __syncthreads();
  if (S == 1) {  // one block holds the whole row: no partials, no combine
    float total_l = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total_l += red[w][HS];
    const float inv_l = p.normalize ? 1.f / total_l : 1.f;
    for (int t = threadIdx.x; t < HS; t += kThreads) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += red[w][t];
      store1(p.out, p.dtype, int64_t(h) * HS + t, v * inv_l);
    }
    return;
  }
  float* partial = p.partials + (int64_t(h) * S + split) * (HS + 1);
  for (int t = threadIdx.x; t <= HS; t += kThreads) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[w][t];
    partial[t] = v;
  }

  // 3. The last block of the head to finish combines the partial rows.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(p.counters + h, 1u) == static_cast<unsigned>(S - 1);
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  // P threads per column sum every P-th row in a fixed order, kCombineLoads independent loads in
  // flight each. Every thread also sums the l column in the same loop (column 0's threads keep
  // it): its loads go out beside the others, where a second pass doubled the chain of memory round
  // trips of column 0's threads. Then the P part sums per column.
  const float* rows = p.partials + int64_t(h) * S * (HS + 1);
  const int parts = min(kWarps, max(1, kThreads / HS));
  auto tree_sum = [](const float (&a)[kCombineLoads]) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  };
  for (int w = threadIdx.x; w < HS * parts; w += kThreads) {
    const int col = w % HS, part = w / HS;
    float a[kCombineLoads], b[kCombineLoads];
#pragma unroll
    for (int u = 0; u < kCombineLoads; ++u) a[u] = b[u] = 0.f;
    int r = part;
    for (; r + (kCombineLoads - 1) * parts < S; r += kCombineLoads * parts) {
#pragma unroll
      for (int u = 0; u < kCombineLoads; ++u) {
        const float* row = rows + int64_t(r + u * parts) * (HS + 1);
        a[u] += __ldcg(row + col);
        b[u] += __ldcg(row + HS);  // the lanes of a part share this address: no branch
      }
    }
    for (; r < S; r += parts) {
      const float* row = rows + int64_t(r) * (HS + 1);
      a[0] += __ldcg(row + col);
      b[0] += __ldcg(row + HS);
    }
    red[part][col] = tree_sum(a);
    if (col == 0) red[part][HS] = tree_sum(b);
  }
  __syncthreads();
  for (int t = threadIdx.x; t <= HS; t += kThreads) {  // k_s (free now) takes the totals, l at HS
    float v = 0.f;
    for (int part = 0; part < parts; ++part) v += red[part][t];
    k_s[t] = v;
  }
  __syncthreads();
  const float inv_l = p.normalize ? 1.f / k_s[HS] : 1.f;
  for (int t = threadIdx.x; t < HS; t += kThreads) store1(p.out, p.dtype, int64_t(h) * HS + t, k_s[t] * inv_l);
  if (threadIdx.x == 0) p.counters[h] = 0u;
}

}  // namespace

bool decode_attention_supported(int head_dim, int groups) {
  if (head_dim < kVec || head_dim > kMaxHead || head_dim % kVec != 0) return false;
  const int t = head_dim / kVec;
  if ((t & (t - 1)) != 0) return false;  // T lanes per key: a power of two dividing 32
  return groups >= 1 && head_dim % groups == 0 && (head_dim / groups) % 2 == 0;
}

int decode_attention_splits(int heads, int max_len, int num_sms) {
  const int want = (4 * std::max(num_sms, 1) + heads - 1) / std::max(heads, 1);
  return std::max(1, std::min({max_len, want, 256}));
}

cudaError_t run_decode_attention(const DecodeAttentionParams& p, cudaStream_t stream) {
  if (!decode_attention_supported(p.head_dim, p.groups) || p.heads < 1 || p.max_len < 1 || p.splits < 1 ||
      p.splits > p.max_len) {
    return cudaErrorInvalidValue;
  }
  static const bool pdl_on = env_switch_on("FLASHCOS_DECODE_PDL");
  return pdl::launch<decode_attention_kernel>(pdl_on, dim3(p.heads, p.splits), dim3(kThreads), stream, p);
}

}  // namespace flashcos::cuda
