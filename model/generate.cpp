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
  std::vector<int64_t> out;
  out.reserve(opts.length);
  for (int64_t t = 0; t < opts.length; ++t) {
    auto window = context.size(1) > max_len ? context.slice(1, context.size(1) - max_len) : context;
    auto logits = model->forward(window).select(1, window.size(1) - 1).to(at::kFloat).cpu();  // (1, vocab)
    auto top = logits.topk(top_k, -1);
    auto probs = (std::get<0>(top) / opts.temperature).softmax(-1);
    auto pick = at::multinomial(probs, 1, /*replacement=*/false, gen);
    const int64_t token = std::get<1>(top).gather(-1, pick).item<int64_t>();
    out.push_back(token);
    if (on_token) on_token(token);
    context = at::cat({context, at::full({1, 1}, token, context.options())}, 1);
  }
  if (was_training) model->train();
  return at::tensor(out, at::kLong).view({1, -1});
}

}  // namespace flashcos::model
