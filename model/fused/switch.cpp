#include "model/fused/switch.h"

#include <ATen/autocast_mode.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace flashcos::model::fused {
namespace {

std::atomic<int> g_fused_on_cpu{0};  // live FusedOpsOnCpuForTesting objects

}  // namespace

bool kernels_compiled() {
#ifdef FLASHCOS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool fused_ops_enabled(const at::Tensor& t) { return fused_op_enabled(t, nullptr); }

bool fused_op_enabled(const at::Tensor& t, const char* op) {
  if (!t.defined()) return false;
  const bool device_ok = t.is_cuda() ? kernels_compiled() : t.is_cpu() && g_fused_on_cpu.load() > 0;
  if (!device_ok) return false;
  const char* env = std::getenv("FLASHCOS_FUSED_OPS");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  if (op == nullptr) return true;  // fused_ops_enabled: the fused structure, whatever the list
  if (std::strcmp(op, "copies") == 0) {
    const char* copies = std::getenv("FLASHCOS_WEIGHT_COPIES");
    if (copies != nullptr && std::strcmp(copies, "0") == 0) return false;
  }
  if (env == nullptr || std::strcmp(env, "1") == 0) return true;
  // A comma-separated list: op must be one of its items, whole.
  const size_t n = std::strlen(op);
  for (const char* item = env;; ++item) {
    const char* end = std::strchr(item, ',');
    const size_t len = end != nullptr ? size_t(end - item) : std::strlen(item);
    if (len == n && std::strncmp(item, op, n) == 0) return true;
    if (end == nullptr) return false;
    item = end;
  }
}

at::ScalarType activation_dtype(const at::Tensor& t) {
  const auto device = t.device().type();
  if (at::autocast::is_autocast_enabled(device) && at::isFloatingType(t.scalar_type())) {
    return at::autocast::get_autocast_dtype(device);
  }
  return t.scalar_type();
}

FusedOpsOnCpuForTesting::FusedOpsOnCpuForTesting() { ++g_fused_on_cpu; }
FusedOpsOnCpuForTesting::~FusedOpsOnCpuForTesting() { --g_fused_on_cpu; }

}  // namespace flashcos::model::fused
