// Autoregressive sampling from a GPT: top-k ("filter_thres": keep the top (1 - thres) * vocab
// logits) and temperature, from a seeded generator so a seed reproduces the text.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

#include "model/gpt.h"

namespace flashcos::model {

struct SampleOptions {
  int64_t length = 512;
  double temperature = 1.0;
  double filter_thres = 0.9;
  uint64_t seed = 0;
  // Prefill the prime into a KV cache and decode one byte at a time against it (generate.cpp);
  // false: re-run the whole window per byte (the reference the cached path is tested against).
  bool use_cache = true;
  // With the cache, decode through the static-shape step (decode_step.h: ring-buffer caches, no
  // shape changes) where the model supports it, replayed from a CUDA graph on CUDA
  // (decode_graph.h). The environment can switch them off for comparisons:
  // FLASHCOS_DECODE_GRAPH=0 (static step, no graph), FLASHCOS_DECODE_STATIC=0 (neither).
  bool static_decode = true;
  bool cuda_graph = true;
  // How the prime fills the cache. kAuto: on CUDA a prime of at most kDecodePrimeMax bytes goes
  // through the static step one byte at a time from position 0 (no prefill: cuBLAS and the
  // prefill's kernels are never loaded, which is most of a short sample's start-up; the step costs
  // ~0.2 ms a byte on an H100), a longer one and any prime on the CPU are prefilled (one batched
  // forward). kPrefill / kDecode force one (kDecode only where the static step applies).
  enum class Prime { kAuto, kPrefill, kDecode };
  Prime prime = Prime::kAuto;
};

// What generate() did, for the caller's report.
struct GenerateInfo {
  std::string decode;  // "cuda graph", "static", "static (no graph)", "cached", "window"
  std::string prime;   // how the prime went in: "prefill", "decode step" (into the cache) or "window" (uncached)
  double prefill_s = 0;  // wall seconds until the prime's logits were on the host (prefill, decoder set-up)
  // After the prefill, where each byte's wall time went: queueing its decode step on the device
  // (host), waiting for its logits to reach the host (device time not hidden), and sampling (host).
  double enqueue_s = 0, wait_s = 0, sample_s = 0;
};

// The longest prime that kAuto decodes byte by byte on CUDA (SampleOptions::prime): 512 steps
// (~0.1 s on an H100) against a prefill that needs cuBLAS and its own kernels up (~0.2-0.4 s of
// start-up) and then costs ~10 ms.
constexpr int64_t kDecodePrimeMax = 512;

// Whether generate() decodes a prime of prime_len tokens (after cropping to max_seq_len) through
// the static step instead of prefilling it, for this model on this device.
bool prime_through_decode(const SampleOptions& opts, const ModelConfig& cfg, const at::Device& device,
                          int64_t prime_len);

// prime (1, n) int64 on the model's device -> (1, length) generated tokens (CPU, int64).
// The context is cropped to the model's max_seq_len (the last max_seq_len bytes are attended; with
// rope or no positions the KV cache slides, so length may exceed max_seq_len at O(max_seq_len)
// per byte). check_sample_options' errors come first. on_token (optional) sees each new byte. The decode step runs in the autocast dtype of
// the model's device type when autocast is on there (as the trainer's samples run), else in float32.
// std::invalid_argument naming the option unless temperature > 0 and 0 <= filter_thres < 1 (callers
// check before any work; generate checks again).
void check_sample_options(const SampleOptions& opts);

at::Tensor generate(GPT& model, const at::Tensor& prime, const SampleOptions& opts,
                    const std::function<void(int64_t)>& on_token = nullptr, GenerateInfo* info = nullptr);

}  // namespace flashcos::model
