// ./train sample --checkpoint checkpoints/<run>/latest.pt --prime "The " --length 512
#include <ATen/ATen.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "app/cli.h"
#include "app/commands.h"
#include "common/log.h"
#include "data/corpus.h"
#include "model/checkpoint.h"
#include "model/device.h"
#include "model/generate.h"

namespace flashcos::app {

int run_sample(int argc, char** argv) {
  cxxopts::Options options("./train sample", "Generate text from a checkpoint.");
  options.add_options()
      ("checkpoint", "checkpoint file or run folder", cxxopts::value<std::string>())
      ("prime", "text to start from (default: a random slice of the validation split of --data)", cxxopts::value<std::string>())
      ("prime-length", "bytes of the random validation slice", cxxopts::value<int64_t>()->default_value("128"))
      ("data", "corpus for the random prime", cxxopts::value<std::string>()->default_value("data/enwik8"))
      ("split", "train,val,test split of --data", cxxopts::value<std::string>()->default_value("90M,5M,5M"))
      ("length", "bytes to generate; with rope (or no) positions it may exceed the training seq-len: the KV cache slides, keeping the last max_seq_len positions", cxxopts::value<int64_t>()->default_value("512"))
      ("no-kv-cache", "re-run the whole window per byte instead of decoding against the KV cache")
      ("temperature", "sampling temperature", cxxopts::value<double>()->default_value("1.0"))
      ("filter-thres", "top-k filter: keep the top (1 - thres) of the logits", cxxopts::value<double>()->default_value("0.9"))
      ("seed", "random seed", cxxopts::value<uint64_t>()->default_value("0"))
      ("device", "auto | cuda | cpu", cxxopts::value<std::string>()->default_value("auto"))
      ("stream", "print bytes as they are generated")
      ("h,help", "print this help");
  cxxopts::ParseResult r;
  int code = 0;
  if (!parse_or_exit(options, argc, argv, r, code)) return code;
  log::init("warn");
  return run_guarded([&] {
    if (!r.count("checkpoint")) throw std::invalid_argument("--checkpoint is required (a .pt file or a run folder)");
    const auto device = model::resolve_device(r["device"].as<std::string>());
    const auto path = model::resolve_checkpoint_path(r["checkpoint"].as<std::string>());
    model::CheckpointMeta meta;
    auto gpt = model::load_model(path, device, &meta);
    const int64_t length = r["length"].as<int64_t>();
    if (length < 1) throw std::invalid_argument("--length must be >= 1");

    at::Tensor prime;
    if (r.count("prime")) {
      const auto text = r["prime"].as<std::string>();
      if (text.empty()) throw std::invalid_argument("--prime must not be empty");
      prime = data::encode_text(text);
    } else {
      const std::string data_path = data::resolve_corpus_path(r["data"].as<std::string>());
      const int64_t n = r["prime-length"].as<int64_t>();
      auto corpus = data::load_corpus(data_path, data::parse_split(r["split"].as<std::string>()), n + 1);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(r["seed"].as<uint64_t>());
      const int64_t start = at::randint(corpus.val.numel() - n, {1}, gen).item<int64_t>();
      prime = corpus.val.slice(0, start, start + n).to(at::kLong).unsqueeze(0);
    }
    model::SampleOptions so;
    so.length = length;
    so.temperature = r["temperature"].as<double>();
    so.filter_thres = r["filter-thres"].as<double>();
    so.seed = r["seed"].as<uint64_t>();
    so.use_cache = r.count("no-kv-cache") == 0;
    std::printf("%s", data::decode_bytes(prime).c_str());
    std::fflush(stdout);
    const bool stream = r.count("stream") > 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto out = model::generate(gpt, prime.to(device), so, [&](int64_t token) {
      if (stream) {
        std::printf("%s", data::decode_bytes(at::full({1}, token, at::kLong)).c_str());
        std::fflush(stdout);
      }
    });
    if (!stream) std::printf("%s", data::decode_bytes(out).c_str());
    std::printf("\n");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "generated %lld bytes in %.3f s (%.1f bytes/s, %s)\n", static_cast<long long>(out.numel()), secs,
                 static_cast<double>(out.numel()) / std::max(secs, 1e-9), so.use_cache ? "KV cache" : "no cache");
    return 0;
  });
}

}  // namespace flashcos::app
