// Torch-free parameters of the fused cosine-sim attention kernels, one struct per direction.
//
// attention/cosine/cuda_ops.cpp fills them from tensors in exactly one function each; the kernels see
// only raw pointers, element strides and a stream. Vocabulary (attention/README.md):
//   B batch, H query heads, Hkv key/value heads (H % Hkv == 0), I queries, J keys, D head dim.
// Every tensor's last dim is contiguous; the other strides are given in elements.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/common/cuda/dtype.h"

namespace flashcos::cuda {


// What the forward and the backward share: inputs, sizes, semantics.
struct CommonParams {
  DType dtype = DType::kBFloat16;
  int B = 0, H = 0, Hkv = 0, I = 0, J = 0, D = 0;

  const void* q = nullptr;  // (B, H, I, D)
  const void* k = nullptr;  // (B, Hkv, J, D)
  const void* v = nullptr;  // (B, Hkv, J, D)
  int64_t q_b_stride = 0, q_h_stride = 0, q_i_stride = 0;
  int64_t k_b_stride = 0, k_h_stride = 0, k_j_stride = 0;
  int64_t v_b_stride = 0, v_h_stride = 0, v_j_stride = 0;

  const uint8_t* mask = nullptr;  // (B, J) bool, true = attend; nullptr = no mask
  int64_t mask_b_stride = 0, mask_j_stride = 0;

  // (H, I, J), or (B, I, J) with bias_batch_dim; float for 16/32-bit inputs, double for double.
  const void* bias = nullptr;
  bool bias_batch_dim = false;
  int64_t bias_0_stride = 0, bias_i_stride = 0, bias_j_stride = 0;

  bool causal = false;    // bottom-right aligned: query r sees keys 0 .. r + J - I
  bool exp_kind = false;  // P = exp(scale q.k + bias), o = P v, no l
  float scale = 10.f;
  double scale_d = 10.0;  // the same scale for the double kernels
  // Upper bound of q . k for the cosine kind: 1 for l2-normalised q, k, the number of groups when
  // they are normalised in groups (without l2norm q, k count as unit-norm).
  float qk_max = 1.f;
};

struct FwdParams : CommonParams {
  void* o = nullptr;  // (B, H, I, D), strides below
  int64_t o_b_stride = 0, o_h_stride = 0, o_i_stride = 0;
  void* l = nullptr;  // (B, H, I) contiguous row sums (float; double for double); nullptr for exp
  // The Hopper forward without a bias: CTAs in groups of this many (b, head)s, each group's row
  // blocks heaviest first (hopper::grouped_cta; > 1 only under a causal mask). Set by its launcher.
  int head_group = 1;
  // The Hopper forward's split tail (hopper::choose_tail_split; d 64, fixed offset, no bias, not causal):
  // CTAs from index split_first on each run one of split_pieces shares of a (row block, head)'s key
  // blocks; the one that finishes last adds the others' unnormalised O and row sums (split_scratch:
  // split_pieces slots of run_fwd_split_slots' floats per split block) to its own, in piece order,
  // and stores o and l. split_count: a counter per split block, zeroed by the caller. Set by its
  // launcher (none: split_first past the grid).
  int split_first = 0x7fffffff;
  int split_pieces = 1;
  float* split_scratch = nullptr;  // given by the caller: split_slots slots (run_fwd_split_slots)
  int* split_count = nullptr;
  int64_t split_slots = 0;
};

struct BwdParams : CommonParams {
  const void* o = nullptr;   // (B, H, I, D) forward output
  const void* dout = nullptr;  // (B, H, I, D)
  int64_t o_b_stride = 0, o_h_stride = 0, o_i_stride = 0;
  int64_t do_b_stride = 0, do_h_stride = 0, do_i_stride = 0;
  const void* l = nullptr;  // (B, H, I) contiguous; nullptr for exp

  // Scratch, (B, H, I) contiguous accumulator type: D_i = do_i . o_i (0 for the exp kind).
  void* delta = nullptr;
  // Scratch for the 16-bit kernels, (B, H, I) float: the per-row log2 offset c_i with
  // P_ij = exp2(scale log2e s_ij + bias_ij log2e + c_i), i.e. c_i = -scale log2e - log2 l_i
  // (-inf for an empty row, 0 for the exp kind), written by the delta kernel so that the main
  // kernel streams it with cp.async. The log form keeps P exact where exp(logit) and l both
  // underflow fp32 (large scales).
  void* row_offset = nullptr;

  // dq: the 16-bit kernels add into dq_accum (B, H, I, D) float, contiguous, zeroed by the
  // caller (or by the launcher: dq_zero_floats), multiplied by scale once the launcher returns (the
  // Hopper fp16 80-row backward leaves the scale to dq_out's conversion, or without dq_out to the
  // caller through dq_scale_left: hopper::bwd_dq_unscaled); the fp32/fp64 kernels write dq directly.
  void* dq_accum = nullptr;
  // Host memory, needed by the 16-bit kernels without dq_out (else cudaErrorInvalidValue where the
  // kernel would leave the scale out): where the launcher left the softmax scale out of dq_accum it
  // writes that scale here, for the caller to apply as it reads dq_accum (the packed QKV path's
  // l2norm backward); elsewhere it leaves the value alone (the caller sets 1 first). No kernel reads it.
  float* dq_scale_left = nullptr;
  // 16-bit kernels: where > 0, the dq_zero_floats floats from dq_accum (dq_accum and the int counters
  // the caller keeps after it in one allocation: item_counter, dq_done) come unzeroed, and the
  // launcher zeroes them in its delta kernel, which runs before any kernel reads them (a memset where
  // no kernel runs): one pass over dq_accum fewer than a fill before the call.
  int64_t dq_zero_floats = 0;
  void* dq = nullptr;  // (B, H, I, D) contiguous, fp32/fp64 kernels only
  // The 16-bit kernels' dq, or nullptr (the caller converts dq_accum itself): (B, H, I, D)
  // contiguous, the inputs' type, written from dq_accum by the launcher's last kernel (dq_finish.cuh).
  void* dq_out = nullptr;
  // With dq_out: (B, Hkv) int counters zeroed by the caller, or nullptr. The Hopper backward's dQ
  // warps count there each CTA's completed adds into its (b, kv head)'s dQ, so that dq_out's
  // conversion of a head starts while the other heads' CTAs still run (dq_finish.cuh).
  int* dq_done = nullptr;
  // An int zeroed by the caller, or nullptr: the Hopper backward's persistent grid hands its items out
  // from it (hopper/bwd_producer.cuh, BwdItemQueue); without it the grid has a CTA an item.
  int* item_counter = nullptr;
  void* dk = nullptr;  // (B, Hkv, J, D), strides below (16-bit kernels: multiples of 8, 16-byte aligned)
  void* dv = nullptr;  // (B, Hkv, J, D), strides below (likewise)
  int64_t dk_b_stride = 0, dk_h_stride = 0, dk_j_stride = 0;
  int64_t dv_b_stride = 0, dv_h_stride = 0, dv_j_stride = 0;
  // (H or B, I, J) contiguous accumulator type, zeroed by the caller; nullptr without bias. With
  // dbias_per_head it is (B, H, I, J): every element is added once (deterministic), and the caller
  // sums the broadcast dim.
  void* dbias_accum = nullptr;
  bool dbias_per_head = false;
  // Deterministic dq: (B, H, ceil(I / 16)) int counters, zeroed by the caller, or nullptr. The 16-bit
  // kernels add their dQ part of a row unit (rows r0 .. r0 + n of one (b, h), r0 a multiple of 16)
  // only after every lower key block did: counter r0 / 16 counts the adds made so far
  // (dq_semaphore.cuh).
  int* dq_semaphore = nullptr;
  // The Hopper backward's CTA order (bwd_hopper_ws.cuh): key blocks in bands of this many, the
  // bands slowest, then (b, kv head), then the key block in its band. Set by its launcher.
  int key_band = 1;
  // Deterministic, Hopper: each band's key blocks start at spread-out query units and add into a
  // unit in the order they reach it (hopper::DqTurns), instead of in key-block order. Set by its
  // launcher.
  bool det_rotate = false;
  // The Hopper backward, causal: CTAs in groups of this many (b, kv head)s (hopper::bwd_cta), or 0;
  // deterministic, each block's steps backwards (hopper::DqTurns). Set by its launcher.
  int head_group = 0;
  bool det_reverse = false;
  // The Hopper backward's plain 80-row instance, causal: steps on the 80-row grid, as before
  // 2026-11-28 (FLASHCOS_HOPPER_BWD_ROW_GRID=1, a comparison variant), instead of from the first row
  // that sees the key block (hopper::bwd_rows). Set by its launcher.
  bool bwd_rows_on_grid = false;
  // The Hopper backward's 80-row instances on a grid of a CTA an item: K, V requested by thread 0
  // right after the barriers' initialisation, before the CTA's first barrier, and each stage's Q, dO
  // before the producer stalls on its row stats (hopper::bwd_load), so that their latency overlaps
  // the prologue. Set by its launcher (FLASHCOS_HOPPER_BWD_EARLY_LOADS=0: off).
  bool bwd_early_loads = false;
  // The Hopper backward's split tail (hopper::choose_tail_split; plain, not causal): CTAs from index
  // split_first on each run one of split_pieces shares of a (key block, kv head)'s steps; the one
  // that finishes last adds the others' dK / dV parts (split_scratch: split_pieces slots of 256 x D
  // floats per split block) to its own, in piece order, and stores them. split_count: a counter per
  // split block, zeroed by the caller. Set by its launcher (none: split_first past the grid).
  int split_first = 0x7fffffff;
  int split_pieces = 1;
  float* split_scratch = nullptr;  // given by the caller: split_slots slots (run_bwd_split_slots)
  int* split_count = nullptr;
  int64_t split_slots = 0;
  // Deterministic dq on the Hopper backward (its kFixed instance), or nullptr: (B, H, I) float, row
  // i's constant c_i = 1.5 * 2^(u_i + 23), written by the delta kernel from dq_grid_kv ((B, Hkv, 2)
  // uint32, zeroed by the caller, filled by the launcher's K / V maxima kernel; dq_grid.cuh). Each
  // key block rounds its part of the row to a multiple of 2^u_i, (x + c_i) - c_i, before adding it
  // to dq_accum, and u_i is such that every partial sum is exact in float32
  // (attention/cosine/dq_grid.h): the sum is then the same in any order, and the adds need no turns.
  // The other kernels ignore both (dq_semaphore orders their adds).
  float* dq_grid = nullptr;
  unsigned* dq_grid_kv = nullptr;
};

// Whether the 16-bit forward needs the online-max variant (fwd_kernel.cuh's header explains the
// limits): with q . k <= 1, fp16 with a bias or past scale 10.05, bf16 past scale 34; fp16
// whenever q . k can pass 1 (P = exp(scale (q.k - 1)) above 1 overflows the fixed 2^15 shift),
// bf16 once it can pass 2^100; never for the exp kind. Both forward families follow it (the sm_80
// fwd_kernel.cuh and the Hopper hopper/fwd_hopper_ws.cuh, kOnline) and save the same l.
inline bool fwd_needs_online(const CommonParams& p, bool is_half) {
  if (p.exp_kind) return false;
  const float k = p.scale * 1.4426950408889634f;
  const float top_log2 = k * (p.qk_max - 1.f);   // log2 of the largest P
  const float span_log2 = k * (p.qk_max + 1.f);  // binades from the largest to the smallest P
  if (is_half) return p.bias != nullptr || top_log2 > 0.f || span_log2 > 29.f;
  return top_log2 > 100.f || span_log2 > 100.f;
}

// The launchers (attention/cosine/cuda/launch.cu). They pick the kernel family for the inputs, the
// device and the direction (on compute capability 9.0, the Hopper wgmma kernels for every 16-bit
// forward and backward, key mask, bias (with its gradient) and online max included;
// the sm_80 mma.sync kernels for the other 16-bit cases; SIMT for fp32 / fp64; launch.cu's
// hopper_covers_fwd / hopper_covers_bwd decide) and return the first CUDA error, for the caller to
// check.
bool supports_head_dim(int d);
// Launches that went to the Hopper family so far in this process: forwards, backwards, both.
int64_t hopper_fwd_launches();
int64_t hopper_bwd_launches();
int64_t hopper_launches();
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);
// The pieces of the Hopper backward's split tail for params (0: none; hopper/split_tail.h): the caller
// gives run_bwd split_slots slots of *slot_floats floats (split_scratch) and as many zeroed int
// counters (split_count), or runs it without the split.
int64_t run_bwd_split_slots(const BwdParams& params, int* slot_floats);
// The same for the Hopper forward's split tail (run_fwd).
int64_t run_fwd_split_slots(const FwdParams& params, int* slot_floats);
// The deterministic mode's dQ grid alone (dq_grid.cuh; fp16 / bf16): params.dq_grid from dout, k, v,
// scale and the zeroed params.dq_grid_kv. For tests.
cudaError_t run_dq_grid(const BwdParams& params, cudaStream_t stream);

}  // namespace flashcos::cuda
