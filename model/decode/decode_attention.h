// The fused decode attention of the static decode step (model/decode/cuda/decode_attention.h) on
// libtorch tensors: everything between the qkv projection and the output projection of one block
// for cosine / exp attention (l2norm, rope, the ring write, attention over the filled slots).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "model/config.h"

namespace flashcos::model {

// Scratch of the split-KV launch, shared by the blocks of one decoder (their launches are ordered
// on one stream): partials (NH, splits, HS + 1) float32, counters (NH) int32 zeroed.
struct DecodeAttentionScratch {
  at::Tensor partials, counters;
  int64_t splits = 1;
};

// Whether the kernel applies to this model on this device in this build: CUDA, cosine / exp
// attention, a head size it takes, logits within float32's exp range; and FLASHCOS_DECODE_KERNEL is
// not "0" (the switch that compares against the torch-op step).
bool fused_decode_attention_available(const ModelConfig& cfg, const at::Device& device);
DecodeAttentionScratch make_decode_attention_scratch(const ModelConfig& cfg, const at::Device& device);

// qkv (1, 3 NH HS) in the caches' dtype; k, v the (1, NH, L, HS) rings; out (1, NH HS); pos (1)
// int64 on the device; inv_freq (HS / G / 2) float32 or undefined (no positions).
void fused_decode_attention(const ModelConfig& cfg, const at::Tensor& qkv, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& pos, const at::Tensor& inv_freq,
                            DecodeAttentionScratch& scratch);

}  // namespace flashcos::model
