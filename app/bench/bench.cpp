// ./train bench: times attention implementations on the same inputs, as the seed's benchmark.py.
//
//   ./train bench --causal --dtype bf16 --seq-lens 1024,2048,4096,8192
//
// For every (dtype, head dim, pass) it prints the seed's table (kernel vs the plain baseline) and a
// full table of every implementation this build has on this device: median ms, TFLOP/s and peak
// memory. FLOPs: fwd 4*B*H*I*J*D (halved for causal), bwd 2.5x fwd, fwd+bwd 3.5x fwd; masked keys
// are not subtracted. --json FILE writes every number, one record per implementation x config.
//
// Implementations (same q, k, v, mask and output gradient for each):
//   plain           flashcos::plain_cosine_sim_attention: the full (I, J) matrix (the baseline)
//   tiled           Backend::kTiled: chunked libtorch ops
//   fused           Backend::kFused: our CUDA kernel (CUDA builds, CUDA device)
//   sdpa-flash, sdpa-cudnn, sdpa-efficient, sdpa-math
//                   at::scaled_dot_product_attention with only that backend enabled, on the same
//                   l2-normalised q, k and the same scale: softmax(scale q.k) is exactly the cosine
//                   kind's exp(scale q.k - scale) / l (cosine kind only).
// q and k are l2-normalised once before timing and every implementation gets them with l2norm off,
// so the timings compare the attention alone; --include-l2norm moves the normalisation into the
// timed region of every implementation.
//
// Passes, each timed after warm-up with one pair of CUDA events per iteration (std::chrono on CPU),
// reported as the median:
//   fwd      the training forward: inputs require grad, the graph is built and dropped
//   bwd      one forward outside the timed region, then autograd::grad(retain_graph) per iteration
//   fwd+bwd  forward and autograd::grad per iteration
// An out-of-memory error prints `oom`, an implementation that rejects the config prints `n/a` (the
// reason follows the table), and the run continues.
#include "app/commands.h"
#include <flashcos/attention.h>
#include <flashcos/fastmax.h>
#include "common/log.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/Parallel.h>
#include <ATen/SDPBackend.h>
#include <c10/core/Event.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <torch/headeronly/version.h>

#if defined(FLASHCOS_WITH_CUDA) && __has_include(<ATen/cuda/CUDAContext.h>) && \
    __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAContext.h>
#define FLASHCOS_BENCH_DEVICE_PROPS 1
#endif

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashcos::app {
namespace {

// ---- configuration -------------------------------------------------------------------------

enum class Pass { kFwd, kBwd, kFwdBwd };

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::kFwd: return "fwd";
    case Pass::kBwd: return "bwd";
    case Pass::kFwdBwd: return "fwd+bwd";
  }
  return "?";
}

const char* pass_title(Pass p) {
  switch (p) {
    case Pass::kFwd: return "forward";
    case Pass::kBwd: return "backward";
    case Pass::kFwdBwd: return "forward + backward";
  }
  return "?";
}

// FLOPs of one pass relative to the forward's 4*B*H*I*J*D.
double pass_flop_factor(Pass p) {
  switch (p) {
    case Pass::kFwd: return 1.0;
    case Pass::kBwd: return 2.5;
    case Pass::kFwdBwd: return 3.5;
  }
  return 0.0;
}

struct DtypeSpec {
  std::string name;       // fp32 | fp16 | bf16 (what --dtype and the JSON use)
  std::string long_name;  // float32 | float16 | bfloat16 (the seed's table header)
  at::ScalarType type;
};

const std::vector<std::string>& all_impl_names() {
  static const std::vector<std::string> names = {
      "plain",          "tiled",     "fused",        "sdpa-flash",      "sdpa-cudnn",
      "sdpa-efficient", "sdpa-math", "fastmax-cuda", "fastmax-chunked", "fastmax-ref"};
  return names;
}

struct BenchConfig {
  bool causal = false;
  double mask_prob = 0.0;
  std::vector<Pass> passes;
  std::vector<DtypeSpec> dtypes;
  int64_t batch = 4;
  int64_t heads = 8;
  std::vector<int64_t> dim_heads;
  std::vector<int64_t> seq_lens;
  std::string attention = "cosine";  // cosine | exp | fastmax
  FastmaxOptions fastmax;            // --attention fastmax: p, normalize, lim, temperature, chunk
  std::vector<std::string> impls;    // empty: every implementation available here
  std::string kernel = "auto";       // the seed table's "kernel" column
  std::string baseline = "plain";    // the seed table's "baseline" column
  int warmup = 5;
  int rounds = 1;  // the implementations take turns this many times; the fastest round is kept
  int iters = 30;
  double budget_s = 2.0;  // per implementation x pass x config: fewer iterations when slow
  bool cuda = false;
  double scale = 10.0;
  bool include_l2norm = false;
  uint64_t seed = 0;
  std::string json_path;
  std::string command_line;
};

std::string first_line(const std::string& s);

// A bad command line: the message names the option; run_bench prints it and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> split_list(const std::string& option, const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = trim(text.substr(begin, end - begin));
    begin = end + 1;
    if (item.empty()) {
      throw UsageError("--" + option + " '" + text +
                       "': empty item in the comma-separated list (e.g. 1024,2048)");
    }
    out.push_back(item);
  }
  if (out.empty()) throw UsageError("--" + option + ": expected at least one value");
  return out;
}

int64_t parse_int(const std::string& option, const std::string& text, int64_t min_value) {
  int64_t value = 0;
  size_t used = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw UsageError("--" + option + " '" + text + "': expected an integer");
  }
  if (value < min_value) {
    throw UsageError("--" + option + " " + text +
                     ": expected an integer >= " + std::to_string(min_value));
  }
  return value;
}

double parse_double(const std::string& option, const std::string& text) {
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value)) {
    throw UsageError("--" + option + " '" + text + "': expected a number");
  }
  return value;
}

std::vector<int64_t> parse_int_list(const std::string& option, const std::string& text,
                                    int64_t min_value) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(option, text))
    out.push_back(parse_int(option, item, min_value));
  return out;
}

DtypeSpec parse_dtype(const std::string& text) {
  if (text == "fp32" || text == "float32" || text == "float")
    return {"fp32", "float32", at::kFloat};
  if (text == "fp16" || text == "float16" || text == "half") return {"fp16", "float16", at::kHalf};
  if (text == "bf16" || text == "bfloat16") return {"bf16", "bfloat16", at::kBFloat16};
  throw UsageError("--dtype '" + text + "': expected fp32, fp16 or bf16 (or a comma list of them)");
}

cxxopts::Options make_options() {
  cxxopts::Options options("./train bench",
                           "Times attention implementations on the same inputs (median of CUDA-event "
                           "timed iterations after warm-up) and prints the seed's table plus ms, "
                           "TFLOP/s and peak memory of every implementation.");
  // Every value is read as text and parsed here, so an error names the option it came from.
  const auto text = [](const char* value) {
    return cxxopts::value<std::string>()->default_value(value);
  };
  // clang-format off
  options.add_options("shape")
      ("batch", "batch size B", text("4"))
      ("heads", "attention heads H", text("8"))
      ("dim-head", "head dim D, or a comma list (64,128)", text("64"))
      ("seq-lens", "sequence lengths I = J, comma list", text("1024,2048,4096,8192"))
      ("dtype", "fp32 | fp16 | bf16, or a comma list (default bf16 on cuda, fp32 on cpu)", text(""));
  options.add_options("attention")
      ("attention", "cosine | exp (the unnormalised variant) | fastmax (linear; the cosine "
                    "implementations run beside it for comparison)", text("cosine"))
      ("causal", "causal (autoregressive) attention")
      ("mask-prob", "probability that a key is masked out (key mask (B, J)), in [0, 1)", text("0"))
      ("scale", "attention scale", text("10"))
      ("include-l2norm", "time the l2 normalisation of q and k too (default: outside the timing)")
      ("fastmax-p", "fastmax polynomial order 1 | 2", text("2"))
      ("fastmax-normalize", "fastmax: rescale q, k per token to norm --fastmax-lim")
      ("fastmax-lim", "fastmax normalize radius", text("1"))
      ("fastmax-temperature", "fastmax temperature", text("1"))
      ("fastmax-chunk-size", "fastmax causal scan chunk; 0 = automatic (64 on the fused CUDA scan)", text("0"));
  options.add_options("what to time")
      ("impls", "comma list restricting the implementations: plain, tiled, fused, sdpa-flash, "
                "sdpa-cudnn, sdpa-efficient, sdpa-math; with --attention fastmax also "
                "fastmax-cuda, fastmax-chunked, fastmax-ref (default: all available here)", text(""))
      ("only-forwards", "time the forward pass only")
      ("only-backwards", "time the backward pass only")
      ("kernel", "the seed table's kernel column (default auto: fused where it runs, else tiled; "
                 "fastmax: fastmax-cuda, else fastmax-chunked)", text("auto"))
      ("baseline", "the seed table's baseline column", text("plain"))
      ("warmup", "warm-up iterations", text("5"))
      ("iters", "timed iterations (the median is reported)", text("30"))
      ("rounds", "time every implementation this many times per configuration, taking turns (the "
                 "order reversed every other round), and report each one's fastest round: evens "
                 "out clock and temperature drift between implementations", text("1"))
      ("budget", "seconds per implementation x pass x length; fewer iterations (at least 3) when "
                 "one is slow", text("2"))
      ("device", "cuda | cpu (default cuda when available)", text(""))
      ("seed", "seed of the random inputs", text("0"))
      ("json", "write every measurement to this JSON file", text(""))
      ("h,help", "print this help");
  // clang-format on
  return options;
}

BenchConfig parse_config(const cxxopts::ParseResult& r, const std::string& command_line) {
  BenchConfig cfg;
  cfg.command_line = command_line;
  if (!r.unmatched().empty()) {
    throw UsageError("unexpected argument '" + r.unmatched().front() +
                     "': bench takes only --options (see ./train bench --help)");
  }

  const std::string device = r["device"].as<std::string>();
  if (device == "cuda") {
    if (!torch::cuda::is_available()) {
      throw UsageError(
          "--device cuda: no CUDA device is available to this libtorch; use --device cpu");
    }
    cfg.cuda = true;
  } else if (device == "cpu") {
    cfg.cuda = false;
  } else if (device.empty()) {
    cfg.cuda = torch::cuda::is_available();
  } else {
    throw UsageError("--device '" + device + "': expected cuda or cpu");
  }

  cfg.batch = parse_int("batch", r["batch"].as<std::string>(), 1);
  cfg.heads = parse_int("heads", r["heads"].as<std::string>(), 1);
  cfg.dim_heads = parse_int_list("dim-head", r["dim-head"].as<std::string>(), 1);
  cfg.seq_lens = parse_int_list("seq-lens", r["seq-lens"].as<std::string>(), 1);
  std::string dtypes = r["dtype"].as<std::string>();
  if (dtypes.empty()) dtypes = cfg.cuda ? "bf16" : "fp32";
  for (const auto& d : split_list("dtype", dtypes)) cfg.dtypes.push_back(parse_dtype(d));

  cfg.attention = r["attention"].as<std::string>();
  if (cfg.attention != "cosine" && cfg.attention != "exp" && cfg.attention != "fastmax") {
    throw UsageError("--attention '" + cfg.attention + "': expected cosine, exp or fastmax");
  }
  cfg.fastmax = FastmaxOptions()
                    .p(parse_int("fastmax-p", r["fastmax-p"].as<std::string>(), 1))
                    .normalize(r["fastmax-normalize"].as<bool>())
                    .lim(parse_double("fastmax-lim", r["fastmax-lim"].as<std::string>()))
                    .temperature(parse_double("fastmax-temperature",
                                              r["fastmax-temperature"].as<std::string>()))
                    .chunk_size(parse_int("fastmax-chunk-size",
                                          r["fastmax-chunk-size"].as<std::string>(), 0));
  if (cfg.attention == "fastmax") {
    try {
      check_fastmax_options(cfg.fastmax);
    } catch (const c10::Error& e) {
      throw UsageError("--fastmax-*: " + first_line(e.what_without_backtrace()) +
                       " (e.g. --fastmax-p 1 needs --fastmax-normalize --fastmax-lim 0.9)");
    }
  }
  cfg.causal = r["causal"].as<bool>();
  cfg.mask_prob = parse_double("mask-prob", r["mask-prob"].as<std::string>());
  if (cfg.mask_prob < 0.0 || cfg.mask_prob >= 1.0) {
    throw UsageError("--mask-prob " + r["mask-prob"].as<std::string>() +
                     ": expected a probability in [0, 1)");
  }
  cfg.scale = parse_double("scale", r["scale"].as<std::string>());
  cfg.include_l2norm = r["include-l2norm"].as<bool>();

  const bool only_fwd = r["only-forwards"].as<bool>();
  const bool only_bwd = r["only-backwards"].as<bool>();
  if (only_fwd && only_bwd) {
    throw UsageError(
        "--only-forwards and --only-backwards exclude each other; give at most one "
        "(neither times fwd, bwd and fwd+bwd)");
  }
  if (only_fwd) {
    cfg.passes = {Pass::kFwd};
  } else if (only_bwd) {
    cfg.passes = {Pass::kBwd};
  } else {
    cfg.passes = {Pass::kFwd, Pass::kBwd, Pass::kFwdBwd};
  }

  const auto known = [](const std::string& name) {
    const auto& all = all_impl_names();
    return std::find(all.begin(), all.end(), name) != all.end();
  };
  const std::string impls = r["impls"].as<std::string>();
  if (!impls.empty()) {
    for (const auto& name : split_list("impls", impls)) {
      if (!known(name)) {
        throw UsageError("--impls '" + name +
                         "': unknown implementation; expected some of plain, tiled, fused, "
                         "sdpa-flash, sdpa-cudnn, sdpa-efficient, sdpa-math, fastmax-cuda, "
                         "fastmax-chunked, fastmax-ref");
      }
      if (std::find(cfg.impls.begin(), cfg.impls.end(), name) == cfg.impls.end()) {
        cfg.impls.push_back(name);
      }
    }
  }
  cfg.kernel = r["kernel"].as<std::string>();
  if (cfg.kernel != "auto" && !known(cfg.kernel)) {
    throw UsageError("--kernel '" + cfg.kernel + "': expected auto or an implementation name");
  }
  cfg.baseline = r["baseline"].as<std::string>();
  if (!known(cfg.baseline)) {
    throw UsageError("--baseline '" + cfg.baseline + "': expected an implementation name");
  }

  cfg.warmup = static_cast<int>(parse_int("warmup", r["warmup"].as<std::string>(), 0));
  cfg.rounds = static_cast<int>(parse_int("rounds", r["rounds"].as<std::string>(), 1));
  cfg.iters = static_cast<int>(parse_int("iters", r["iters"].as<std::string>(), 1));
  cfg.budget_s = parse_double("budget", r["budget"].as<std::string>());
  if (cfg.budget_s <= 0) throw UsageError("--budget: expected a positive number of seconds");
  cfg.seed = static_cast<uint64_t>(parse_int("seed", r["seed"].as<std::string>(), 0));
  cfg.json_path = r["json"].as<std::string>();
  return cfg;
}

// ---- implementations -----------------------------------------------------------------------

// The same inputs for every implementation. q and k are l2-normalised unless --include-l2norm.
struct Inputs {
  at::Tensor q, k, v;    // (B, H, N, D), leaves that require grad
  at::Tensor dout;       // (B, H, N, D) output gradient
  at::Tensor mask;       // (B, N) bool, true = attend; undefined without --mask-prob
  at::Tensor sdpa_mask;  // mask (and causal) as SDPA's attn_mask: (B, 1, 1|N, N) bool
};

using AttentionFn = std::function<at::Tensor(const Inputs&)>;

struct Impl {
  std::string name;
  AttentionFn fn;
  std::string unavailable;  // non-empty: why this implementation cannot run here (prints n/a)
};

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

std::vector<Impl> make_impls(const BenchConfig& cfg) {
  const bool exp_kind = cfg.attention == "exp";
  // With --attention fastmax the cosine implementations run cosine attention beside it.
  const auto base = AttentionOptions()
                        .causal(cfg.causal)
                        .scale(cfg.scale)
                        .l2norm_qk(cfg.include_l2norm && !exp_kind)
                        .kind(exp_kind ? AttentionKind::kExp : AttentionKind::kCosine);
  const auto ours = [base](Backend backend) -> AttentionFn {
    return [base, backend](const Inputs& in) {
      auto options = base;
      options.mask(in.mask);
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
  if (fastmax_kind && cfg.mask_prob > 0) {
    for (auto& impl : all) {
      if (impl.name.rfind("fastmax-", 0) == 0 && impl.unavailable.empty()) {
        impl.unavailable = "fastmax has no key mask (--mask-prob)";
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
  if (cfg.mask_prob > 0.0) {
    in.mask = at::rand({cfg.batch, n}, at::TensorOptions().device(device)).ge(cfg.mask_prob);
    if (need_sdpa_mask) {
      at::Tensor m = in.mask.view({cfg.batch, 1, 1, n});
      if (cfg.causal) {
        m = m.logical_and(at::ones({n, n}, at::TensorOptions().dtype(at::kBool).device(device))
                              .tril()
                              .view({1, 1, n, n}));
      }
      in.sdpa_mask = m.contiguous();
    }
  }
  return in;
}

// ---- timing --------------------------------------------------------------------------------

struct Measurement {
  std::string status = "ok";  // ok | oom | n/a
  std::string reason;
  double ms = 0, ms_min = 0, ms_mean = 0;
  int iters = 0;
  int64_t peak_bytes = -1;  // peak allocated by the caching allocator during the pass (CUDA)
  int64_t base_bytes = -1;  // allocated when the pass started (the inputs, mostly)
};

// Collects warnings (SDPA explains there why it rejected a config) instead of printing them.
class WarningCollector : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};

std::string first_line(const std::string& s) {
  const auto end = s.find('\n');
  std::string line = trim(end == std::string::npos ? s : s.substr(0, end));
  // libtorch's CUDA OOM message goes on with a paragraph of allocator advice: keep the size.
  const auto advice = line.find(". GPU ");
  if (line.rfind("CUDA out of memory", 0) == 0 && advice != std::string::npos) {
    line = line.substr(0, advice + 1);
  }
  return line;
}

// Runs body `warmup` times, then up to `iters` timed times; per-iteration ms. Slow configs get
// fewer iterations (at least 3) so that one measurement stays within about budget_s.
std::vector<double> time_iterations(const BenchConfig& cfg, const std::function<void()>& body) {
  using clock = std::chrono::steady_clock;
  const auto sync = [&] {
    if (cfg.cuda) at::accelerator::synchronizeDevice(at::accelerator::getDeviceIndex());
  };
  sync();
  const auto t0 = clock::now();
  // The cost of one iteration is taken from the last warm-up iteration: the first one carries
  // one-time costs (library handles, lazy module loading, allocator growth) that would cut the
  // iteration count of the first measurements (seen on the H100: 9 of 20 for a 0.4 ms config).
  // Warm-up stops early once half the budget is spent, but not before two iterations.
  int warm = 0;
  double per_iter = 0.0;
  while (warm < cfg.warmup) {
    const auto start = clock::now();
    body();
    ++warm;
    sync();
    const auto now = clock::now();
    per_iter = std::chrono::duration<double>(now - start).count();
    if (warm >= 2 && std::chrono::duration<double>(now - t0).count() > 0.5 * cfg.budget_s) break;
  }
  int iters = cfg.iters;
  if (per_iter > 0) {
    const int affordable = static_cast<int>(cfg.budget_s / per_iter);
    iters = std::max(std::min(iters, affordable), std::min(cfg.iters, 3));
  }

  std::vector<double> ms;
  ms.reserve(iters);
  if (cfg.cuda) {
    const auto index = at::accelerator::getDeviceIndex();
    const c10::Stream stream = at::accelerator::getCurrentStream(index);
    std::vector<c10::Event> starts, ends;
    starts.reserve(iters);
    ends.reserve(iters);
    for (int i = 0; i < iters; ++i) {
      starts.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      ends.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    }
    for (int i = 0; i < iters; ++i) {
      starts[i].record(stream);
      body();
      ends[i].record(stream);
    }
    ends.back().synchronize();
    for (int i = 0; i < iters; ++i) ms.push_back(starts[i].elapsedTime(ends[i]));
  } else {
    for (int i = 0; i < iters; ++i) {
      const auto start = clock::now();
      body();
      ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - start).count());
    }
  }
  return ms;
}

// A CUDA error that left the context unusable (illegal address, device-side assert): every later
// measurement would fail too, so the run stops (what was measured is in the JSON already).
struct DeviceLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// After a failed measurement on CUDA: does the device still work?
bool device_alive() {
  try {
    at::accelerator::synchronizeDevice(at::accelerator::getDeviceIndex());
    return at::ones({8}, at::TensorOptions().device(at::kCUDA)).sum().item<double>() == 8.0;
  } catch (const std::exception&) {
    return false;
  }
}

Measurement measure(const BenchConfig& cfg, const Impl& impl, Pass pass, const Inputs& in) {
  Measurement m;
  if (!impl.unavailable.empty()) {
    m.status = "n/a";
    m.reason = impl.unavailable;
    return m;
  }
  WarningCollector warnings;
  c10::WarningUtils::WarningHandlerGuard warning_guard(&warnings);
  const auto index = cfg.cuda ? at::accelerator::getDeviceIndex() : c10::DeviceIndex(0);
  const auto fail = [&](const std::string& status, const std::string& what) {
    m.status = status;
    m.reason = first_line(what);
    // SDPA's "No available kernel" is explained by the warnings it issued just before.
    for (const auto& w : warnings.messages) {
      if (m.reason.size() > 400) break;
      m.reason += "; " + first_line(w);
    }
  };
  try {
    if (cfg.cuda) {
      at::accelerator::synchronizeDevice(index);
      m.base_bytes = at::accelerator::getDeviceStats(index).allocated_bytes[0].current;
      at::accelerator::resetPeakStats(index);
    }
    std::vector<double> ms;
    {
      const std::vector<at::Tensor> inputs = {in.q, in.k, in.v};
      at::Tensor out;  // bwd: the graph every timed backward walks again (retain_graph)
      std::function<void()> body;
      switch (pass) {
        case Pass::kFwd: body = [&] { at::Tensor o = impl.fn(in); }; break;
        case Pass::kBwd:
          out = impl.fn(in);
          body = [&] { auto grads = torch::autograd::grad({out}, inputs, {in.dout}, true); };
          break;
        case Pass::kFwdBwd:
          body = [&] {
            at::Tensor o = impl.fn(in);
            auto grads = torch::autograd::grad({o}, inputs, {in.dout}, false);
          };
          break;
      }
      ms = time_iterations(cfg, body);
    }
    if (cfg.cuda) {
      at::accelerator::synchronizeDevice(index);
      m.peak_bytes = at::accelerator::getDeviceStats(index).allocated_bytes[0].peak;
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    m.ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    m.ms_min = sorted.front();
    double sum = 0;
    for (double x : sorted) sum += x;
    m.ms_mean = sum / static_cast<double>(n);
    m.iters = static_cast<int>(n);
  } catch (const c10::OutOfMemoryError& e) {
    fail("oom", e.what_without_backtrace());
  } catch (const std::bad_alloc& e) {
    fail("oom", e.what());
  } catch (const c10::Error& e) {
    fail("n/a", e.what_without_backtrace());
  } catch (const std::exception& e) {
    fail("n/a", e.what());
  }
  if (cfg.cuda && m.status != "ok" && !device_alive()) {
    throw DeviceLost(impl.name + " (" + pass_name(pass) + ") broke the CUDA context: " + m.reason +
                     "; rerun without it (--impls)");
  }
  if (cfg.cuda) {
    // Whatever this implementation cached (or failed to get) is not the next one's problem.
    at::accelerator::synchronizeDevice(index);
    at::accelerator::emptyCache();
  }
  return m;
}

// ---- reporting -----------------------------------------------------------------------------

struct Row {
  int64_t seq_len;
  std::map<std::string, Measurement> by_impl;
};

double pass_flops(const BenchConfig& cfg, int64_t dim_head, int64_t n, Pass pass) {
  double f = 4.0 * static_cast<double>(cfg.batch) * static_cast<double>(cfg.heads) *
             static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(dim_head);
  if (cfg.causal) f *= 0.5;
  return f * pass_flop_factor(pass);
}

// Whether timing `impl` at length n can be skipped given its last result at a shorter length in
// this table: after an oom, or when its time per iteration (at least 5% of --budget), scaled by
// (n / n_last)^2 (linear for fastmax's factorised paths), would pass 10x --budget. status "ok"
// means: measure it.
Measurement predicted_skip(const BenchConfig& cfg, const std::string& impl, int64_t n,
                           const std::map<std::string, std::pair<int64_t, Measurement>>& last) {
  Measurement skip;
  const auto it = last.find(impl);
  if (it == last.end() || it->second.first >= n) return skip;
  const int64_t n_last = it->second.first;
  const Measurement& m = it->second.second;
  if (m.status == "oom") {
    skip.status = "oom";
    skip.reason = "not run: out of memory already at seq_len " + std::to_string(n_last);
    return skip;
  }
  // Short times are mostly fixed overhead, which does not grow with n: no extrapolation from them.
  if (m.ms * 1e-3 < 0.05 * cfg.budget_s) return skip;
  const bool linear = impl == "fastmax-cuda" || impl == "fastmax-chunked";
  const double ratio = static_cast<double>(n) / static_cast<double>(n_last);
  const double predicted_s = m.ms * 1e-3 * (linear ? ratio : ratio * ratio);
  if (predicted_s > 10.0 * cfg.budget_s) {
    skip.status = "skip";
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "not run: %.3g s per iteration predicted from seq_len %lld (over 10x --budget)",
                  predicted_s, static_cast<long long>(n_last));
    skip.reason = buf;
  }
  return skip;
}

std::string fmt_ms(const Measurement& m) {
  if (m.status != "ok") return m.status;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fms", m.ms);
  return buf;
}

std::string device_name(const BenchConfig& cfg) {
  if (cfg.cuda) {
#ifdef FLASHCOS_BENCH_DEVICE_PROPS
    const auto* props = at::cuda::getCurrentDeviceProperties();
    return std::string(props->name) + " (sm_" + std::to_string(props->major) +
           std::to_string(props->minor) + ")";
#else
    return "CUDA device";
#endif
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::string name = "CPU";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) name = trim(line.substr(colon + 1));
      break;
    }
  }
  return name + " (" + std::to_string(at::get_num_threads()) + " threads)";
}

std::string mib(int64_t bytes) {
  if (bytes < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

bool has_impl(const std::vector<Impl>& impls, const std::string& name) {
  return std::any_of(impls.begin(), impls.end(), [&](const Impl& i) { return i.name == name; });
}

// The seed table's kernel for one row: --kernel, or (auto) fused where it ran, else tiled. When
// auto falls back, `note` says so.
std::string row_kernel(const BenchConfig& cfg, const std::vector<Impl>& impls, const Row& row,
                       std::string* note) {
  note->clear();
  if (cfg.kernel != "auto") return cfg.kernel;
  std::vector<std::string> candidates;
  const bool fastmax_kind = cfg.attention == "fastmax";
  const auto auto_order = fastmax_kind ? std::vector<const char*>{"fastmax-cuda", "fastmax-chunked"}
                                       : std::vector<const char*>{"fused", "tiled"};
  for (const char* name : auto_order) {
    if (has_impl(impls, name)) candidates.push_back(name);
  }
  if (candidates.empty()) return "";
  for (const auto& name : candidates) {
    if (row.by_impl.at(name).status == "ok") {
      if (name != candidates.front()) {
        *note = " (" + name + "; " + candidates.front() + " " +
                row.by_impl.at(candidates.front()).status + ")";
      }
      return name;
    }
  }
  return candidates.front();
}

void print_seed_row(const BenchConfig& cfg, const std::vector<Impl>& impls, const Row& row) {
  std::string note;
  const std::string kernel = row_kernel(cfg, impls, row, &note);
  const auto find = [&](const std::string& name) -> const Measurement* {
    const auto it = row.by_impl.find(name);
    return it == row.by_impl.end() ? nullptr : &it->second;
  };
  const Measurement* k = kernel.empty() ? nullptr : find(kernel);
  const Measurement* b = find(cfg.baseline);
  std::string slower = "n/a";
  if (k && b && k->status == "ok" && b->status == "ok" && b->ms > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2fx", k->ms / b->ms);
    slower = buf;
  }
  std::printf("seq_len: %-7lld slower: %-7s kernel: %-10s baseline: %s%s\n",
              static_cast<long long>(row.seq_len), slower.c_str(), k ? fmt_ms(*k).c_str() : "-",
              b ? fmt_ms(*b).c_str() : "-", note.c_str());
  std::fflush(stdout);
}

void print_full_table(const BenchConfig& cfg, const std::vector<Impl>& impls,
                      const std::vector<Row>& rows, int64_t dim_head, Pass pass) {
  std::printf(
      "\n%s, every implementation (median of timed iterations; TFLOP/s = %.1f x "
      "4*B*H*N*N*D%s / time; peak = allocator peak during the pass, inputs included):\n",
      pass_title(pass), pass_flop_factor(pass), cfg.causal ? " / 2" : "");
  std::printf("  %8s  %-15s %10s %9s %10s %9s\n", "seq_len", "impl", "ms", "TFLOP/s", "peak MiB",
              ("vs " + cfg.baseline).c_str());
  std::map<std::string, std::string> reasons;  // "impl: reason" -> first seq_len it appeared at
  for (const auto& row : rows) {
    const auto base_it = row.by_impl.find(cfg.baseline);
    for (const auto& impl : impls) {
      const Measurement& m = row.by_impl.at(impl.name);
      if (m.status != "ok") {
        std::printf("  %8lld  %-15s %10s %9s %10s %9s\n", static_cast<long long>(row.seq_len),
                    impl.name.c_str(), m.status.c_str(), "-", "-", "-");
        reasons.emplace(impl.name + ": " + m.status + ": " + m.reason, std::to_string(row.seq_len));
        continue;
      }
      const double tflops = pass_flops(cfg, dim_head, row.seq_len, pass) / (m.ms * 1e-3) / 1e12;
      std::string vs = "-";
      if (base_it != row.by_impl.end() && base_it->second.status == "ok" &&
          base_it->second.ms > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2fx", m.ms / base_it->second.ms);
        vs = buf;
      }
      char rate[32];  // GPU rates read best with one decimal, CPU ones need significant digits
      std::snprintf(rate, sizeof rate, tflops >= 10 ? "%.1f" : "%.3g", tflops);
      std::printf("  %8lld  %-15s %10.3f %9s %10s %9s\n", static_cast<long long>(row.seq_len),
                  impl.name.c_str(), m.ms, rate, mib(m.peak_bytes).c_str(), vs.c_str());
    }
  }
  for (const auto& [reason, seq] : reasons) {
    std::printf("  note (from seq_len %s) %s\n", seq.c_str(), reason.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json record(const BenchConfig& cfg, const std::string& impl, const DtypeSpec& dtype,
                      int64_t dim_head, int64_t n, Pass pass, const Measurement& m) {
  nlohmann::json r;
  r["impl"] = impl;
  r["pass"] = pass_name(pass);
  r["attention"] = cfg.attention;
  r["dtype"] = dtype.name;
  r["batch"] = cfg.batch;
  r["heads"] = cfg.heads;
  r["dim_head"] = dim_head;
  r["seq_len"] = n;
  r["causal"] = cfg.causal;
  r["mask_prob"] = cfg.mask_prob;
  r["status"] = m.status;
  const double flops = pass_flops(cfg, dim_head, n, pass);
  r["flops"] = flops;
  if (m.status == "ok") {
    r["ms"] = m.ms;
    r["ms_min"] = m.ms_min;
    r["ms_mean"] = m.ms_mean;
    r["iters"] = m.iters;
    r["tflops"] = flops / (m.ms * 1e-3) / 1e12;
  } else {
    r["ms"] = nullptr;
    r["tflops"] = nullptr;
    r["reason"] = m.reason;
  }
  r["peak_bytes"] = m.peak_bytes >= 0 ? nlohmann::json(m.peak_bytes) : nlohmann::json(nullptr);
  r["base_bytes"] = m.base_bytes >= 0 ? nlohmann::json(m.base_bytes) : nlohmann::json(nullptr);
  return r;
}

void write_json(const std::string& path, const nlohmann::json& doc) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) {
      throw std::runtime_error("--json " + path + ": cannot write " + tmp +
                               " (does the directory exist and is it writable?)");
    }
    out << doc.dump(2) << "\n";
    if (!out) throw std::runtime_error("--json " + path + ": writing " + tmp + " failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("--json " + path + ": cannot rename " + tmp + " to it");
  }
}

int run(const BenchConfig& cfg) {
  const std::vector<Impl> impls = make_impls(cfg);
  if (impls.empty()) {
    std::fprintf(stderr, "error: no implementation left to time on this device (see --impls)\n");
    return 2;
  }
  bool need_sdpa_mask = false;
  for (const auto& impl : impls) {
    if (impl.name.rfind("sdpa-", 0) == 0 && impl.unavailable.empty()) need_sdpa_mask = true;
  }
  std::string impl_list;
  for (const auto& impl : impls) impl_list += (impl_list.empty() ? "" : ", ") + impl.name;

  const std::string device = device_name(cfg);
  std::printf("device: %s   libtorch %s   %s\n", device.c_str(), TORCH_VERSION, utc_now().c_str());
  std::printf("attention: %s   causal: %s   mask-prob: %g   scale: %g   l2norm: %s\n",
              cfg.attention.c_str(), cfg.causal ? "yes" : "no", cfg.mask_prob, cfg.scale,
              cfg.include_l2norm ? "timed" : "outside the timing");
  std::printf("implementations: %s   warmup: %d   iters: %d (median; fewer past %gs)   rounds: %d\n",
              impl_list.c_str(), cfg.warmup, cfg.iters, cfg.budget_s, cfg.rounds);
  if (cfg.attention == "fastmax") {
    std::printf(
        "fastmax: p %lld%s, temperature %g, chunk %lld; TFLOP/s counts the quadratic "
        "4*B*H*N*N*D for every implementation (an effective rate for fastmax)\n",
        static_cast<long long>(cfg.fastmax.p()),
        cfg.fastmax.normalize() ? strf(", normalize lim %g", cfg.fastmax.lim()).c_str() : "",
        cfg.fastmax.temperature(), static_cast<long long>(cfg.fastmax.chunk_size()));
  }
  std::printf("\n");
  std::fflush(stdout);

  nlohmann::json doc;
  doc["device"] = device;
  doc["device_type"] = cfg.cuda ? "cuda" : "cpu";
  doc["libtorch"] = TORCH_VERSION;
  doc["date"] = utc_now();
  doc["command"] = cfg.command_line;
  doc["flops_note"] =
      "fwd 4*B*H*N*N*D (halved for causal), bwd 2.5x, fwd+bwd 3.5x, for every "
      "implementation (fastmax included: an effective rate)";
  doc["config"] = {{"attention", cfg.attention},
                   {"causal", cfg.causal},
                   {"mask_prob", cfg.mask_prob},
                   {"scale", cfg.scale},
                   {"include_l2norm", cfg.include_l2norm},
                   {"batch", cfg.batch},
                   {"heads", cfg.heads},
                   {"dim_heads", cfg.dim_heads},
                   {"seq_lens", cfg.seq_lens},
                   {"warmup", cfg.warmup},
                   {"rounds", cfg.rounds},
                   {"iters", cfg.iters},
                   {"budget_s", cfg.budget_s},
                   {"seed", cfg.seed},
                   {"kernel", cfg.kernel},
                   {"baseline", cfg.baseline}};
  if (cfg.attention == "fastmax") {
    doc["config"]["fastmax"] = {{"p", cfg.fastmax.p()},
                                {"normalize", cfg.fastmax.normalize()},
                                {"lim", cfg.fastmax.lim()},
                                {"temperature", cfg.fastmax.temperature()},
                                {"chunk_size", cfg.fastmax.chunk_size()}};
  }
  std::vector<std::string> dtype_names, pass_names, impl_names;
  for (const auto& d : cfg.dtypes) dtype_names.push_back(d.name);
  for (const auto p : cfg.passes) pass_names.push_back(pass_name(p));
  for (const auto& impl : impls) impl_names.push_back(impl.name);
  doc["config"]["dtypes"] = dtype_names;
  doc["config"]["passes"] = pass_names;
  doc["config"]["impls"] = impl_names;
  doc["results"] = nlohmann::json::array();
  // Written once up front so that an unwritable path fails before minutes of timing.
  if (!cfg.json_path.empty()) write_json(cfg.json_path, doc);

  const std::string rule(72, '-');
  try {
    for (const auto& dtype : cfg.dtypes) {
      for (const int64_t dim_head : cfg.dim_heads) {
        for (const Pass pass : cfg.passes) {
          std::string kernel_name = cfg.kernel;
          if (cfg.kernel == "auto") {
            const bool fm = cfg.attention == "fastmax";
            const std::string first = fm ? "fastmax-cuda" : "fused";
            const std::string second = fm ? "fastmax-chunked" : "tiled";
            kernel_name = has_impl(impls, first) ? first + ", else " + second : second;
          }
          char mask_note[48] = "";
          if (cfg.mask_prob > 0)
            std::snprintf(mask_note, sizeof mask_note, ", mask-prob %g", cfg.mask_prob);
          std::printf(
              "%s\n%-12sbatch: %-5lld heads: %-5lld dim %-5lld %s%s%s   kernel: %s   "
              "baseline: %s\n%s\n",
              rule.c_str(), dtype.long_name.c_str(), static_cast<long long>(cfg.batch),
              static_cast<long long>(cfg.heads), static_cast<long long>(dim_head), pass_title(pass),
              cfg.causal ? ", causal" : "", mask_note, kernel_name.c_str(), cfg.baseline.c_str(),
              rule.c_str());
          std::fflush(stdout);
          std::vector<Row> rows;
          // Per implementation, its last result in this table: a length after an oom is not tried,
          // nor one whose predicted time per iteration passes 10x --budget.
          std::map<std::string, std::pair<int64_t, Measurement>> last;
          for (const int64_t n : cfg.seq_lens) {
            Row row{n, {}};
            Inputs in;
            Measurement input_failure;
            try {
              in = make_inputs(cfg, dtype, dim_head, n, need_sdpa_mask);
            } catch (const c10::OutOfMemoryError& e) {
              input_failure.status = "oom";
              input_failure.reason = "the inputs alone: " + first_line(e.what_without_backtrace());
            }
            // Round r times the implementations in list order (reversed when r is odd); each
            // keeps its fastest round. A failure or a skip is final.
            std::map<std::string, Measurement> skips;
            for (const auto& impl : impls) skips[impl.name] = predicted_skip(cfg, impl.name, n, last);
            for (int round = 0; round < cfg.rounds; ++round) {
              for (size_t k = 0; k < impls.size(); ++k) {
                const auto& impl = impls[round % 2 == 1 ? impls.size() - 1 - k : k];
                const auto done = row.by_impl.find(impl.name);
                if (done != row.by_impl.end() && done->second.status != "ok") continue;
                Measurement m;
                if (input_failure.status != "ok") {
                  m = input_failure;
                } else if (skips[impl.name].status != "ok") {
                  m = skips[impl.name];
                } else {
                  m = measure(cfg, impl, pass, in);
                }
                if (done == row.by_impl.end() || m.status != "ok" || m.ms < done->second.ms) {
                  row.by_impl[impl.name] = m;
                }
              }
            }
            for (const auto& impl : impls) {
              const Measurement& m = row.by_impl[impl.name];
              if (input_failure.status == "ok" && skips[impl.name].status == "ok" &&
                  (m.status == "ok" || m.status == "oom"))
                last[impl.name] = {n, m};
              doc["results"].push_back(record(cfg, impl.name, dtype, dim_head, n, pass, m));
            }
            in = Inputs{};
            if (cfg.cuda) at::accelerator::emptyCache();
            print_seed_row(cfg, impls, row);
            rows.push_back(std::move(row));
          }
          print_full_table(cfg, impls, rows, dim_head, pass);
          // Rewritten after every table, so a long run that dies later keeps what it measured.
          if (!cfg.json_path.empty()) write_json(cfg.json_path, doc);
        }
      }
    }
  } catch (const DeviceLost& e) {
    if (!cfg.json_path.empty()) {
      doc["error"] = e.what();
      write_json(cfg.json_path, doc);
    }
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (!cfg.json_path.empty()) std::printf("wrote %s\n", cfg.json_path.c_str());
  return 0;
}

}  // namespace

int run_bench(int argc, char** argv) {
  std::string command_line = "./train";
  for (int i = 0; i < argc; ++i) command_line += std::string(" ") + argv[i];
  auto options = make_options();
  BenchConfig cfg;
  try {
    const auto result = options.parse(argc, argv);
    if (result.count("help")) {
      std::printf("%s\n", options.help({"shape", "attention", "what to time"}).c_str());
      return 0;
    }
    cfg = parse_config(result, command_line);
  } catch (const cxxopts::exceptions::exception& e) {
    std::fprintf(stderr, "error: %s (see ./train bench --help)\n", e.what());
    return 2;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  try {
    return run(cfg);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}

}  // namespace flashcos::app
