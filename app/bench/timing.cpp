// ./train bench: timing and measuring (see timing.h).
#include "app/bench/timing.h"

#include "app/bench/warmup.h"
#include "model/profile.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <new>
#include <vector>

namespace flashcos::app::bench {
namespace {

// Collects warnings (SDPA explains there why it rejected a config) instead of printing them.
class WarningCollector : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};

// Runs body `warmup` times, then up to `iters` timed times; per-iteration ms. Slow configs get
// fewer iterations (at least 3) so that one measurement stays within about budget_s.
std::vector<double> time_iterations(const BenchConfig& cfg, const std::function<void()>& body,
                                    ClockSampler* clocks = nullptr, ClockStats* clock_stats = nullptr) {
  using clock = std::chrono::steady_clock;
  const auto sync = [&] {
    if (cfg.cuda) at::accelerator::synchronizeDevice(at::accelerator::getDeviceIndex());
  };
  sync();
  // The warm-up (warmup.h says its rules and why); its floor of loaded seconds on CUDA only.
  const WarmupResult warm = warm_up(cfg.warmup, cfg.cuda ? cfg.warmup_s : 0.0, cfg.budget_s, body, sync, [] {
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
  });
  const double per_iter = warm.per_iter_s;
  int iters = cfg.iters;
  if (per_iter > 0) {
    const int affordable = static_cast<int>(cfg.budget_s / per_iter);
    iters = std::max(std::min(iters, affordable), std::min(cfg.iters, 3));
  }

  std::vector<double> ms;
  ms.reserve(iters);
  if (cfg.cuda) {
    const auto index = at::accelerator::getDeviceIndex();
    const c10::Stream stream = at::accelerator::getCurrentStream(index);
    std::vector<c10::Event> starts, ends;
    starts.reserve(iters);
    ends.reserve(iters);
    for (int i = 0; i < iters; ++i) {
      starts.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      ends.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    }
    // The sampler runs from before the first iteration is queued until the last one has completed.
    if (clocks != nullptr) clocks->start();
    for (int i = 0; i < iters; ++i) {
      starts[i].record(stream);
      body();
      ends[i].record(stream);
    }
    ends.back().synchronize();
    if (clocks != nullptr) *clock_stats = clocks->stop();
    for (int i = 0; i < iters; ++i) ms.push_back(starts[i].elapsedTime(ends[i]));
  } else {
    for (int i = 0; i < iters; ++i) {
      const auto start = clock::now();
      body();
      ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - start).count());
    }
  }
  return ms;
}

// After a failed measurement on CUDA: does the device still work?
bool device_alive() {
  try {
    at::accelerator::synchronizeDevice(at::accelerator::getDeviceIndex());
    return at::ones({8}, at::TensorOptions().device(at::kCUDA)).sum().item<double>() == 8.0;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

Failure classify_failure(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) {
    return {"oom", static_cast<const c10::Error&>(e).what_without_backtrace()};
  }
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return {"oom", e.what()};
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    const std::string what = c10_error->what_without_backtrace();
    return {what.find("can't allocate memory") != std::string::npos ? "oom" : "n/a", what};
  }
  return {"n/a", e.what()};
}

namespace {

// cfg.profile iterations of body under libtorch's profiler (model/profile.h): its report, or why
// there is none (a profiler already running, a failure, which stops it). Not timed.
std::string profile_iterations(const BenchConfig& cfg, const std::function<void()>& body) {
  const auto index = at::accelerator::getDeviceIndex();
  at::accelerator::synchronizeDevice(index);
  try {
    model::start_step_profile();
  } catch (const std::exception& e) {
    return std::string("profile: none: ") + e.what();
  }
  try {
    for (int i = 0; i < cfg.profile; ++i) body();
    at::accelerator::synchronizeDevice(index);
    return model::stop_step_profile(cfg.profile, "", 12, "iteration");
  } catch (const std::exception& e) {
    model::abandon_step_profile();
    return std::string("profile: failed: ") + first_line(e.what());
  }
}

}  // namespace

Measurement measure(const BenchConfig& cfg, const Impl& impl, Pass pass, const Inputs& in, bool profile,
                    ClockSampler* clocks) {
  Measurement m;
  if (!impl.unavailable.empty()) {
    m.status = "n/a";
    m.reason = impl.unavailable;
    return m;
  }
  WarningCollector warnings;
  c10::WarningUtils::WarningHandlerGuard warning_guard(&warnings);
  const auto index = cfg.cuda ? at::accelerator::getDeviceIndex() : c10::DeviceIndex(0);
  const auto fail = [&](const std::string& status, const std::string& what) {
    m.status = status;
    m.reason = first_line(what);
    // SDPA's "No available kernel" is explained by the warnings it issued just before.
    for (const auto& w : warnings.messages) {
      if (m.reason.size() > 400) break;
      m.reason += "; " + first_line(w);
    }
  };
  try {
    if (cfg.cuda) {
      at::accelerator::synchronizeDevice(index);
      m.base_bytes = at::accelerator::getDeviceStats(index).allocated_bytes[0].current;
      at::accelerator::resetPeakStats(index);
    }
    std::vector<double> ms;
    {
      const std::vector<at::Tensor> inputs = {in.q, in.k, in.v};
      at::Tensor out;  // bwd: the graph every timed backward walks again (retain_graph)
      std::function<void()> body;
      switch (pass) {
        case Pass::kFwd: body = [&] { at::Tensor o = impl.fn(in); }; break;
        case Pass::kBwd:
          out = impl.fn(in);
          body = [&] { auto grads = torch::autograd::grad({out}, inputs, {in.dout}, true); };
          break;
        case Pass::kFwdBwd:
          body = [&] {
            at::Tensor o = impl.fn(in);
            auto grads = torch::autograd::grad({o}, inputs, {in.dout}, false);
          };
          break;
      }
      ms = time_iterations(cfg, body, clocks, &m.clocks);
      if (profile && cfg.profile > 0) m.profile = profile_iterations(cfg, body);
    }
    if (cfg.cuda) {
      at::accelerator::synchronizeDevice(index);
      m.peak_bytes = at::accelerator::getDeviceStats(index).allocated_bytes[0].peak;
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    m.ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    m.ms_min = sorted.front();
    double sum = 0;
    for (double x : sorted) sum += x;
    m.ms_mean = sum / static_cast<double>(n);
    m.iters = static_cast<int>(n);
  } catch (const std::exception& e) {
    const Failure f = classify_failure(e);
    fail(f.status, f.what);
  }
  if (cfg.cuda && m.status != "ok" && !device_alive()) {
    throw DeviceLost(impl.name + " (" + pass_name(pass) + ") broke the CUDA context: " + m.reason +
                     "; rerun without it (--impls)");
  }
  if (cfg.cuda) {
    // Whatever this implementation cached (or failed to get) is not the next one's problem.
    at::accelerator::synchronizeDevice(index);
    at::accelerator::emptyCache();
  }
  return m;
}

// Whether timing `impl` at length n can be skipped given its last result at a shorter length in
// this table: after an oom, or when its time per iteration (at least 5% of --budget), scaled by
// (n / n_last)^2 (linear for fastmax's factorised paths), would pass 10x --budget. status "ok"
// means: measure it.
Measurement predicted_skip(const BenchConfig& cfg, const std::string& impl, int64_t n,
                           const std::map<std::string, std::pair<int64_t, Measurement>>& last) {
  Measurement skip;
  const auto it = last.find(impl);
  if (it == last.end() || it->second.first >= n) return skip;
  const int64_t n_last = it->second.first;
  const Measurement& m = it->second.second;
  if (m.status == "oom") {
    skip.status = "oom";
    skip.reason = "not run: out of memory already at seq_len " + std::to_string(n_last);
    return skip;
  }
  // Short times are mostly fixed overhead, which does not grow with n: no extrapolation from them.
  if (m.ms * 1e-3 < 0.05 * cfg.budget_s) return skip;
  const bool linear = impl == "fastmax-cuda" || impl == "fastmax-chunked";
  const double ratio = static_cast<double>(n) / static_cast<double>(n_last);
  const double predicted_s = m.ms * 1e-3 * (linear ? ratio : ratio * ratio);
  if (predicted_s > 10.0 * cfg.budget_s) {
    skip.status = "skip";
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "not run: %.3g s per iteration predicted from seq_len %lld (over 10x --budget)",
                  predicted_s, static_cast<long long>(n_last));
    skip.reason = buf;
  }
  return skip;
}
}  // namespace flashcos::app::bench
