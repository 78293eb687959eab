// A device attribute of the current device, asked of the runtime once per (attribute, device) and
// kept: compute capability and multiprocessor count do not change while the process runs. For the
// launchers that read them on every launch (the Hopper family's choice, grid sizes and orders, PDL).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace flashcos::cuda {

// *value = attribute kAttr of the current device (devices with ids from 64 up are asked every time).
template <cudaDeviceAttr kAttr>
cudaError_t current_device_attribute(int* value) {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};  // value + 1; 0: not asked yet
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool cached = device >= 0 && device < kDevices;
  if (cached) {
    const int k = known[device].load(std::memory_order_relaxed);
    if (k > 0) {
      *value = k - 1;
      return cudaSuccess;
    }
  }
  err = cudaDeviceGetAttribute(value, kAttr, device);
  if (err == cudaSuccess && cached && *value >= 0) known[device].store(*value + 1, std::memory_order_relaxed);
  return err;
}

// The current device's multiprocessor count (launchers that size or order their grids by it).
inline cudaError_t current_device_sm_count(int* sms) {
  return current_device_attribute<cudaDevAttrMultiProcessorCount>(sms);
}

}  // namespace flashcos::cuda
