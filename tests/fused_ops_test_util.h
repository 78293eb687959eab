// Shared pieces of the fused-operator tests (test_fused_ops.cpp on CPU, test_fused_ops_cuda.cpp on
// the GPU): the composite libtorch ops each fused operator replaces, run under autograd, and a
// float64 comparison helper, and whether the GPU cases can run.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <vector>

#include "model/fused/switch.h"

namespace flashcos::test {

// A CUDA device and a build with the fused operators' kernels: the GPU cases run, else they skip.
inline bool fused_kernels_on_gpu() {
  return torch::cuda::is_available() && flashcos::model::fused::kernels_compiled();
}

// A parameterised GPU case of a fused operator: skipped without fused_kernels_on_gpu(), and run with
// FLASHCOS_POISON=1, so that every output starts as NaN and whatever a kernel leaves unwritten shows.
template <typename Param>
class PoisonedGpuTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!fused_kernels_on_gpu()) GTEST_SKIP() << "needs a CUDA device and a build with the CUDA kernels";
    setenv("FLASHCOS_POISON", "1", 1);
  }
  void TearDown() override { unsetenv("FLASHCOS_POISON"); }
};

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  return (a.to(at::kDouble).cpu() - b.to(at::kDouble).cpu()).abs().max().item<double>();
}

inline double max_abs(const at::Tensor& a) { return a.numel() == 0 ? 0.0 : a.to(at::kDouble).abs().max().item<double>(); }

inline bool all_finite(const at::Tensor& t) { return t.numel() == 0 || t.isfinite().all().item<bool>(); }

// Leaf copies of the inputs (requires_grad) so autograd gives each one's gradient.
inline std::vector<at::Tensor> leaves(std::vector<at::Tensor> ts, at::ScalarType dtype = at::ScalarType::Undefined) {
  for (auto& t : ts) {
    if (!t.defined()) continue;
    t = (dtype == at::ScalarType::Undefined ? t.detach().clone() : t.detach().to(dtype)).requires_grad_(true);
  }
  return ts;
}

// The composite add + LayerNorm of the model: s = x + r; y = layer_norm(s in float32 (float64 for
// double), gamma, beta).to(out_dtype). r may be undefined. With r_bias (the bias of the GEMM that
// made r), r + r_bias is taken in r's dtype first, as libtorch's linear with its bias would give r.
inline std::pair<at::Tensor, at::Tensor> composite_add_layer_norm(const at::Tensor& x, const at::Tensor& r,
                                                                  const at::Tensor& gamma, const at::Tensor& beta,
                                                                  double eps, at::ScalarType out_dtype,
                                                                  const at::Tensor& r_bias = at::Tensor()) {
  const at::Tensor rb = r_bias.defined() ? r + r_bias.to(r.scalar_type()) : r;
  at::Tensor s = r.defined() ? x + rb : x;
  const auto ct = s.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor y = at::layer_norm(s.to(ct), {s.size(-1)}, gamma.to(ct), beta.to(ct), eps).to(out_dtype);
  return {s, y};
}

// The composite bias + GELU of the model: gelu(linear's output with its bias) in dt, i.e. the bias
// cast to dt and added in dt, then at::gelu (approximate 'none') in dt.
inline at::Tensor composite_bias_gelu(const at::Tensor& y, const at::Tensor& b, at::ScalarType dt) {
  return at::gelu(y.to(dt) + b.to(dt));
}

// The composite classifier + cross entropy: F::cross_entropy(linear(h, W, b).to(float), target).
inline at::Tensor composite_classifier_ce(const at::Tensor& h, const at::Tensor& w, const at::Tensor& b,
                                          const at::Tensor& target, at::ScalarType dt) {
  at::Tensor logits = at::linear(h.to(dt), w.to(dt), b.defined() ? b.to(dt) : at::Tensor());
  const auto lt = dt == at::kDouble ? at::kDouble : at::kFloat;
  return at::cross_entropy_loss(logits.reshape({-1, w.size(0)}).to(lt), target.reshape({-1}));
}

}  // namespace flashcos::test
