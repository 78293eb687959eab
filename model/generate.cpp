// Sampling: prefill the prime once into a KV cache (GPT::forward_cached), then one byte at a time
// against the cached keys and values (O(context) work per byte). The uncached path re-runs the
// whole window (the last max_seq_len tokens) per byte; it serves models that cannot cache
// (fastmax) and learned-position models once the context passes max_seq_len (their positions
// shift with the window, so cached keys would be stale). With rope or no positions the cache
// slides instead (rotary logits depend on i - j only): up to max_seq_len bytes of context it is
// the uncached computation; past it each cached key keeps the hidden state it was computed with
// (its own max_seq_len context) where the re-run window would recompute it from a truncated one,
// so from the second block on the two differ (by design: O(max_seq_len) per byte, no re-run).
#include "model/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace flashcos::model {

at::Tensor generate(GPT& model, const at::Tensor& prime, const SampleOptions& opts,
                    const std::function<void(int64_t)>& on_token) {
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
  auto context = prime;
  auto window_of = [&](const at::Tensor& c) { return c.size(1) > max_len ? c.slice(1, c.size(1) - max_len) : c; };

  KVCache cache;
  const at::Tensor first = window_of(prime);
  bool cached = opts.use_cache && model->can_cache(0, first.size(1));
  at::Tensor last;  // (1, vocab) logits of the newest position
  if (cached) {
    last = model->forward_cached(first, cache).select(1, first.size(1) - 1);
  }
  std::vector<int64_t> out;
  out.reserve(opts.length);
  for (int64_t t = 0; t < opts.length; ++t) {
    if (!cached) {
      auto window = window_of(context);
      last = model->forward(window).select(1, window.size(1) - 1);
    }
    auto logits = last.to(at::kFloat).cpu();  // (1, vocab)
    auto top = logits.topk(top_k, -1);
    auto probs = (std::get<0>(top) / opts.temperature).softmax(-1);
    auto pick = at::multinomial(probs, 1, /*replacement=*/false, gen);
    const int64_t token = std::get<1>(top).gather(-1, pick).item<int64_t>();
    out.push_back(token);
    if (on_token) on_token(token);
    context = at::cat({context, at::full({1, 1}, token, context.options())}, 1);
    if (t + 1 == opts.length) break;
    if (cached && model->can_cache(cache.next_pos, 1)) {
      last = model->forward_cached(context.slice(1, context.size(1) - 1), cache).select(1, 0);
    } else if (cached) {
      cached = false;  // learned positions past max_seq_len: the windowed path from here on
      cache = KVCache();
    }
  }
  if (was_training) model->train();
  return at::tensor(out, at::kLong).view({1, -1});
}

}  // namespace flashcos::model
