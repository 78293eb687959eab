// Sampling: prefill the prime once into a KV cache (GPT::forward_cached), then one byte at a time
// against the cached keys and values (O(context) work per byte). The uncached path re-runs the
// whole window (the last max_seq_len tokens) per byte; it serves models that cannot cache
// (fastmax) and learned-position models once the context passes max_seq_len (their positions
// shift with the window, so cached keys would be stale). With rope or no positions the cache
// slides instead (rotary logits depend on i - j only): up to max_seq_len bytes of context it is
// the uncached computation; past it each cached key keeps the hidden state it was computed with
// (its own max_seq_len context) where the re-run window would recompute it from a truncated one,
// so from the second block on the two differ (by design: O(max_seq_len) per byte, no re-run).
// After the prefill, rope / no-position models with cosine, exp or softmax attention decode through
// the static-shape step (decode_step.h, ring-buffer caches; the same logits up to summation order),
// replayed from a CUDA graph on CUDA (decode_graph.h); the others keep forward_cached. On CUDA a
// prime of at most kDecodePrimeMax bytes skips the prefill and goes through that step byte by byte
// from position 0 (prime_through_decode): the prefill is what brings cuBLAS and its own kernels
// into a short sample's start-up.
#include "model/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>
#include <stdexcept>

#include "common/log.h"
#include "model/decode_graph.h"
#include "model/decode_step.h"

namespace flashcos::model {
namespace {

double seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One byte from logits (vocab): keep the top_k largest (ties to the lower index), softmax of
// logit / temperature over them in double, then one uniform draw from `gen` walks the cumulative
// probabilities. Plain loops over a few hundred floats: a per-byte cost of microseconds, where the
// same steps as ATen ops cost tens of dispatches.
int64_t sample_top_k(const float* logits, int64_t vocab, int64_t top_k, double temperature, at::Generator& gen,
                     std::vector<int64_t>& order) {
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isfinite(logits[i])) {
      throw std::runtime_error("generate: the model's logits are not finite (NaN or inf): a diverged checkpoint?");
    }
    order[static_cast<size_t>(i)] = i;
  }
  const auto keep = order.begin() + std::min(top_k, vocab);
  std::partial_sort(order.begin(), keep, order.end(), [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double top = logits[order.front()];
  double total = 0;
  std::vector<double> weights;
  weights.reserve(static_cast<size_t>(keep - order.begin()));
  for (auto it = order.begin(); it != keep; ++it) {
    weights.push_back(std::exp((static_cast<double>(logits[*it]) - top) / temperature));
    total += weights.back();
  }
  double u;
  {
    auto* g = gen.get<at::CPUGeneratorImpl>();
    std::lock_guard<std::mutex> lock(gen.mutex());
    at::uniform_real_distribution<double> uniform(0.0, 1.0);
    u = uniform(g) * total;
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    u -= weights[i];
    if (u < 0) return order[i];
  }
  return order[weights.size() - 1];  // u within rounding of total
}

bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

// The static step (CUDA graph on CUDA) over a prefilled cache, in the autocast dtype where autocast
// is on for the model's device type.
// cache: the prefill's, or nullptr for empty rings (the prime decoded through the step).
std::unique_ptr<StaticDecoder> make_decoder(GPT& model, const KVCache* cache, const at::Device& device, bool graph) {
  const auto type = device.type();
  const auto dtype = at::autocast::is_autocast_enabled(type) ? at::autocast::get_autocast_dtype(type) : at::kFloat;
  if (graph && device.is_cuda() && decode_graph_compiled()) {
    return cache ? make_graph_decoder(model, *cache, dtype) : make_graph_decoder(model, dtype);
  }
  return cache ? std::make_unique<StaticDecoder>(model, *cache, dtype) : std::make_unique<StaticDecoder>(model, dtype);
}

bool static_step_on(const SampleOptions& opts, const ModelConfig& cfg) {
  return opts.use_cache && opts.static_decode && !env_off("FLASHCOS_DECODE_STATIC") && StaticDecoder::supports(cfg);
}

}  // namespace

bool prime_through_decode(const SampleOptions& opts, const ModelConfig& cfg, const at::Device& device,
                          int64_t prime_len) {
  if (!static_step_on(opts, cfg) || opts.prime == SampleOptions::Prime::kPrefill) return false;
  if (opts.prime == SampleOptions::Prime::kDecode) return true;
  return device.is_cuda() && std::min(prime_len, cfg.max_seq_len) <= kDecodePrimeMax;
}

void check_sample_options(const SampleOptions& opts) {
  if (!(opts.temperature > 0)) throw std::invalid_argument(strf("--temperature must be > 0, got %g", opts.temperature));
  if (!(opts.filter_thres >= 0 && opts.filter_thres < 1)) {
    throw std::invalid_argument(strf("--filter-thres must be in [0, 1), got %g", opts.filter_thres));
  }
}

at::Tensor generate(GPT& model, const at::Tensor& prime, const SampleOptions& opts,
                    const std::function<void(int64_t)>& on_token, GenerateInfo* info) {
  if (prime.dim() != 2 || prime.size(0) != 1 || prime.size(1) < 1) {
    throw std::invalid_argument("generate: prime must be (1, n) with n >= 1 tokens");
  }
  check_sample_options(opts);
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const int64_t vocab = model->config().vocab;
  const int64_t max_len = model->config().max_seq_len;
  const int64_t top_k = std::max<int64_t>(1, static_cast<int64_t>(std::lround((1.0 - opts.filter_thres) * vocab)));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed);
  // The newest logits land here (page-locked when they come from a GPU); sampling is plain loops.
  const auto host_logits = at::empty({vocab}, at::TensorOptions().dtype(at::kFloat).pinned_memory(prime.is_cuda()));
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  auto window_of = [&](const at::Tensor& c) { return c.size(1) > max_len ? c.slice(1, c.size(1) - max_len) : c; };

  const auto t_start = std::chrono::steady_clock::now();
  KVCache cache;
  const at::Tensor first = window_of(prime);
  bool cached = opts.use_cache && model->can_cache(0, first.size(1));
  at::Tensor last;  // (1, vocab) logits of the newest position
  std::unique_ptr<StaticDecoder> decoder;
  const bool graph = opts.cuda_graph && !env_off("FLASHCOS_DECODE_GRAPH");
  if (cached && prime_through_decode(opts, model->config(), prime.device(), first.size(1))) {
    // The prime byte by byte through the static step from position 0 (no prefill).
    decoder = make_decoder(model, nullptr, prime.device(), graph);
    const auto tokens = first.to(at::kCPU).contiguous();
    const int64_t* tok = tokens.data_ptr<int64_t>();
    for (int64_t i = 0; i < tokens.numel(); ++i) last = decoder->step(tok[i]);
    if (info) info->prime = "decode step";
  } else if (cached) {
    last = model->forward_cached(first, cache).select(1, first.size(1) - 1);
    if (info) info->prime = "prefill";
  } else if (info) {
    info->prime = "window";
  }
  if (cached && !decoder && static_step_on(opts, model->config())) {
    decoder = make_decoder(model, &cache, prime.device(), graph);
    cache = KVCache();  // the rings hold it now
  }
  std::vector<int64_t> out;
  out.reserve(opts.length);
  for (int64_t t = 0; t < opts.length; ++t) {
    if (!cached) {
      // prime ++ out so far, kept on the host while the cache serves (no per-byte device concat)
      auto context = at::cat({prime, at::tensor(out, at::kLong).view({1, -1}).to(prime.device())}, 1);
      auto window = window_of(context);
      last = model->forward(window).select(1, window.size(1) - 1);
    }
    const auto t_wait = std::chrono::steady_clock::now();
    host_logits.copy_(last.view({vocab}));  // waits for the step
    const auto t_sample = std::chrono::steady_clock::now();
    if (t == 0 && info) info->prefill_s = seconds(t_start, t_sample);
    if (t > 0 && info) info->wait_s += seconds(t_wait, t_sample);
    const int64_t token = sample_top_k(host_logits.data_ptr<float>(), vocab, top_k, opts.temperature, gen, order);
    const auto t_sampled = std::chrono::steady_clock::now();
    if (info) info->sample_s += seconds(t_sample, t_sampled);
    out.push_back(token);
    if (on_token) on_token(token);
    if (t + 1 == opts.length) break;
    const auto t_enqueue = std::chrono::steady_clock::now();
    if (decoder && model->can_cache(decoder->next_pos(), 1)) {
      last = decoder->step(token);
    } else if (decoder) {
      decoder.reset();  // past 2^24 positions: the windowed path from here on
      cached = false;
    } else if (cached && model->can_cache(cache.next_pos, 1)) {
      last = model->forward_cached(at::full({1, 1}, token, prime.options()), cache).select(1, 0);
    } else if (cached) {
      cached = false;  // learned positions past max_seq_len: the windowed path from here on
      cache = KVCache();
    }
    if (info) info->enqueue_s += seconds(t_enqueue, std::chrono::steady_clock::now());
  }
  if (info) info->decode = decoder ? decoder->name() : cached ? "cached" : "window";
  if (was_training) model->train();
  return at::tensor(out, at::kLong).view({1, -1});
}

}  // namespace flashcos::model
