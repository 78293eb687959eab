// ./train bench --clocks: NVML sampling (see gpu_clocks.h).
#include "app/bench/gpu_clocks.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>

namespace flashcos::app::bench {
namespace {

// The few NVML entry points used, as the driver exports them (nvml.h: nvmlReturn_t is an enum with
// NVML_SUCCESS 0, nvmlDevice_t an opaque pointer, NVML_CLOCK_SM 1, power in milliwatts, the clock
// event reasons a bit mask with the software power cap at 0x4).
using NvmlDevice = void*;
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;
constexpr unsigned long long kSwPowerCap = 0x4ULL;

// nvml.h's nvmlFieldValue_t, for nvmlDeviceGetFieldValues: the board's instantaneous power
// (NVML_FI_DEV_POWER_INSTANT, 186, milliwatts). nvmlDeviceGetPowerUsage averages over the last
// second on recent GPUs, longer than most rows' timed iterations.
constexpr unsigned kFieldPowerInstant = 186;
struct NvmlFieldValue {
  uint32_t field_id = 0;
  uint32_t scope_id = 0;
  int64_t timestamp_us = 0;
  int64_t latency_us = 0;
  int value_type = 0;  // nvmlValueType_t: 0 double, 1 unsigned int, 2 unsigned long, 3 unsigned long
                       // long, 4 signed long long, 5 signed int, 6 unsigned short
  int nvml_return = 0;
  union {
    double d;
    unsigned int ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
    int si;
    unsigned short us;
  } value{};
};
static_assert(sizeof(NvmlFieldValue) == 40, "nvmlFieldValue_t is 40 bytes");

struct Nvml {
  int (*init)() = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  int (*clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  int (*power_usage)(NvmlDevice, unsigned*) = nullptr;
  int (*event_reasons)(NvmlDevice, unsigned long long*) = nullptr;
  int (*field_values)(NvmlDevice, int, NvmlFieldValue*) = nullptr;  // optional: the instantaneous power
  std::string failure;  // why NVML cannot be used, or empty

  std::string error(const char* call, int rc) const {
    return std::string("--clocks: NVML's ") + call + " failed: " + (error_string ? error_string(rc) : std::to_string(rc));
  }
};

// Loaded and initialised once per process (NVML is then left initialised until exit).
const Nvml& nvml() {
  static const Nvml loaded = [] {
    Nvml n;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      n.failure = std::string("--clocks: cannot load libnvidia-ml.so.1, the NVIDIA driver's management library (") +
                  (why ? why : "no reason given") + ")";
      return n;
    }
    const auto sym = [&](const char* name) { return dlsym(lib, name); };
    n.init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    n.error_string = reinterpret_cast<const char* (*)(int)>(sym("nvmlErrorString"));
    n.by_pci_bus_id = reinterpret_cast<int (*)(const char*, NvmlDevice*)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
    n.clock_info = reinterpret_cast<int (*)(NvmlDevice, int, unsigned*)>(sym("nvmlDeviceGetClockInfo"));
    n.power_usage = reinterpret_cast<int (*)(NvmlDevice, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
    void* reasons = sym("nvmlDeviceGetCurrentClocksEventReasons");
    if (reasons == nullptr) reasons = sym("nvmlDeviceGetCurrentClocksThrottleReasons");  // older drivers' name
    n.event_reasons = reinterpret_cast<int (*)(NvmlDevice, unsigned long long*)>(reasons);
    n.field_values = reinterpret_cast<int (*)(NvmlDevice, int, NvmlFieldValue*)>(sym("nvmlDeviceGetFieldValues"));
    if (!n.init || !n.by_pci_bus_id || !n.clock_info || !n.power_usage || !n.event_reasons) {
      n.failure = "--clocks: this libnvidia-ml.so.1 lacks an entry point the bench needs (nvmlInit_v2, "
                  "nvmlDeviceGetHandleByPciBusId_v2, nvmlDeviceGetClockInfo, nvmlDeviceGetPowerUsage, "
                  "nvmlDeviceGetCurrentClocksEventReasons)";
      return n;
    }
    const int rc = n.init();
    if (rc != kNvmlSuccess) n.failure = n.error("nvmlInit_v2", rc);
    return n;
  }();
  return loaded;
}

// The board's instantaneous power in milliwatts, where this driver and GPU give it.
bool instant_power_mw(const Nvml& n, NvmlDevice device, double* mw) {
  if (n.field_values == nullptr) return false;
  NvmlFieldValue f;
  f.field_id = kFieldPowerInstant;
  if (n.field_values(device, 1, &f) != kNvmlSuccess || f.nvml_return != kNvmlSuccess) return false;
  switch (f.value_type) {
    case 0: *mw = f.value.d; break;
    case 1: *mw = f.value.ui; break;
    case 2: *mw = static_cast<double>(f.value.ul); break;
    case 3: *mw = static_cast<double>(f.value.ull); break;
    case 4: *mw = static_cast<double>(f.value.sll); break;
    case 5: *mw = f.value.si; break;
    case 6: *mw = f.value.us; break;
    default: return false;
  }
  return true;
}

// The power in milliwatts: the instantaneous reading, or nvmlDeviceGetPowerUsage's average.
bool power_mw(const Nvml& n, NvmlDevice device, bool instant, double* mw) {
  if (instant) return instant_power_mw(n, device, mw);
  unsigned average = 0;
  if (n.power_usage(device, &average) != kNvmlSuccess) return false;
  *mw = average;
  return true;
}

}  // namespace

ClockStats summarize_clocks(const std::vector<ClockSample>& samples) {
  ClockStats s;
  for (const auto& x : samples) {
    ++s.samples;
    s.sm_mhz += x.sm_mhz;
    s.watts += x.watts;
    s.capped_share += x.power_capped ? 1.0 : 0.0;
  }
  if (s.samples > 0) {
    s.sm_mhz /= s.samples;
    s.watts /= s.samples;
    s.capped_share /= s.samples;
  }
  return s;
}

ClockSampler::ClockSampler(const std::string& pci_bus_id, int period_ms) : period_ms_(period_ms) {
  const Nvml& n = nvml();
  if (!n.failure.empty()) throw std::runtime_error(n.failure);
  NvmlDevice device = nullptr;
  const int rc = n.by_pci_bus_id(pci_bus_id.c_str(), &device);
  if (rc != kNvmlSuccess) {
    throw std::runtime_error(n.error("nvmlDeviceGetHandleByPciBusId_v2", rc) + " for the CUDA device at " + pci_bus_id);
  }
  device_ = device;
  double mw = 0;
  instant_power_ = instant_power_mw(n, device_, &mw);
}

ClockSampler::~ClockSampler() {
  if (running_) stop();
}

void ClockSampler::start() {
  if (running_) stop();
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    samples_.clear();
  }
  running_ = true;
  thread_ = std::thread([this] {
    const Nvml& n = nvml();
    auto next = std::chrono::steady_clock::now();
    while (running_) {
      unsigned mhz = 0;
      double mw = 0;
      unsigned long long reasons = 0;
      // A sample that NVML cannot give whole (a busy driver, a value not supported) is left out.
      if (power_mw(n, device_, instant_power_, &mw) && n.clock_info(device_, kNvmlClockSm, &mhz) == kNvmlSuccess &&
          n.event_reasons(device_, &reasons) == kNvmlSuccess) {
        const std::lock_guard<std::mutex> lock(mutex_);
        samples_.push_back({static_cast<double>(mhz), mw / 1000.0, (reasons & kSwPowerCap) != 0});
      }
      next += std::chrono::milliseconds(period_ms_);
      std::this_thread::sleep_until(next);
    }
  });
}

ClockStats ClockSampler::stop() {
  running_ = false;
  if (thread_.joinable()) thread_.join();
  const std::lock_guard<std::mutex> lock(mutex_);
  return summarize_clocks(samples_);
}

}  // namespace flashcos::app::bench
