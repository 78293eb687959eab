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
// replayed from a CUDA graph on CUDA (decode_graph.h); the others keep forward_cached.
#include "model/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "model/decode_graph.h"
#include "model/decode_step.h"

namespace flashcos::model {
namespace {

double seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

// The static step (CUDA graph on CUDA) over a prefilled cache, in the autocast dtype where autocast
// is on for the model's device type.
std::unique_ptr<StaticDecoder> make_decoder(GPT& model, const KVCache& cache, const at::Device& device, bool graph) {
  const auto type = device.type();
  const auto dtype = at::autocast::is_autocast_enabled(type) ? at::autocast::get_autocast_dtype(type) : at::kFloat;
  if (graph && device.is_cuda() && decode_graph_compiled()) return make_graph_decoder(model, cache, dtype);
  return std::make_unique<StaticDecoder>(model, cache, dtype);
}

}  // namespace

at::Tensor generate(GPT& model, const at::Tensor& prime, const SampleOptions& opts,
                    const std::function<void(int64_t)>& on_token, GenerateInfo* info) {
  if (prime.dim() != 2 || prime.size(0) != 1 || prime.size(1) < 1) {
    throw std::invalid_argument("generate: prime must be (1, n) with n >= 1 tokens");
  }
  if (!(opts.temperature > 0)) throw std::invalid_argument("--temperature must be > 0");
  if (!(opts.filter_thres >= 0 && opts.filter_thres < 1)) {
    throw std::invalid_argument("--filter-thres must be in [0, 1)");
  }
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const int64_t vocab = model->config().vocab;
  const int64_t max_len = model->config().max_seq_len;
  const int64_t top_k = std::max<int64_t>(1, static_cast<int64_t>(std::lround((1.0 - opts.filter_thres) * vocab)));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed);
  auto window_of = [&](const at::Tensor& c) { return c.size(1) > max_len ? c.slice(1, c.size(1) - max_len) : c; };

  const auto t_start = std::chrono::steady_clock::now();
  KVCache cache;
  const at::Tensor first = window_of(prime);
  bool cached = opts.use_cache && model->can_cache(0, first.size(1));
  at::Tensor last;  // (1, vocab) logits of the newest position
  if (cached) {
    last = model->forward_cached(first, cache).select(1, first.size(1) - 1);
  }
  std::unique_ptr<StaticDecoder> decoder;
  if (cached && opts.static_decode && !env_off("FLASHCOS_DECODE_STATIC") && StaticDecoder::supports(model->config())) {
    decoder = make_decoder(model, cache, prime.device(), opts.cuda_graph && !env_off("FLASHCOS_DECODE_GRAPH"));
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
    auto logits = last.to(at::kFloat).cpu();  // (1, vocab)
    const auto t_sample = std::chrono::steady_clock::now();
    if (t == 0 && info) info->prefill_s = seconds(t_start, t_sample);
    if (t > 0 && info) info->wait_s += seconds(t_wait, t_sample);
    auto top = logits.topk(top_k, -1);
    auto probs = (std::get<0>(top) / opts.temperature).softmax(-1);
    auto pick = at::multinomial(probs, 1, /*replacement=*/false, gen);
    const int64_t token = std::get<1>(top).gather(-1, pick).item<int64_t>();
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
