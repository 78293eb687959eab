// Torch-free parameters of the fused decode-attention kernel (decode_attention.cu): one query row
// (the byte at absolute position pos) against a ring KV cache of L slots, per head h:
//   q, k = rope(l2norm_G(q_h)), rope(l2norm_G(k_h))  in float32 (l2norm per group of gs = HS / G
//          features: x / max(|x_g|, 1e-12); rope rotates the pairs (2m, 2m + 1) of each group by
//          angle = float(pos) * inv_freq[m], cos / sin in float32; no rope when inv_freq is null)
//   K[s], V[s] = k, v   with s = pos mod L (k rounded to the cache dtype, v copied)
//   P_j = exp(scale q.k_j - shift)  over the filled slots j < n = min(pos + 1, L)
//   cosine (normalize):  o = sum_j P_j V_j / sum_j P_j     exp:  o = sum_j P_j V_j   (shift 0)
// Since |q_g| = |k_g| = 1 the logits are bounded by scale G: cosine takes shift = scale G, so
// P_j <= 1 and no running maximum is needed. The n slots are split over S = min(splits,
// ceil(n / 64)) blocks per head (split-KV; the launch always has `splits`, the others exit); each writes its fp32 partial (sum P_j V_j, sum P_j) and the last block of a head to
// finish (an atomic counter, reset by it) combines them into o. The block whose range holds slot s
// writes the new key and value before it reads its range; no other block reads slot s.
// Every tensor is in `dtype` (fp32 / bf16 / fp16); HS = 8 * 2^k <= 256, gs even. Launched with
// programmatic dependent launch on sm_90+ (pdl.cuh): inv_freq is read before the previous kernel
// of the stream has completed (no kernel of the step may write it), everything else after.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {

struct DecodeAttentionParams {
  const void* qkv = nullptr;  // (3 NH HS): q, k, v, head-major
  void* k_cache = nullptr;    // (NH, L, HS)
  void* v_cache = nullptr;    // (NH, L, HS)
  void* out = nullptr;        // (NH HS) attention output, head-major
  DType dtype = DType::kFloat;
  const int64_t* pos = nullptr;       // (1) device: the query's absolute position
  const float* inv_freq = nullptr;    // (gs / 2) rope frequencies, or nullptr (no positions)
  float* partials = nullptr;          // (NH, splits, HS + 1) scratch
  unsigned int* counters = nullptr;   // (NH) zeroed once; every launch leaves them zero
  int heads = 1, head_dim = 64, groups = 1, max_len = 1, splits = 1;
  float scale = 10.f, shift = 10.f;
  bool normalize = true;  // cosine: divide by sum P_j; exp: not
};

// Whether the kernel takes this head size / group count.
bool decode_attention_supported(int head_dim, int groups);
// Splits per head that fill the device (splits <= max_len).
int decode_attention_splits(int heads, int max_len, int num_sms);

cudaError_t run_decode_attention(const DecodeAttentionParams& p, cudaStream_t stream);

}  // namespace flashcos::cuda
