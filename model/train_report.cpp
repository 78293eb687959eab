#include "model/train_report.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "common/log.h"

namespace flashcos::model {

void log_run_start(const TrainConfig& cfg, const RunStart& start) {
  const auto ll = [](int64_t v) { return static_cast<long long>(v); };
  log::info(strf("flashcos train: run '%s' on %s, precision %s", cfg.run.c_str(), start.device.c_str(),
                 start.precision.c_str()));
  log::info(strf("  data        %s (train %lld / val %lld / test %lld bytes)", cfg.data.c_str(), ll(start.train_bytes),
                 ll(start.val_bytes), ll(start.test_bytes)));
  log::info(strf("  model       dim %lld, depth %lld, heads %lld x %lld, %.2fM params, attention %s (%s)",
                 ll(cfg.model.dim), ll(cfg.model.depth), ll(cfg.model.heads), ll(cfg.model.dim_head),
                 cfg.model.num_parameters() / 1e6, cfg.model.attention.c_str(), cfg.model.attention_impl.c_str()));
  if (!start.parallel.empty()) {
    log::info("  parallel    " + start.parallel);
    log::info("  comm        " + start.comm);
    log::info(strf("  batch       %lld x %lld accum x %lld ranks x %lld tokens = %lld tokens/step (global batch %lld)",
                   ll(cfg.batch), ll(cfg.grad_accum), ll(start.world), ll(cfg.seq_len), ll(start.tokens_per_step),
                   ll(cfg.batch * cfg.grad_accum * start.world)));
  } else {
    log::info(strf("  batch       %lld x %lld accum x %lld tokens = %lld tokens/step", ll(cfg.batch),
                   ll(cfg.grad_accum), ll(cfg.seq_len), ll(start.tokens_per_step)));
  }
  log::info(strf("  optimiser   %s (betas %g, %g) lr %.3g (%s, warmup %lld), clip %.3g, steps %lld%s",
                 cfg.weight_decay > 0 ? "AdamW" : "Adam", cfg.adam_beta1, cfg.adam_beta2, cfg.lr, cfg.schedule.c_str(),
                 ll(cfg.warmup), cfg.clip_grad, ll(cfg.steps),
                 start.resumed_at < 0 ? "" : strf(", resumed at step %lld", ll(start.resumed_at)).c_str()));
  if (start.determinism) {
    const char* workspace = std::getenv("CUBLAS_WORKSPACE_CONFIG");
    log::info(std::string("  determinism on: the attention's deterministic backward, libtorch's deterministic algorithms, ") +
              "CUBLAS_WORKSPACE_CONFIG=" + (workspace ? workspace : "(unset)"));
  }
  log::info(strf("  output      %s (metrics.jsonl, latest.pt)", start.run_dir.c_str()));
}

void write_run_config(const std::filesystem::path& run_dir, const TrainConfig& cfg) {
  std::ofstream out(run_dir / "config.json");
  out << nlohmann::json{{"train", nlohmann::json::parse(cfg.to_json())},
                        {"model", nlohmann::json::parse(cfg.model.to_json())}}
             .dump(2)
      << '\n';
  out.flush();
  if (!out) {
    log::error("could not write '" + (run_dir / "config.json").string() + "' (disk full?); the checkpoints record "
               "the same configuration");
  }
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds);
  if (s >= 3600) return strf("%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s % 3600 / 60));
  return strf("%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
}

MetricsLog::MetricsLog(const std::string& path) : path_(path), out_(path, std::ios::app) {
  if (!out_) throw std::runtime_error("cannot open metrics file '" + path + "' for writing");
}

void MetricsLog::write(const std::string& json_line) {
  out_ << json_line << '\n';
  out_.flush();
  if (!out_ && !warned_) {
    warned_ = true;
    log::error("could not write to the metrics file '" + path_ + "' (disk full?); its records from here on are lost");
  }
}

}  // namespace flashcos::model
