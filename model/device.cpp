#include "model/device.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <stdexcept>

#include <unistd.h>

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace flashcos::model {

c10::Device resolve_device(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    if (!torch::cuda::is_available()) {
      throw std::invalid_argument("--device " + name + ": no CUDA GPU is visible (use --device cpu)");
    }
    return c10::Device(name);
  }
  throw std::invalid_argument("--device must be auto, cpu or cuda[:N], got '" + name + "'");
}

void warm_up(const c10::Device& device) {
  if (!device.is_cuda()) return;
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(device);
  const auto a = at::ones({64, 64}, opts);
  (void)at::mm(a, a);
  (void)at::linear(a.narrow(0, 0, 1), a);  // the one-row shape of a decode step
  synchronize(device);
}

std::string device_description(const c10::Device& device) {
#ifdef FLASHCOS_WITH_CUDA
  if (device.is_cuda()) {
    const auto* props = at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index());
    return std::string(props->name) + " (" + std::to_string(props->totalGlobalMem >> 30) + " GiB)";
  }
#endif
  return device.str();
}

int current_sm_count() {
#ifdef FLASHCOS_WITH_CUDA
  return at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
#else
  return 0;
#endif
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? 0 : device.index());
}

double peak_memory_gib(const c10::Device& device) {
#ifdef FLASHCOS_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1024.0 * 1024.0 * 1024.0);
  }
#endif
  return 0.0;
}

double total_memory_bytes(const c10::Device& device) {
#ifdef FLASHCOS_WITH_CUDA
  if (device.is_cuda()) {
    return static_cast<double>(at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->totalGlobalMem);
  }
#endif
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

void reset_peak_memory(const c10::Device& device) {
#ifdef FLASHCOS_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
#endif
}

std::string fused_attention_unavailable(const c10::Device& device) {
#ifdef FLASHCOS_WITH_CUDA
  if (device.is_cuda()) return "";
  return "the fused kernels need a CUDA GPU and the run is on " + device.str() +
         (torch::cuda::is_available() ? " (pass --device cuda)" : " (no CUDA GPU is visible on this machine)");
#else
  (void)device;
  return "this build has no CUDA kernels (it was configured without CUDA)";
#endif
}

}  // namespace flashcos::model
