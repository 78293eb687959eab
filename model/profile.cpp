#include "model/profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <vector>

#include "common/log.h"

namespace flashcos::model {
namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

namespace {

// "  [op]" for the op that launched most of a kernel name's calls, "  [op +2 more]" when others did too.
std::string launching_ops(const std::map<std::string, int64_t>& ops) {
  if (ops.empty()) return "";
  const auto top = std::max_element(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  if (ops.size() == 1) return "  [" + top->first + "]";
  return strf("  [%s +%zu more]", top->first.c_str(), ops.size() - 1);
}

// Sorted, disjoint union of intervals (empty ones dropped).
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& [s, e] : v) {
    if (e <= s) continue;
    if (!out.empty() && s <= out.back().second) {
      out.back().second = std::max(out.back().second, e);
    } else {
      out.emplace_back(s, e);
    }
  }
  return out;
}

bool is_communication(const std::string& kernel) { return kernel.rfind("nccl", 0) == 0; }

}  // namespace

uint64_t uncovered_ns(std::vector<Interval> a, std::vector<Interval> b) {
  const auto ua = merged(std::move(a)), ub = merged(std::move(b));
  uint64_t out = 0;
  size_t j = 0;
  for (const auto& [s, e] : ua) {
    uint64_t at = s;  // the part of [s, e) before `at` is accounted for
    while (j < ub.size() && ub[j].second <= at) ++j;
    for (size_t k = j; k < ub.size() && ub[k].first < e; ++k) {
      if (ub[k].first > at) out += ub[k].first - at;
      at = std::max(at, std::min(e, ub[k].second));
    }
    if (at < e) out += e - at;
  }
  return out;
}

void start_step_profile() {
  if (impl::profilerEnabled()) throw std::runtime_error("--profile-steps: a profiler is already running");
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  prof::prepareProfiler(config, {impl::ActivityType::CPU, impl::ActivityType::CUDA});
  prof::enableProfiler(config, {impl::ActivityType::CPU, impl::ActivityType::CUDA});
}

void abandon_step_profile() noexcept {
  try {
    if (impl::profilerEnabled()) (void)prof::disableProfiler();
  } catch (...) {
  }
}

std::string profile_report(const std::vector<KernelRecord>& kernels, int64_t steps, int top, const std::string& unit) {
  if (kernels.empty()) return "profile: no CUDA activity was recorded (CPU run, or no CUPTI in this libtorch)";
  struct Entry {
    uint64_t ns = 0;
    int64_t count = 0;
    std::vector<Interval> spans;         // this name's [start, end)
    std::map<std::string, int64_t> ops;  // launching op -> kernels it launched
  };
  std::map<std::string, Entry> by_name;
  uint64_t total_ns = 0, first_ns = UINT64_MAX, last_ns = 0;
  std::vector<Interval> comm, all;  // communication kernels' [start, end); everyone's
  for (const auto& k : kernels) {
    const uint64_t ns = k.end_ns > k.start_ns ? k.end_ns - k.start_ns : 0;
    if (is_communication(k.name)) comm.emplace_back(k.start_ns, k.end_ns);
    all.emplace_back(k.start_ns, k.end_ns);
    auto& entry = by_name[k.name];
    entry.ns += ns;
    entry.count += 1;
    entry.spans.emplace_back(k.start_ns, k.end_ns);
    if (!k.op.empty()) entry.ops[k.op] += 1;
    total_ns += ns;
    first_ns = std::min(first_ns, k.start_ns);
    last_ns = std::max(last_ns, k.end_ns);
  }
  std::vector<std::pair<std::string, Entry>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  const double per_step = 1e6 * static_cast<double>(std::max<int64_t>(steps, 1));  // ns -> ms per step
  const char* u = unit.c_str();
  uint64_t covered_ns = 0;
  for (const auto& [s, e] : merged(all)) covered_ns += e - s;
  const uint64_t span_ns = last_ns > first_ns ? last_ns - first_ns : 0;
  std::string out = strf("profile over %lld %ss: kernel time %.3f ms/%s (summed: overlapping kernels each count) "
                         "in a %.3f ms/%s span, no kernel running %.3f ms/%s (%zu kernel names)\n",
                         static_cast<long long>(steps), u, total_ns / per_step, u, span_ns / per_step, u,
                         (span_ns - std::min(span_ns, covered_ns)) / per_step, u, rows.size());
  // Everyone's intervals but those of one name.
  const auto others_than = [&](const Entry& entry) {
    std::vector<Interval> others;
    others.reserve(all.size() - entry.spans.size());
    for (const auto& [other, o] : rows) {
      if (&o != &entry) others.insert(others.end(), o.spans.begin(), o.spans.end());
    }
    return others;
  };
  if (!comm.empty()) {
    uint64_t comm_ns = 0;
    for (const auto& [s, e] : merged(comm)) comm_ns += e - s;
    std::vector<Interval> compute;
    for (const auto& k : kernels) {
      if (!is_communication(k.name)) compute.emplace_back(k.start_ns, k.end_ns);
    }
    out += strf("communication (nccl kernels): %.2f ms/%s, exposed (no other kernel running) %.2f ms/%s\n",
                comm_ns / per_step, u, uncovered_ns(comm, std::move(compute)) / per_step, u);
  }
  // alone: the time this name's kernels ran while no other name's did (a kernel that overlaps others,
  // say one launched early to wait for its inputs, costs the span only that much).
  out += strf("  %9s %6s %9s %8s  %s  [launching op]\n", ("ms/" + unit).c_str(), "%", "alone", "calls", "kernel");
  uint64_t rest_ns = 0;
  int64_t rest_count = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [name, entry] = rows[i];
    if (static_cast<int>(i) >= top) {
      rest_ns += entry.ns;
      rest_count += entry.count;
      continue;
    }
    const std::string shown = name.size() > 110 ? name.substr(0, 107) + "..." : name;
    out += strf("  %9.3f %6.2f %9.3f %8lld  %s%s\n", entry.ns / per_step,
                100.0 * entry.ns / std::max<uint64_t>(total_ns, 1),
                uncovered_ns(entry.spans, others_than(entry)) / per_step, static_cast<long long>(entry.count),
                shown.c_str(), launching_ops(entry.ops).c_str());
  }
  if (rest_count > 0) {
    out += strf("  %9.3f %6.2f %9s %8lld  (%zu other names)\n", rest_ns / per_step,
                100.0 * rest_ns / std::max<uint64_t>(total_ns, 1), "", static_cast<long long>(rest_count),
                rows.size() - static_cast<size_t>(top));
  }
  return out;
}

std::string stop_step_profile(int64_t steps, const std::string& trace_path, int top, const std::string& unit) {
  auto result = prof::disableProfiler();
  if (!trace_path.empty()) result->save(trace_path);
  // The op that launched a kernel: the CPU-side op event (aten::..., an autograd Function) whose
  // correlation id is the kernel's linked one; runtime-call events (cudaLaunchKernel, ...) skipped.
  std::map<uint64_t, std::string> op_by_correlation;
  for (const auto& e : result->events()) {
    if (e.deviceType() == c10::DeviceType::CUDA || e.correlationId() == 0) continue;
    const std::string name = e.name();
    if (name.rfind("cuda", 0) == 0) continue;
    op_by_correlation[e.correlationId()] = name;
  }
  std::vector<KernelRecord> kernels;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    const auto op = op_by_correlation.find(e.linkedCorrelationId());
    kernels.push_back({e.name(), e.startNs(), e.startNs() + e.durationNs(),
                       op != op_by_correlation.end() ? op->second : std::string()});
  }
  return profile_report(kernels, steps, top, unit);
}

}  // namespace flashcos::model
