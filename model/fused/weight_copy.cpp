// WeightCopy (weight_copy.h).
#include "model/fused/weight_copy.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace flashcos::model::fused {

bool WeightCopy::stale(const std::vector<at::Tensor>& weights, at::ScalarType dtype) const {
  if (!copy_.defined() || copy_.scalar_type() != dtype || weights.size() != weights_.size()) return true;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!weights[i].is_same(weights_[i]) || weights[i]._version() != versions_[i]) return true;
  }
  return false;
}

const at::Tensor& WeightCopy::get(const std::vector<at::Tensor>& weights, at::ScalarType dtype) {
  TORCH_CHECK(!weights.empty(), "flashcos WeightCopy: no weights");
  for (const auto& w : weights) {
    TORCH_CHECK(w.defined() && w.dim() == 2 && at::isFloatingType(w.scalar_type()) &&
                    w.size(1) == weights[0].size(1) && w.device() == weights[0].device(),
                "flashcos WeightCopy: weights must be 2-D floating tensors of one device and width, got ",
                w.defined() ? w.sizes() : at::IntArrayRef{});
  }
  if (!stale(weights, dtype)) return copy_;
  int64_t rows = 0;
  for (const auto& w : weights) rows += w.size(0);
  const bool reuse = copy_.defined() && copy_.scalar_type() == dtype && copy_.device() == weights[0].device() &&
                     copy_.size(0) == rows && copy_.size(1) == weights[0].size(1);
  if (!reuse) copy_ = at::empty({rows, weights[0].size(1)}, weights[0].options().dtype(dtype));
  weights_ = weights;
  refresh();
  return copy_;
}

void WeightCopy::refresh() {
  if (!copy_.defined()) return;
  at::NoGradGuard no_grad;
  int64_t row = 0;
  versions_.clear();
  for (const auto& w : weights_) {
    copy_.narrow(0, row, w.size(0)).copy_(w);
    row += w.size(0);
    versions_.push_back(w._version());
  }
}

}  // namespace flashcos::model::fused
