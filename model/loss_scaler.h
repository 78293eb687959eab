// Dynamic loss scaling for fp16 training. The loss is multiplied by `scale` before backward so
// small gradients survive fp16; afterwards every gradient is divided by `scale` (g <- g / scale)
// and checked. Any inf/NaN: the step must be skipped, scale <- max(1, scale / 2). Otherwise,
// after `growth_interval` clean steps in a row, scale <- 2 * scale.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace flashcos::model {

constexpr int64_t kLossScaleGrowthInterval = 2000;

// Unscales `grads` in place and updates `scale` / `good_steps` (one device -> host sync).
// Returns true when every gradient is finite, i.e. the optimiser step may be taken.
bool unscale_grads_and_update_scale(std::vector<at::Tensor>& grads, double& scale, int64_t& good_steps,
                                    int64_t growth_interval = kLossScaleGrowthInterval);

}  // namespace flashcos::model
