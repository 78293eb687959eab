// ./train bench: the tables and the JSON (see report.h).
#include "app/bench/report.h"

#include <ATen/Parallel.h>

#if defined(FLASHCOS_WITH_CUDA) && __has_include(<ATen/cuda/CUDAContext.h>) && \
    __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAContext.h>
#define FLASHCOS_BENCH_DEVICE_PROPS 1
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace flashcos::app::bench {
namespace {

// --clocks' three columns where there is nothing to show.
constexpr const char* kNoClocks = "        -      -       -";

// A sampled stretch in the JSON: its sample count, and its clock, power and capped share (null where
// nothing was sampled).
nlohmann::json clock_json(const ClockStats& c) {
  const auto sampled = [&](double x) { return c.samples > 0 ? nlohmann::json(x) : nlohmann::json(nullptr); };
  return {{"clock_samples", c.samples},
          {"sm_mhz", sampled(c.sm_mhz)},
          {"watts", sampled(c.watts)},
          {"power_capped_share", sampled(c.capped_share)}};
}

std::string fmt_ms(const Measurement& m) {
  if (m.status != "ok") return m.status;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fms", m.ms);
  return buf;
}

std::string mib(int64_t bytes) {
  if (bytes < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// The seed table's kernel for one row: --kernel, or (auto) fused where it ran, else tiled. When
// auto falls back, `note` says so.
std::string row_kernel(const BenchConfig& cfg, const std::vector<Impl>& impls, const Row& row,
                       std::string* note) {
  note->clear();
  if (cfg.kernel != "auto") return cfg.kernel;
  std::vector<std::string> candidates;
  const bool fastmax_kind = cfg.attention == "fastmax";
  const auto auto_order = fastmax_kind ? std::vector<const char*>{"fastmax-cuda", "fastmax-chunked"}
                                       : std::vector<const char*>{"fused", "tiled"};
  for (const char* name : auto_order) {
    if (has_impl(impls, name)) candidates.push_back(name);
  }
  if (candidates.empty()) return "";
  for (const auto& name : candidates) {
    if (row.by_impl.at(name).status == "ok") {
      if (name != candidates.front()) {
        *note = " (" + name + "; " + candidates.front() + " " +
                row.by_impl.at(candidates.front()).status + ")";
      }
      return name;
    }
  }
  return candidates.front();
}

}  // namespace

double pass_flops(const BenchConfig& cfg, int64_t dim_head, int64_t n, Pass pass) {
  double f = 4.0 * static_cast<double>(cfg.batch) * static_cast<double>(cfg.heads) *
             static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(dim_head);
  if (cfg.causal) f *= 0.5;
  return f * pass_flop_factor(pass);
}

std::string device_name(const BenchConfig& cfg) {
  if (cfg.cuda) {
#ifdef FLASHCOS_BENCH_DEVICE_PROPS
    const auto* props = at::cuda::getCurrentDeviceProperties();
    return std::string(props->name) + " (sm_" + std::to_string(props->major) +
           std::to_string(props->minor) + ")";
#else
    return "CUDA device";
#endif
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::string name = "CPU";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) name = trim(line.substr(colon + 1));
      break;
    }
  }
  return name + " (" + std::to_string(at::get_num_threads()) + " threads)";
}

std::string cuda_pci_bus_id() {
#ifdef FLASHCOS_BENCH_DEVICE_PROPS
  const auto* props = at::cuda::getCurrentDeviceProperties();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08x:%02x:%02x.0", static_cast<unsigned>(props->pciDomainID),
                static_cast<unsigned>(props->pciBusID), static_cast<unsigned>(props->pciDeviceID));
  return buf;
#else
  throw std::runtime_error("--clocks: this build has no CUDA");
#endif
}

void print_seed_row(const BenchConfig& cfg, const std::vector<Impl>& impls, const Row& row) {
  std::string note;
  const std::string kernel = row_kernel(cfg, impls, row, &note);
  const auto find = [&](const std::string& name) -> const Measurement* {
    const auto it = row.by_impl.find(name);
    return it == row.by_impl.end() ? nullptr : &it->second;
  };
  const Measurement* k = kernel.empty() ? nullptr : find(kernel);
  const Measurement* b = find(cfg.baseline);
  std::string slower = "n/a";
  if (k && b && k->status == "ok" && b->status == "ok" && b->ms > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2fx", k->ms / b->ms);
    slower = buf;
  }
  std::printf("seq_len: %-7lld slower: %-7s kernel: %-10s baseline: %s%s\n",
              static_cast<long long>(row.seq_len), slower.c_str(), k ? fmt_ms(*k).c_str() : "-",
              b ? fmt_ms(*b).c_str() : "-", note.c_str());
  std::fflush(stdout);
}

void print_full_table(const BenchConfig& cfg, const std::vector<Impl>& impls,
                      const std::vector<Row>& rows, int64_t dim_head, Pass pass) {
  std::printf(
      "\n%s, every implementation (median of timed iterations; TFLOP/s = %.1f x "
      "4*B*H*N*N*D%s / time; peak = allocator peak during the pass, inputs included):\n",
      pass_title(pass), pass_flop_factor(pass), cfg.causal ? " / 2" : "");
  // With --rounds > 1, the spread: the slowest round's median over the fastest's, minus 1.
  const bool spread = cfg.rounds > 1;
  // With --clocks: the SM clock and power over the timed iterations (of the round kept), and the share
  // of their samples with the power cap active.
  std::printf("  %8s  %-15s %10s %9s %10s %9s%s%s\n", "seq_len", "impl", "ms", "TFLOP/s", "peak MiB",
              ("vs " + cfg.baseline).c_str(), spread ? "   spread" : "", cfg.clocks ? "   SM MHz      W  capped" : "");
  std::map<std::string, std::string> reasons;  // "impl: reason" -> first seq_len it appeared at
  std::vector<std::string> power_notes;         // --clocks: rows whose kept rounds ran at different power states
  for (const auto& row : rows) {
    if (cfg.clocks) {
      std::vector<std::pair<std::string, ClockStats>> kept;
      for (const auto& impl : impls) {
        const Measurement& m = row.by_impl.at(impl.name);
        if (m.status == "ok") kept.emplace_back(impl.name, m.clocks);
      }
      const std::string note = power_cap_note(kept);
      if (!note.empty()) power_notes.push_back("  note (seq_len " + std::to_string(row.seq_len) + ") " + note + "\n");
    }
    const auto base_it = row.by_impl.find(cfg.baseline);
    for (const auto& impl : impls) {
      const Measurement& m = row.by_impl.at(impl.name);
      if (m.status != "ok") {
        std::printf("  %8lld  %-15s %10s %9s %10s %9s%s%s\n", static_cast<long long>(row.seq_len),
                    impl.name.c_str(), m.status.c_str(), "-", "-", "-", spread ? "        -" : "",
                    cfg.clocks ? kNoClocks : "");
        reasons.emplace(impl.name + ": " + m.status + ": " + m.reason, std::to_string(row.seq_len));
        continue;
      }
      const double tflops = pass_flops(cfg, dim_head, row.seq_len, pass) / (m.ms * 1e-3) / 1e12;
      std::string vs = "-";
      if (base_it != row.by_impl.end() && base_it->second.status == "ok" &&
          base_it->second.ms > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2fx", m.ms / base_it->second.ms);
        vs = buf;
      }
      char rate[32];  // GPU rates read best with one decimal, CPU ones need significant digits
      std::snprintf(rate, sizeof rate, tflops >= 10 ? "%.1f" : "%.3g", tflops);
      std::string spread_text;
      if (spread) {
        char buf[32] = "        -";
        if (!m.round_ms.empty() && m.ms > 0) {
          const double slowest = *std::max_element(m.round_ms.begin(), m.round_ms.end());
          std::snprintf(buf, sizeof buf, " %7.1f%%", 100.0 * (slowest / m.ms - 1.0));
        }
        spread_text = buf;
      }
      std::string clock_text;
      if (cfg.clocks) {
        clock_text = kNoClocks;  // no sample (iterations shorter than the sampling period)
        if (m.clocks.samples > 0) {
          char buf[64];
          std::snprintf(buf, sizeof buf, " %8.0f %6.0f %6.0f%%", m.clocks.sm_mhz, m.clocks.watts,
                        100.0 * m.clocks.capped_share);
          clock_text = buf;
        }
      }
      std::printf("  %8lld  %-15s %10.3f %9s %10s %9s%s%s\n", static_cast<long long>(row.seq_len),
                  impl.name.c_str(), m.ms, rate, mib(m.peak_bytes).c_str(), vs.c_str(), spread_text.c_str(),
                  clock_text.c_str());
    }
  }
  for (const auto& [reason, seq] : reasons) {
    std::printf("  note (from seq_len %s) %s\n", seq.c_str(), reason.c_str());
  }
  for (const auto& note : power_notes) std::printf("%s", note.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

void print_profiles(const BenchConfig& cfg, const std::vector<Impl>& impls, const std::vector<Row>& rows, Pass pass) {
  if (cfg.profile <= 0) return;
  for (const auto& row : rows) {
    for (const auto& impl : impls) {
      const Measurement& m = row.by_impl.at(impl.name);
      if (m.profile.empty()) continue;
      std::printf("%s, %s, seq_len %lld: where %d more iterations went (--profile)\n", pass_title(pass),
                  impl.name.c_str(), static_cast<long long>(row.seq_len), cfg.profile);
      std::string line;
      for (std::istringstream in(m.profile); std::getline(in, line);) std::printf("    %s\n", line.c_str());
    }
  }
  std::printf("\n");
  std::fflush(stdout);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json record(const BenchConfig& cfg, const std::string& impl, const DtypeSpec& dtype,
                      int64_t dim_head, int64_t n, Pass pass, const Measurement& m) {
  nlohmann::json r;
  r["impl"] = impl;
  r["pass"] = pass_name(pass);
  r["attention"] = cfg.attention;
  r["dtype"] = dtype.name;
  r["batch"] = cfg.batch;
  r["heads"] = cfg.heads;
  r["dim_head"] = dim_head;
  r["seq_len"] = n;
  r["causal"] = cfg.causal;
  r["mask_prob"] = cfg.mask_prob;
  r["bias"] = cfg.bias;
  r["status"] = m.status;
  const double flops = pass_flops(cfg, dim_head, n, pass);
  r["flops"] = flops;
  if (m.status == "ok") {
    r["ms"] = m.ms;
    r["ms_min"] = m.ms_min;
    r["ms_mean"] = m.ms_mean;
    r["iters"] = m.iters;
    r["round_ms"] = m.round_ms;
    if (!m.profile.empty()) r["profile"] = m.profile;
    if (cfg.clocks) {  // the round kept's, beside the record's other fields, then each round's
      r.update(clock_json(m.clocks));
      r["round_clocks"] = nlohmann::json::array();
      for (const ClockStats& c : m.round_clocks) r["round_clocks"].push_back(clock_json(c));
    }
    r["tflops"] = flops / (m.ms * 1e-3) / 1e12;
  } else {
    r["ms"] = nullptr;
    r["tflops"] = nullptr;
    r["reason"] = m.reason;
  }
  r["peak_bytes"] = m.peak_bytes >= 0 ? nlohmann::json(m.peak_bytes) : nlohmann::json(nullptr);
  r["base_bytes"] = m.base_bytes >= 0 ? nlohmann::json(m.base_bytes) : nlohmann::json(nullptr);
  return r;
}

void write_json(const std::string& path, const nlohmann::json& doc) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) {
      throw std::runtime_error("--json " + path + ": cannot write " + tmp +
                               " (does the directory exist and is it writable?)");
    }
    out << doc.dump(2) << "\n";
    if (!out) throw std::runtime_error("--json " + path + ": writing " + tmp + " failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());  // leave nothing behind
    throw std::runtime_error("--json " + path + ": cannot rename " + tmp + " to it (" + why + ")");
  }
}

}  // namespace flashcos::app::bench
