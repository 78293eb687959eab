// ./train bench: parsing and checking the command line into a BenchConfig (see options.h).
#include "app/bench/options.h"

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>

namespace flashcos::app::bench {

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

const std::vector<std::string>& all_impl_names() {
  static const std::vector<std::string> names = {
      "plain",          "tiled",     "fused",        "sdpa-flash",      "sdpa-cudnn",
      "sdpa-efficient", "sdpa-math", "fastmax-cuda", "fastmax-chunked", "fastmax-ref"};
  return names;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

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
namespace {

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

int64_t parse_int(const std::string& option, const std::string& text, int64_t min_value,
                  int64_t max_value = std::numeric_limits<int64_t>::max()) {
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
  if (value > max_value) {
    throw UsageError("--" + option + " " + text + ": expected an integer <= " + std::to_string(max_value));
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

}  // namespace

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
      ("bias", "an additive float32 attention bias with its gradient: none | head ((H, N, N)) | batch ((B, N, N)); "
               "SDPA gets the same bias as attn_mask, without a gradient", text("none"))
      ("scale", "attention scale", text("10"))
      ("include-l2norm", "time the l2 normalisation of q and k too (default: outside the timing)")
      ("deterministic", "our fused backward in its deterministic mode (bit-identical gradients; dq summed independently of the order of its parts)")
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
      ("warmup", "warm-up iterations (0: none)", text("5"))
      ("warmup-s", "on CUDA the warm-up also keeps the GPU busy for at least this many seconds after its "
                   "first iteration (at most half of --budget), so that the GPU's clocks settle under its "
                   "power limit before the timing; 0: --warmup iterations only", text("1"))
      ("iters", "timed iterations (the median is reported)", text("30"))
      ("rounds", "time every implementation this many times per configuration, taking turns (the "
                 "order reversed every other round), and report each one's fastest round: evens "
                 "out clock and temperature drift between implementations (the table's spread: the "
                 "slowest round over the fastest; the JSON's round_ms: every round)", text("1"))
      ("budget", "seconds per implementation x pass x length; fewer iterations (at least 3) when "
                 "one is slow", text("2"))
      ("profile", "after timing each implementation (its first round), run this many more iterations "
                  "under libtorch's profiler and print, below each table, the GPU kernels they ran: ms "
                  "per iteration by kernel and alone (while no other kernel ran), the kernels' summed "
                  "time, the span and the time in it when no kernel ran; CUDA only, the timings unaffected; "
                  "0: none", text("0"))
      ("clocks", "sample the GPU's SM clock, board power and power cap (NVML, every 10 ms) while each "
                 "implementation's timed iterations run, and print them in its row (MHz, W, the share of "
                 "samples capped) and the JSON (each round's too); a note names the rows whose kept "
                 "rounds ran some below the power cap and some at it: at the power limit the clock sets "
                 "part of every figure; CUDA only, needs the driver's libnvidia-ml.so.1")
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
  cfg.bias = r["bias"].as<std::string>();
  if (cfg.bias != "none" && cfg.bias != "head" && cfg.bias != "batch") {
    throw UsageError("--bias " + cfg.bias + ": expected none, head or batch");
  }
  cfg.deterministic = r["deterministic"].as<bool>();

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

  // Counts of timed work: bounded, so that they fit an int (and the timings' buffers) with room.
  constexpr int64_t kMaxCount = 1'000'000;
  cfg.warmup = static_cast<int>(parse_int("warmup", r["warmup"].as<std::string>(), 0, kMaxCount));
  cfg.rounds = static_cast<int>(parse_int("rounds", r["rounds"].as<std::string>(), 1, kMaxCount));
  cfg.iters = static_cast<int>(parse_int("iters", r["iters"].as<std::string>(), 1, kMaxCount));
  cfg.profile = static_cast<int>(parse_int("profile", r["profile"].as<std::string>(), 0, 1000));
  cfg.clocks = r["clocks"].as<bool>();
  if (cfg.clocks && !cfg.cuda) {
    throw UsageError("--clocks: it samples a GPU's clock, and this run is on the CPU (--device cpu, or no GPU here)");
  }
  if (cfg.profile > 0 && !cfg.cuda) {
    throw UsageError("--profile: it reports CUDA kernels, and this run is on the CPU (--device cpu, or no GPU here)");
  }
  cfg.budget_s = parse_double("budget", r["budget"].as<std::string>());
  if (cfg.budget_s <= 0) throw UsageError("--budget: expected a positive number of seconds");
  cfg.warmup_s = parse_double("warmup-s", r["warmup-s"].as<std::string>());
  if (cfg.warmup_s < 0) throw UsageError("--warmup-s: expected 0 or a positive number of seconds");
  cfg.seed = static_cast<uint64_t>(parse_int("seed", r["seed"].as<std::string>(), 0));
  cfg.json_path = r["json"].as<std::string>();
  return cfg;
}

}  // namespace flashcos::app::bench
