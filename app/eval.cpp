// ./train eval --checkpoint checkpoints/<run>/latest.pt [--max-windows N]
// Bits per character on the test split over non-overlapping windows of the model's sequence length.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "app/attention_choice.h"
#include "app/cli.h"
#include "app/commands.h"
#include "app/run_data.h"
#include "common/log.h"
#include "data/corpus.h"
#include "model/autocast.h"
#include "model/checkpoint.h"
#include "model/device.h"

namespace flashcos::app {

int run_eval(int argc, char** argv) {
  cxxopts::Options options("./train eval", "Bits per character of a checkpoint on the test split.");
  options.add_options()
      ("checkpoint", "checkpoint file or run folder", cxxopts::value<std::string>())
      ("data", "corpus (default: the one the run trained on)", cxxopts::value<std::string>())
      ("split", "train,val,test split (default: the run's)", cxxopts::value<std::string>())
      ("which", "test | val", cxxopts::value<std::string>()->default_value("test"))
      ("seq-len", "window length (default: the run's --seq-len)", cxxopts::value<int64_t>())
      ("batch", "windows per forward pass", cxxopts::value<int64_t>()->default_value("4"))
      ("max-windows", "evaluate at most N evenly spaced windows (0: all)", cxxopts::value<int64_t>()->default_value("0"))
      ("precision", "auto | bf16 | fp32", cxxopts::value<std::string>()->default_value("auto"))
      ("device", "auto | cuda | cpu", cxxopts::value<std::string>()->default_value("auto"))
      ("attention-impl", "plain | sdpa | tiled | fused (default: the checkpoint's; tiled when fused cannot run here)",
       cxxopts::value<std::string>())
      ("h,help", "print this help");
  cxxopts::ParseResult r;
  int code = 0;
  if (!parse_or_exit(options, argc, argv, r, code)) return code;
  log::init("info");
  return run_guarded([&] {
    if (!r.count("checkpoint")) throw std::invalid_argument("--checkpoint is required (a .pt file or a run folder)");
    const auto device = model::resolve_device(r["device"].as<std::string>());
    const auto path = model::resolve_checkpoint_path(r["checkpoint"].as<std::string>());
    const std::string impl = pick_attention_impl(r.count("attention-impl") ? r["attention-impl"].as<std::string>() : "",
                                                 model::read_checkpoint_meta(path).model.attention_impl, device);
    model::CheckpointMeta meta;
    auto gpt = model::load_model(path, device, &meta, impl);
    const auto train_cfg = nlohmann::json::parse(meta.state.train_config_json);
    const RunData run_data = run_data_or(&train_cfg, r.count("data") ? r["data"].as<std::string>() : "",
                                         r.count("split") ? r["split"].as<std::string>() : "");
    const int64_t seq_len = r.count("seq-len") ? r["seq-len"].as<int64_t>() : train_cfg.value("seq_len", meta.model.max_seq_len);
    if (seq_len < 1 || seq_len > meta.model.max_seq_len) {
      throw std::invalid_argument("--seq-len must be in [1, " + std::to_string(meta.model.max_seq_len) + "] for this model");
    }
    const int64_t batch = r["batch"].as<int64_t>();
    if (batch < 1) throw std::invalid_argument("--batch must be >= 1");
    const int64_t max_windows = r["max-windows"].as<int64_t>();
    if (max_windows < 0) throw std::invalid_argument("--max-windows must be >= 0 (0: all), got " + std::to_string(max_windows));
    const std::string which = r["which"].as<std::string>();
    if (which != "test" && which != "val") throw std::invalid_argument("--which must be test or val");
    const std::string data_path = data::resolve_corpus_path(run_data.path);
    check_run_data_found(run_data, data_path);
    // Only the split evaluated must hold a window; the others may be empty (e.g. --split 0,0,1).
    const auto need = data::SplitNeed::only(which, "one window needs (--seq-len + 1)",
                                            "use a larger " + which + " split in --split or a smaller --seq-len");
    auto corpus = data::load_corpus(data_path, data::parse_split(run_data.split), seq_len + 1, need);
    auto windows = data::fixed_windows(which == "test" ? corpus.test : corpus.val, seq_len, max_windows);
    std::string precision = r["precision"].as<std::string>();
    if (precision == "auto") precision = device.is_cuda() ? "bf16" : "fp32";
    if (precision != "bf16" && precision != "fp32") throw std::invalid_argument("--precision must be auto, bf16 or fp32");
    const bool autocast = precision == "bf16";

    torch::NoGradGuard no_grad;
    const bool tty = isatty(fileno(stderr));
    int64_t next_report = std::max<int64_t>(1, windows.size(0) / 10);
    double total_nats = 0;
    int64_t tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < windows.size(0); i += batch) {
      auto w = windows.slice(0, i, std::min(windows.size(0), i + batch)).to(device);
      double loss = 0;
      {
        model::AutocastScope scope(autocast, device.type(), at::kBFloat16);
        loss = gpt->loss(w).item<double>();
      }
      if (!std::isfinite(loss)) {
        throw std::runtime_error("eval: the loss of windows " + std::to_string(i) + ".. is not finite (" +
                                 std::to_string(loss) + "): a diverged checkpoint?");
      }
      const int64_t n = w.size(0) * seq_len;
      total_nats += loss * n;
      tokens += n;
      // A live counter on a terminal; in a log (not a TTY) one line per ~10% instead of a flood of \r.
      const int64_t done = std::min(windows.size(0), i + batch), total = windows.size(0);
      if (tty) {
        std::fprintf(stderr, "\r%lld/%lld windows", static_cast<long long>(done), static_cast<long long>(total));
      } else if (done >= next_report || done == total) {
        std::fprintf(stderr, "%lld/%lld windows\n", static_cast<long long>(done), static_cast<long long>(total));
        while (next_report <= done) next_report += std::max<int64_t>(1, total / 10);
      }
    }
    if (tty) std::fprintf(stderr, "\n");
    const double nats = total_nats / tokens;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s split of %s: %lld tokens in %lld windows of %lld: loss %.4f nats, %.4f bits/char (%.1fs)\n",
                which.c_str(), data_path.c_str(), static_cast<long long>(tokens),
                static_cast<long long>(windows.size(0)), static_cast<long long>(seq_len), nats, nats / std::log(2.0),
                secs);
    return 0;
  });
}

}  // namespace flashcos::app
