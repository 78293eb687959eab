#include "model/loss_scaler.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace flashcos::model {

bool unscale_grads_and_update_scale(std::vector<at::Tensor>& grads, double& scale, int64_t& good_steps,
                                    int64_t growth_interval) {
  bool finite = true;
  if (!grads.empty()) {
    const auto opts = at::TensorOptions().device(grads.front().device()).dtype(at::kFloat);
    auto found_inf = at::zeros({1}, opts);
    auto inv_scale = at::full({1}, 1.0 / scale, opts);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    finite = found_inf.item<float>() == 0;
  }
  if (!finite) {
    scale = std::max(1.0, scale / 2);
    good_steps = 0;
  } else if (++good_steps >= growth_interval) {
    scale *= 2;
    good_steps = 0;
  }
  return finite;
}

}  // namespace flashcos::model
