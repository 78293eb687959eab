// On / off switches and counts of the kernels in the environment (FLASHCOS_HOPPER,
// FLASHCOS_HOPPER_BWD_BIAS, FLASHCOS_HOPPER_DET_ROTATE, FLASHCOS_HOPPER_DET_BAND, ...): for
// comparisons on the GPU machine; each caller reads its variables once per process.
#pragma once

#include <cstdlib>

namespace flashcos::cuda {

// On unless the variable is set and its value starts with '0'.
inline bool env_switch_on(const char* name) {
  const char* env = std::getenv(name);
  return env == nullptr || env[0] != '0';
}

// The variable's value as a count (atoi) where it is set and not negative, else `fallback`.
inline int env_count(const char* name, int fallback) {
  const char* env = std::getenv(name);
  const int n = env != nullptr ? std::atoi(env) : -1;
  return n >= 0 ? n : fallback;
}

}  // namespace flashcos::cuda
