// ./train bench --clocks: the GPU's SM clock, board power and power-cap state, sampled through NVML
// while an implementation's timed iterations run. The kernels run at the board's power limit, where
// the clock, not the kernel alone, sets the time: two implementations at 1,560 and 1,690 MHz are not
// compared at the same speed of the chip (docs/performance.md section 1). NVML is the driver's
// libnvidia-ml.so.1, loaded at run time; nothing links against it.
#pragma once

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace flashcos::app::bench {

struct ClockSample {
  double sm_mhz = 0, watts = 0;
  bool power_capped = false;  // NVML's software power cap among the clock's active event reasons
};

// What a sampled stretch of time was: its sample count, the mean SM clock and power, the share of its
// samples with the power cap active (samples 0: nothing was sampled, the rest 0).
struct ClockStats {
  int samples = 0;
  double sm_mhz = 0, watts = 0, capped_share = 0;
};
ClockStats summarize_clocks(const std::vector<ClockSample>& samples);

// For one row of a table: whether the implementations' kept rounds ran at different power states,
// some below the power cap (fewer than half their samples capped) and some at it. Their ratio then
// compares the kernels at unequal clocks (2026-11-29: cuDNN's kept round below the cap in 11 of 48
// rows, ours never; docs/performance.md section 1). The note names both groups, "below the power cap
// in the round kept: sdpa-cudnn (0% of samples capped, 127 W, 1980 MHz); at it: fused (100%, 688 W,
// 1695 MHz)"; empty where they agree, or where fewer than two were sampled.
inline std::string power_cap_note(const std::vector<std::pair<std::string, ClockStats>>& kept) {
  std::string below, at;
  for (const auto& [name, c] : kept) {
    if (c.samples <= 0) continue;
    const bool capped = c.capped_share >= 0.5;
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s (%.0f%%%s, %.0f W, %.0f MHz)", name.c_str(), 100.0 * c.capped_share,
                  !capped && below.empty() ? " of samples capped" : "", c.watts, c.sm_mhz);
    std::string& group = capped ? at : below;
    group += (group.empty() ? "" : ", ") + std::string(buf);
  }
  if (below.empty() || at.empty()) return "";
  return "below the power cap in the round kept: " + below + "; at it: " + at;
}

// Samples one GPU every period_ms on a thread of its own between start() and stop().
class ClockSampler {
 public:
  // The GPU of this PCI bus id (report.h's cuda_pci_bus_id); throws std::runtime_error naming
  // what failed (no libnvidia-ml.so.1, NVML's init or the device lookup).
  explicit ClockSampler(const std::string& pci_bus_id, int period_ms = 10);
  ~ClockSampler();
  ClockSampler(const ClockSampler&) = delete;
  ClockSampler& operator=(const ClockSampler&) = delete;

  void start();       // clears the samples and starts sampling (at once, then every period)
  ClockStats stop();  // stops and summarises what was sampled since start()
  // Whether the power is the board's instantaneous reading (NVML_FI_DEV_POWER_INSTANT, where the
  // driver gives it), else nvmlDeviceGetPowerUsage's, a one-second average on recent GPUs.
  bool instant_power() const { return instant_power_; }

 private:
  void* device_ = nullptr;  // nvmlDevice_t
  int period_ms_;
  bool instant_power_ = false;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::vector<ClockSample> samples_;
};

}  // namespace flashcos::app::bench
