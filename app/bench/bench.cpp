// ./train bench: times attention implementations on the same inputs, as the seed's benchmark.py.
//
//   ./train bench --causal --dtype bf16 --seq-lens 1024,2048,4096,8192
//
// For every (dtype, head dim, pass) it prints the seed's table (kernel vs the plain baseline) and a
// full table of every implementation this build has on this device: median ms, TFLOP/s and peak
// memory. FLOPs: fwd 4*B*H*I*J*D (halved for causal), bwd 2.5x fwd, fwd+bwd 3.5x fwd; masked keys
// are not subtracted. --json FILE writes every number, one record per implementation x config.
//
// --bias head|batch adds a float32 (H, N, N) / (B, N, N) attention bias with its gradient to ours;
// SDPA gets it as a float attn_mask (with -inf for masked keys and the causal part), without one.
// Implementations (same q, k, v, mask, bias and output gradient for each):
//   plain           flashcos::plain_cosine_sim_attention: the full (I, J) matrix (the baseline)
//   tiled           Backend::kTiled: chunked libtorch ops
//   fused           Backend::kFused: our CUDA kernel (CUDA builds, CUDA device)
//   sdpa-flash, sdpa-cudnn, sdpa-efficient, sdpa-math
//                   at::scaled_dot_product_attention with only that backend enabled, on the same
//                   l2-normalised q, k and the same scale: softmax(scale q.k) is exactly the cosine
//                   kind's exp(scale q.k - scale) / l (cosine kind only).
// q and k are l2-normalised once before timing and every implementation gets them with l2norm off,
// so the timings compare the attention alone; --include-l2norm moves the normalisation into the
// timed region of every implementation.
//
// Passes, each timed after warm-up with one pair of CUDA events per iteration (std::chrono on CPU),
// reported as the median:
//   fwd      the training forward: inputs require grad, the graph is built and dropped
//   bwd      one forward outside the timed region, then autograd::grad(retain_graph) per iteration
//   fwd+bwd  forward and autograd::grad per iteration
// An out-of-memory error prints `oom`, an implementation that rejects the config prints `n/a` (the
// reason follows the table), and the run continues.
// --clocks samples the GPU's SM clock, power and power cap through NVML (gpu_clocks.h) over each
// implementation's timed iterations and adds them to its row.
#include "app/commands.h"
#include "app/bench/gpu_clocks.h"
#include "app/bench/impls.h"
#include "app/bench/options.h"
#include "app/bench/report.h"
#include "app/bench/timing.h"
#include "common/log.h"

#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace flashcos::app {
namespace bench {
namespace {

// A length whose inputs could not be made: every implementation's row says so.
Measurement inputs_failed(const std::exception& e) {
  const Failure f = classify_failure(e);
  Measurement m;
  m.status = f.status;
  m.reason = "the inputs alone: " + first_line(f.what);
  return m;
}

int run(const BenchConfig& cfg) {
  const std::vector<Impl> impls = make_impls(cfg);
  if (impls.empty()) {
    std::fprintf(stderr, "error: no implementation left to time on this device (see --impls)\n");
    return 2;
  }
  // --clocks: NVML's handle of this GPU, taken before anything is timed, so that a machine without
  // NVML fails at once.
  std::unique_ptr<ClockSampler> clocks;
  if (cfg.clocks) clocks = std::make_unique<ClockSampler>(cuda_pci_bus_id());
  bool need_sdpa_mask = false;
  for (const auto& impl : impls) {
    if (impl.name.rfind("sdpa-", 0) == 0 && impl.unavailable.empty()) need_sdpa_mask = true;
  }
  std::string impl_list;
  for (const auto& impl : impls) impl_list += (impl_list.empty() ? "" : ", ") + impl.name;

  const std::string device = device_name(cfg);
  std::printf("device: %s   libtorch %s   %s\n", device.c_str(), TORCH_VERSION, utc_now().c_str());
  std::printf("attention: %s   causal: %s   mask-prob: %g   bias: %s   scale: %g   l2norm: %s\n",
              cfg.attention.c_str(), cfg.causal ? "yes" : "no", cfg.mask_prob, cfg.bias.c_str(), cfg.scale,
              cfg.include_l2norm ? "timed" : "outside the timing");
  std::printf("implementations: %s   warmup: %d%s   iters: %d (median; fewer past %gs)   rounds: %d\n",
              impl_list.c_str(), cfg.warmup,
              cfg.cuda && cfg.warmup > 0 && cfg.warmup_s > 0 ? strf(" and %gs", cfg.warmup_s).c_str() : "", cfg.iters,
              cfg.budget_s, cfg.rounds);
  if (clocks) {
    std::printf("clocks: SM clock, power (%s) and power cap sampled every 10 ms (NVML) over the timed iterations\n",
                clocks->instant_power() ? "instantaneous" : "NVML's one-second average: no instantaneous reading here");
  }
  if (cfg.attention == "fastmax") {
    std::printf(
        "fastmax: p %lld%s, temperature %g, chunk %lld; TFLOP/s counts the quadratic "
        "4*B*H*N*N*D for every implementation (an effective rate for fastmax)\n",
        static_cast<long long>(cfg.fastmax.p()),
        cfg.fastmax.normalize() ? strf(", normalize lim %g", cfg.fastmax.lim()).c_str() : "",
        cfg.fastmax.temperature(), static_cast<long long>(cfg.fastmax.chunk_size()));
  }
  std::printf("\n");
  std::fflush(stdout);

  nlohmann::json doc;
  int64_t measured = 0;  // measurements that succeeded, over every table
  doc["device"] = device;
  doc["device_type"] = cfg.cuda ? "cuda" : "cpu";
  doc["libtorch"] = TORCH_VERSION;
  doc["date"] = utc_now();
  doc["command"] = cfg.command_line;
  doc["flops_note"] =
      "fwd 4*B*H*N*N*D (halved for causal), bwd 2.5x, fwd+bwd 3.5x, for every "
      "implementation (fastmax included: an effective rate)";
  doc["config"] = {{"attention", cfg.attention},
                   {"causal", cfg.causal},
                   {"mask_prob", cfg.mask_prob},
                   {"bias", cfg.bias},
                   {"scale", cfg.scale},
                   {"include_l2norm", cfg.include_l2norm},
                   {"deterministic", cfg.deterministic},
                   {"batch", cfg.batch},
                   {"heads", cfg.heads},
                   {"dim_heads", cfg.dim_heads},
                   {"seq_lens", cfg.seq_lens},
                   {"warmup", cfg.warmup},
                   {"warmup_s", cfg.warmup_s},
                   {"rounds", cfg.rounds},
                   {"iters", cfg.iters},
                   {"budget_s", cfg.budget_s},
                   {"seed", cfg.seed},
                   {"kernel", cfg.kernel},
                   {"baseline", cfg.baseline},
                   {"clocks", cfg.clocks}};
  if (clocks) doc["config"]["clock_power"] = clocks->instant_power() ? "instantaneous" : "one-second average";
  if (cfg.attention == "fastmax") {
    doc["config"]["fastmax"] = {{"p", cfg.fastmax.p()},
                                {"normalize", cfg.fastmax.normalize()},
                                {"lim", cfg.fastmax.lim()},
                                {"temperature", cfg.fastmax.temperature()},
                                {"chunk_size", cfg.fastmax.chunk_size()}};
  }
  std::vector<std::string> dtype_names, pass_names, impl_names;
  for (const auto& d : cfg.dtypes) dtype_names.push_back(d.name);
  for (const auto p : cfg.passes) pass_names.push_back(pass_name(p));
  for (const auto& impl : impls) impl_names.push_back(impl.name);
  doc["config"]["dtypes"] = dtype_names;
  doc["config"]["passes"] = pass_names;
  doc["config"]["impls"] = impl_names;
  doc["results"] = nlohmann::json::array();
  // Written once up front so that an unwritable path fails before minutes of timing.
  if (!cfg.json_path.empty()) write_json(cfg.json_path, doc);

  const std::string rule(72, '-');
  try {
    for (const auto& dtype : cfg.dtypes) {
      for (const int64_t dim_head : cfg.dim_heads) {
        for (const Pass pass : cfg.passes) {
          std::string kernel_name = cfg.kernel;
          if (cfg.kernel == "auto") {
            const bool fm = cfg.attention == "fastmax";
            const std::string first = fm ? "fastmax-cuda" : "fused";
            const std::string second = fm ? "fastmax-chunked" : "tiled";
            kernel_name = has_impl(impls, first) ? first + ", else " + second : second;
          }
          char mask_note[96] = "";
          if (cfg.mask_prob > 0)
            std::snprintf(mask_note, sizeof mask_note, ", mask-prob %g", cfg.mask_prob);
          if (cfg.bias != "none")
            std::snprintf(mask_note + std::strlen(mask_note), sizeof mask_note - std::strlen(mask_note), ", bias %s",
                          cfg.bias.c_str());
          if (cfg.deterministic && pass != Pass::kFwd)
            std::snprintf(mask_note + std::strlen(mask_note), sizeof mask_note - std::strlen(mask_note),
                          ", deterministic");
          std::printf(
              "%s\n%-12sbatch: %-5lld heads: %-5lld dim %-5lld %s%s%s   kernel: %s   "
              "baseline: %s\n%s\n",
              rule.c_str(), dtype.long_name.c_str(), static_cast<long long>(cfg.batch),
              static_cast<long long>(cfg.heads), static_cast<long long>(dim_head), pass_title(pass),
              cfg.causal ? ", causal" : "", mask_note, kernel_name.c_str(), cfg.baseline.c_str(),
              rule.c_str());
          std::fflush(stdout);
          std::vector<Row> rows;
          // Per implementation, its last result in this table: a length after an oom is not tried,
          // nor one whose predicted time per iteration passes 10x --budget.
          std::map<std::string, std::pair<int64_t, Measurement>> last;
          for (const int64_t n : cfg.seq_lens) {
            Row row{n, {}};
            Inputs in;
            Measurement input_failure;
            try {
              in = make_inputs(cfg, dtype, dim_head, n, need_sdpa_mask);
            } catch (const c10::Error& e) {  // the tensors' failure (an allocation, mostly): this length's row
              input_failure = inputs_failed(e);
            } catch (const std::bad_alloc& e) {
              input_failure = inputs_failed(e);
            }
            // Round r times the implementations in list order (reversed when r is odd); each
            // keeps its fastest round. A failure or a skip is final.
            std::map<std::string, Measurement> skips;
            std::map<std::string, std::vector<double>> round_ms;  // each round's median, for the spread
            std::map<std::string, std::vector<ClockStats>> round_clocks;  // --clocks: each round's
            std::map<std::string, std::string> profiles;           // --profile: the first round's report
            for (const auto& impl : impls) skips[impl.name] = predicted_skip(cfg, impl.name, n, last);
            for (int round = 0; round < cfg.rounds; ++round) {
              for (size_t k = 0; k < impls.size(); ++k) {
                const auto& impl = impls[round % 2 == 1 ? impls.size() - 1 - k : k];
                const auto done = row.by_impl.find(impl.name);
                if (done != row.by_impl.end() && done->second.status != "ok") continue;
                Measurement m;
                if (input_failure.status != "ok") {
                  m = input_failure;
                } else if (skips[impl.name].status != "ok") {
                  m = skips[impl.name];
                } else {
                  m = measure(cfg, impl, pass, in, round == 0, clocks.get());
                  if (m.status == "ok") {
                    round_ms[impl.name].push_back(m.ms);
                    round_clocks[impl.name].push_back(m.clocks);
                  }
                  if (!m.profile.empty()) profiles[impl.name] = m.profile;
                }
                if (done == row.by_impl.end() || m.status != "ok" || m.ms < done->second.ms) {
                  row.by_impl[impl.name] = m;
                }
              }
            }
            for (const auto& impl : impls) {
              Measurement& m = row.by_impl[impl.name];
              if (m.status == "ok") {
                m.round_ms = round_ms[impl.name];
                if (cfg.clocks) m.round_clocks = round_clocks[impl.name];
              }
              m.profile = profiles[impl.name];
              if (input_failure.status == "ok" && skips[impl.name].status == "ok" &&
                  (m.status == "ok" || m.status == "oom"))
                last[impl.name] = {n, m};
              doc["results"].push_back(record(cfg, impl.name, dtype, dim_head, n, pass, m));
              measured += m.status == "ok" ? 1 : 0;
            }
            in = Inputs{};
            if (cfg.cuda) at::accelerator::emptyCache();
            print_seed_row(cfg, impls, row);
            rows.push_back(std::move(row));
          }
          print_full_table(cfg, impls, rows, dim_head, pass);
          print_profiles(cfg, impls, rows, pass);
          // Rewritten after every table, so a long run that dies later keeps what it measured.
          if (!cfg.json_path.empty()) write_json(cfg.json_path, doc);
        }
      }
    }
  } catch (const DeviceLost& e) {
    if (!cfg.json_path.empty()) {
      doc["error"] = e.what();
      write_json(cfg.json_path, doc);
    }
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (!cfg.json_path.empty()) std::printf("wrote %s\n", cfg.json_path.c_str());
  if (measured == 0) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: nothing was timed: every implementation of every row is n/a, oom or skipped here "
                         "(the notes above say why; on a machine without a GPU, --impls plain,tiled run)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace bench

int run_bench(int argc, char** argv) {
  std::string command_line = "./train";
  for (int i = 0; i < argc; ++i) command_line += std::string(" ") + argv[i];
  auto options = bench::make_options();
  bench::BenchConfig cfg;
  try {
    const auto result = options.parse(argc, argv);
    if (result.count("help")) {
      std::printf("%s\n", options.help({"shape", "attention", "what to time"}).c_str());
      return 0;
    }
    cfg = bench::parse_config(result, command_line);
  } catch (const cxxopts::exceptions::exception& e) {
    std::fprintf(stderr, "error: %s (see ./train bench --help)\n", e.what());
    return 2;
  } catch (const bench::UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  try {
    return bench::run(cfg);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}

}  // namespace flashcos::app
