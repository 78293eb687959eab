// On / off switches of the kernels in the environment (FLASHCOS_HOPPER, FLASHCOS_HOPPER_BWD_BIAS,
// FLASHCOS_HOPPER_DET_ROTATE, ...): for comparisons on the GPU machine; each caller reads its
// switch once per process.
#pragma once

#include <cstdlib>

namespace flashcos::cuda {

// On unless the variable is set and its value starts with '0'.
inline bool env_switch_on(const char* name) {
  const char* env = std::getenv(name);
  return env == nullptr || env[0] != '0';
}

}  // namespace flashcos::cuda
