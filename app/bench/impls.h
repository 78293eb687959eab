// ./train bench: the implementations it times (ours, the SDPA baselines, Fastmax) and the inputs
// they share.
#pragma once

#include "app/bench/options.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace flashcos::app::bench {

// The same inputs for every implementation. q and k are l2-normalised unless --include-l2norm.
struct Inputs {
  at::Tensor q, k, v;    // (B, H, N, D), leaves that require grad
  at::Tensor dout;       // (B, H, N, D) output gradient
  at::Tensor mask;       // (B, N) bool, true = attend; undefined without --mask-prob
  at::Tensor sdpa_mask;  // mask (and causal) as SDPA's attn_mask: (B, 1, 1|N, N) bool; with --bias
                         // the bias with -inf where masked, float: (1|B, H|1, N, N)
  at::Tensor bias;       // --bias: (H, N, N) or (B, N, N) float32, requires grad; else undefined
};

using AttentionFn = std::function<at::Tensor(const Inputs&)>;

struct Impl {
  std::string name;
  AttentionFn fn;
  std::string unavailable;  // non-empty: why this implementation cannot run here (prints n/a)
};

// The implementations to time: --impls in that order, or (none given) every one that can run
// here. Each one that cannot run carries the reason in `unavailable`.
std::vector<Impl> make_impls(const BenchConfig& cfg);

// Fresh random inputs (seeded by --seed) of one configuration on the bench's device.
// need_sdpa_mask: also build sdpa_mask from the key mask (and causal) and the bias.
Inputs make_inputs(const BenchConfig& cfg, const DtypeSpec& dtype, int64_t dim_head, int64_t n,
                   bool need_sdpa_mask);

bool has_impl(const std::vector<Impl>& impls, const std::string& name);

}  // namespace flashcos::app::bench
