// A float32 weight's copy in a GEMM dtype (bf16 / fp16), made once per optimiser step instead of
// once per micro-step (autocast casts every weight on every forward: 49 casts per micro-step on the
// default model). The copy of cat(weights, 0) lives in one tensor whose storage never moves, so a
// captured CUDA graph that reads it stays valid; it is re-copied in place
//   - by get(), when a weight's version counter moved since the copy was made (an optimiser step,
//     a checkpoint load, any in-place write), or the weights / dtype changed;
//   - by refresh(), unconditionally (the trainer after every optimiser step, outside any capture:
//     graph replays run no get()).
// Not thread-safe; one per projection of a module.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace flashcos::model::fused {

class WeightCopy {
 public:
  // cat(weights, 0) in dtype: weights 2-D float tensors of one device with equal widths.
  const at::Tensor& get(const std::vector<at::Tensor>& weights, at::ScalarType dtype);
  // Re-copy from the weights it was made of (nothing when none was made yet).
  void refresh();
  const at::Tensor& copy() const { return copy_; }

 private:
  bool stale(const std::vector<at::Tensor>& weights, at::ScalarType dtype) const;
  std::vector<at::Tensor> weights_;
  std::vector<uint32_t> versions_;
  at::Tensor copy_;
};

}  // namespace flashcos::model::fused
