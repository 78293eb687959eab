// Autoregressive sampling from a GPT: top-k ("filter_thres": keep the top (1 - thres) * vocab
// logits) and temperature, from a seeded generator so a seed reproduces the text.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "model/gpt.h"

namespace flashcos::model {

struct SampleOptions {
  int64_t length = 512;
  double temperature = 1.0;
  double filter_thres = 0.9;
  uint64_t seed = 0;
};

// prime (1, n) int64 on the model's device -> (1, length) generated tokens (CPU, int64).
// The context is cropped to the model's max_seq_len. on_token (optional) sees each new byte.
at::Tensor generate(GPT& model, const at::Tensor& prime, const SampleOptions& opts,
                    const std::function<void(int64_t)>& on_token = nullptr);

}  // namespace flashcos::model
