// sample / eval: which attention implementation runs a checkpoint on this machine. The weights
// are the same for every implementation, so a run trained with the fused CUDA kernels can be
// sampled or evaluated on a CPU through the tiled path.
#pragma once

#include <c10/core/Device.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "model/device.h"

namespace flashcos::app {

// `requested`: the --attention-impl option ("" when not given); `recorded`: the checkpoint's.
// Returns the implementation to build the model with. An explicit fused that cannot run is an
// error; a recorded one falls back to tiled with one info line on stderr.
inline std::string pick_attention_impl(const std::string& requested, const std::string& recorded,
                                       const c10::Device& device) {
  const std::string impl = requested.empty() ? recorded : requested;
  if (impl != "fused") return impl;
  const std::string why = model::fused_attention_unavailable(device);
  if (why.empty()) return impl;
  if (!requested.empty()) throw std::invalid_argument("--attention-impl fused: " + why);
  std::fprintf(stderr,
               "info: the checkpoint was trained with the fused CUDA kernels, which cannot run here (%s); "
               "using --attention-impl tiled (same weights)\n",
               why.c_str());
  return "tiled";
}

}  // namespace flashcos::app
