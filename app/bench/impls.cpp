// ./train bench: the implementations (see impls.h and the list at the top of bench.cpp).
#include "app/bench/impls.h"

#include <flashcos/attention.h>
#include <flashcos/fastmax.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

namespace flashcos::app::bench {
namespace {

// Enables exactly one SDPA backend for its lifetime (what Python's sdpa_kernel() does).
class SdpaOnly {
 public:
  explicit SdpaOnly(at::SDPBackend backend) {
    auto& ctx = at::globalContext();
    flash_ = ctx.userEnabledFlashSDP();
    efficient_ = ctx.userEnabledMemEfficientSDP();
    math_ = ctx.userEnabledMathSDP();
    cudnn_ = ctx.userEnabledCuDNNSDP();
    overrideable_ = ctx.userEnabledOverrideableSDP();
    ctx.setSDPUseFlash(backend == at::SDPBackend::flash_attention);
    ctx.setSDPUseMemEfficient(backend == at::SDPBackend::efficient_attention);
    ctx.setSDPUseMath(backend == at::SDPBackend::math);
    ctx.setSDPUseCuDNN(backend == at::SDPBackend::cudnn_attention);
    ctx.setSDPUseOverrideable(false);
  }
  ~SdpaOnly() {
    auto& ctx = at::globalContext();
    ctx.setSDPUseFlash(flash_);
    ctx.setSDPUseMemEfficient(efficient_);
    ctx.setSDPUseMath(math_);
    ctx.setSDPUseCuDNN(cudnn_);
    ctx.setSDPUseOverrideable(overrideable_);
  }
  SdpaOnly(const SdpaOnly&) = delete;
  SdpaOnly& operator=(const SdpaOnly&) = delete;

 private:
  bool flash_, efficient_, math_, cudnn_, overrideable_;
};
}  // namespace

std::vector<Impl> make_impls(const BenchConfig& cfg) {
  const bool exp_kind = cfg.attention == "exp";
  // With --attention fastmax the cosine implementations run cosine attention beside it.
  const auto base = AttentionOptions()
                        .causal(cfg.causal)
                        .scale(cfg.scale)
                        .l2norm_qk(cfg.include_l2norm && !exp_kind)
                        .deterministic(cfg.deterministic)
                        .kind(exp_kind ? AttentionKind::kExp : AttentionKind::kCosine);
  const bool bias_batch = cfg.bias == "batch";
  const auto ours = [base, bias_batch](Backend backend) -> AttentionFn {
    return [base, backend, bias_batch](const Inputs& in) {
      auto options = base;
      options.mask(in.mask);
      if (in.bias.defined()) options.attn_bias(in.bias).attn_bias_batch_dim(bias_batch);
      if (backend == Backend::kPlain) {
        return plain_cosine_sim_attention(in.q, in.k, in.v, options);
      }
      return cosine_sim_attention(in.q, in.k, in.v, options.backend(backend));
    };
  };
  const bool causal = cfg.causal;
  const double scale = cfg.scale;
  const bool l2 = cfg.include_l2norm;
  const auto sdpa = [causal, scale, l2](at::SDPBackend backend) -> AttentionFn {
    return [causal, scale, l2, backend](const Inputs& in) {
      const at::Tensor q = l2 ? l2norm(in.q) : in.q;
      const at::Tensor k = l2 ? l2norm(in.k) : in.k;
      SdpaOnly only(backend);
      // SDPA refuses attn_mask together with is_causal: the causal part is then in sdpa_mask.
      std::optional<at::Tensor> attn_mask;
      if (in.sdpa_mask.defined()) attn_mask = in.sdpa_mask;
      return at::scaled_dot_product_attention(q, k, in.v, attn_mask, 0.0,
                                              causal && !in.sdpa_mask.defined(), scale);
    };
  };

  std::vector<Impl> all;
  all.push_back({"plain", ours(Backend::kPlain), ""});
  all.push_back({"tiled", ours(Backend::kTiled), ""});
  std::string fused_missing;
  if (!fused_kernels_compiled()) {
    fused_missing = "this build has no fused CUDA kernels (built without nvcc)";
  } else if (!cfg.cuda) {
    fused_missing = "the fused kernel runs on CUDA tensors only (--device cuda)";
  }
  all.push_back({"fused", ours(Backend::kFused), fused_missing});
  const std::string sdpa_missing =
      exp_kind ? "SDPA computes softmax attention; it has no unnormalised exp variant" : "";
  const std::string cuda_only = cfg.cuda ? "" : "this SDPA backend runs on CUDA only";
  all.push_back({"sdpa-flash", sdpa(at::SDPBackend::flash_attention), sdpa_missing});
  all.push_back({"sdpa-cudnn", sdpa(at::SDPBackend::cudnn_attention),
                 sdpa_missing.empty() ? cuda_only : sdpa_missing});
  all.push_back({"sdpa-efficient", sdpa(at::SDPBackend::efficient_attention),
                 sdpa_missing.empty() ? cuda_only : sdpa_missing});
  all.push_back({"sdpa-math", sdpa(at::SDPBackend::math), sdpa_missing});

  // Fastmax on the same q, k, v (l2-normalised, so |s| <= 1 / temperature).
  const bool fastmax_kind = cfg.attention == "fastmax";
  const auto fastmax = [&cfg](FastmaxBackend backend) -> AttentionFn {
    const auto options = FastmaxOptions(cfg.fastmax).causal(cfg.causal).backend(backend);
    return [options](const Inputs& in) { return fastmax_attention(in.q, in.k, in.v, options); };
  };
  const std::string not_fastmax = fastmax_kind ? "" : "fastmax runs with --attention fastmax";
  std::string fastmax_cuda_missing = not_fastmax;
  if (fastmax_cuda_missing.empty() && !fastmax_cuda_compiled()) {
    fastmax_cuda_missing = "this build has no fastmax CUDA kernels";
  } else if (fastmax_cuda_missing.empty() && !cfg.cuda) {
    fastmax_cuda_missing = "the fastmax CUDA kernels run on CUDA tensors only (--device cuda)";
  }
  all.push_back({"fastmax-cuda", fastmax(FastmaxBackend::kCuda), fastmax_cuda_missing});
  all.push_back({"fastmax-chunked", fastmax(FastmaxBackend::kChunked), not_fastmax});
  all.push_back({"fastmax-ref", fastmax(FastmaxBackend::kReference), not_fastmax});
  if (fastmax_kind && (cfg.mask_prob > 0 || cfg.bias != "none")) {
    for (auto& impl : all) {
      if (impl.name.rfind("fastmax-", 0) == 0 && impl.unavailable.empty()) {
        impl.unavailable = cfg.mask_prob > 0 ? "fastmax has no key mask (--mask-prob)" : "fastmax has no bias (--bias)";
      }
    }
  }

  std::vector<Impl> chosen;
  if (cfg.impls.empty()) {
    // Everything that can run here; what cannot is left out (named with --impls it prints n/a).
    for (auto& impl : all) {
      if (!impl.unavailable.empty()) continue;
      // Beside fastmax's long lengths the chunked cosine path is only worth timing on the CPU.
      if (fastmax_kind && impl.name == "tiled" && cfg.cuda) continue;
      chosen.push_back(impl);
    }
  } else {
    for (const auto& name : cfg.impls) {
      for (auto& impl : all) {
        if (impl.name == name) chosen.push_back(impl);
      }
    }
  }
  return chosen;
}

Inputs make_inputs(const BenchConfig& cfg, const DtypeSpec& dtype, int64_t dim_head, int64_t n,
                   bool need_sdpa_mask) {
  const auto device = cfg.cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  const auto opts = at::TensorOptions().dtype(dtype.type).device(device);
  at::manual_seed(cfg.seed);
  Inputs in;
  at::Tensor q = at::randn({cfg.batch, cfg.heads, n, dim_head}, opts);
  at::Tensor k = at::randn({cfg.batch, cfg.heads, n, dim_head}, opts);
  // Normalised outside the timing (and for the exp kind always, so that exp(scale q.k) stays
  // finite).
  if (!cfg.include_l2norm || cfg.attention == "exp") {
    q = l2norm(q);
    k = l2norm(k);
  }
  in.q = q.detach().requires_grad_(true);
  in.k = k.detach().requires_grad_(true);
  in.v = at::randn({cfg.batch, cfg.heads, n, dim_head}, opts).requires_grad_(true);
  in.dout = at::randn({cfg.batch, cfg.heads, n, dim_head}, opts);
  if (cfg.bias != "none") {
    const int64_t lead = cfg.bias == "batch" ? cfg.batch : cfg.heads;
    in.bias = (0.5 * at::randn({lead, n, n}, at::TensorOptions().dtype(at::kFloat).device(device))).requires_grad_(true);
  }
  if (cfg.mask_prob > 0.0) in.mask = at::rand({cfg.batch, n}, at::TensorOptions().device(device)).ge(cfg.mask_prob);
  if (need_sdpa_mask && (in.mask.defined() || in.bias.defined())) {
    // keep (B or 1, 1, n or 1, n): the key is not masked out and, causal, not above the diagonal
    // (undefined: everything kept). SDPA gets it as a bool attn_mask, or, with a bias, a float one
    // added to the logits: the bias with -inf where not kept, in q's dtype (what SDPA expects).
    at::Tensor keep;
    if (in.mask.defined()) keep = in.mask.view({cfg.batch, 1, 1, n});
    if (cfg.causal) {
      const at::Tensor lower = at::ones({n, n}, at::TensorOptions().dtype(at::kBool).device(device)).tril().view({1, 1, n, n});
      keep = keep.defined() ? keep.logical_and(lower) : lower;
    }
    if (in.bias.defined()) {
      at::Tensor m = in.bias.detach().view(cfg.bias == "batch" ? std::vector<int64_t>{cfg.batch, 1, n, n}
                                                               : std::vector<int64_t>{1, cfg.heads, n, n});
      if (keep.defined()) m = m.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
      in.sdpa_mask = m.to(dtype.type).contiguous();
    } else {
      in.sdpa_mask = keep.contiguous();
    }
  }
  return in;
}
bool has_impl(const std::vector<Impl>& impls, const std::string& name) {
  return std::any_of(impls.begin(), impls.end(), [&](const Impl& i) { return i.name == name; });
}

}  // namespace flashcos::app::bench
