#include "model/checkpoint.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>

#include "model/checkpoint_weights.h"

namespace flashcos::model {
namespace fs = std::filesystem;

namespace {

// The first line of a library's message, cut at a sentence's end (or a word's, with "...") so that
// it stays under max_chars.
std::string first_sentence(const std::string& what, size_t max_chars) {
  std::string line = what.substr(0, what.find('\n'));
  if (line.size() <= max_chars) return line;
  const size_t stop = line.rfind(". ", max_chars);
  if (stop != std::string::npos && stop > 0) return line.substr(0, stop + 1);
  const size_t space = line.rfind(' ', max_chars);
  return line.substr(0, space == std::string::npos || space == 0 ? max_chars : space) + " ...";
}

std::string meta_json(const ModelConfig& config, const TrainState& s) {
  nlohmann::json j;
  j["format"] = kCheckpointFormat;
  j["model"] = nlohmann::json::parse(config.to_json());
  j["step"] = s.step;
  j["sampler_state"] = s.sampler_state;
  j["loss_scale"] = s.loss_scale;
  j["scale_good_steps"] = s.scale_good_steps;
  j["train_config"] = s.train_config_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(s.train_config_json);
  return j.dump();
}

torch::serialize::InputArchive open_archive(const std::string& path, const torch::Device& device) {
  if (!fs::exists(path)) throw std::runtime_error("checkpoint '" + path + "' does not exist");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path, device);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint '" + path + "' is corrupt or not a flashcos checkpoint (" +
                             first_sentence(e.what(), 240) + ")");
  }
  return archive;
}

}  // namespace

namespace {

// The name of the first parameter with a value that is not finite, or "" when every one is finite.
std::string first_non_finite_parameter(GPT& model) {
  torch::NoGradGuard no_grad;
  for (const auto& p : model->named_parameters()) {
    if (!torch::isfinite(p.value()).all().item<bool>()) return p.key();
  }
  return "";
}

// A parameter that is not finite after a load: the file is damaged (a saved checkpoint never holds
// one, save_checkpoint refuses those).
void check_loaded_weights_finite(GPT& model, const std::string& path) {
  const std::string bad = first_non_finite_parameter(model);
  if (!bad.empty()) {
    throw std::runtime_error("checkpoint '" + path + "': parameter '" + bad +
                             "' holds values that are not finite, which no saved checkpoint has: the file is "
                             "damaged; use an earlier checkpoint");
  }
}

// The .tmp that save_checkpoint is writing, for remove_checkpoint_tmp_in_progress (a signal handler:
// a fixed buffer and an atomic flag, no allocation).
char g_tmp_path[4096];
std::atomic<bool> g_tmp_active{false};

}  // namespace

void remove_checkpoint_tmp_in_progress() noexcept {
  if (g_tmp_active.load()) ::unlink(g_tmp_path);
}

namespace {

struct TmpInProgress {
  explicit TmpInProgress(const std::string& tmp) {
    if (tmp.size() >= sizeof(g_tmp_path)) return;
    std::memcpy(g_tmp_path, tmp.c_str(), tmp.size() + 1);
    g_tmp_active.store(true);
  }
  ~TmpInProgress() { g_tmp_active.store(false); }
};

}  // namespace

std::string resolve_checkpoint_path(const std::string& p) {
  if (fs::is_directory(p)) return (fs::path(p) / "latest.pt").string();
  return p;
}

void save_checkpoint(const std::string& path, GPT& model, torch::optim::Optimizer* optimizer,
                     const ModelConfig& config, const TrainState& state) {
  const std::string bad = first_non_finite_parameter(model);
  if (!bad.empty()) {
    throw std::runtime_error("refusing to save checkpoint '" + path + "': parameter '" + bad +
                             "' is not finite (the run diverged; lower --lr or use --precision fp32)");
  }
  torch::serialize::OutputArchive root;
  root.write("meta", c10::IValue(meta_json(config, state)));
  torch::serialize::OutputArchive model_archive;
  model->save(model_archive);
  root.write("model", model_archive);
  if (optimizer) {
    torch::serialize::OutputArchive opt_archive;
    optimizer->save(opt_archive);
    root.write("optimizer", opt_archive);
  }
  fs::create_directories(fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path());
  const std::string tmp = path + ".tmp";
  // Our own writer: libtorch's file writer throws on a full disk from a place that can end in
  // std::terminate. This one records the first error (errno) and swallows the rest of the bytes,
  // so the archive finishes cleanly and we report, remove the .tmp and keep the old checkpoint.
  const TmpInProgress in_progress(tmp);  // a second Ctrl-C while it is written removes it
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("could not create '" + tmp + "': " + std::strerror(errno));
  int write_errno = 0;
  auto writer = [&](const void* buf, size_t n) -> size_t {
    const char* p = static_cast<const char*>(buf);
    size_t left = n;
    while (left > 0 && write_errno == 0) {
      const ssize_t w = ::write(fd, p, left);
      if (w < 0) {
        if (errno == EINTR) continue;
        write_errno = errno;
        break;
      }
      p += w;
      left -= static_cast<size_t>(w);
    }
    return n;
  };
  std::string other_error;
  try {
    root.save_to(writer);
  } catch (const std::exception& e) {
    other_error = std::string(e.what()).substr(0, 200);
  }
  if (write_errno == 0 && other_error.empty() && ::fsync(fd) != 0) write_errno = errno;
  if (::close(fd) != 0 && write_errno == 0) write_errno = errno;
  if (write_errno != 0 || !other_error.empty()) {
    std::remove(tmp.c_str());
    throw std::runtime_error("could not write checkpoint '" + tmp + "': " +
                             (write_errno ? std::string(std::strerror(write_errno)) : other_error));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("could not rename '" + tmp + "' to '" + path + "': " + ec.message());
}

namespace {

CheckpointMeta meta_from_json(const std::string& text, const std::string& path) {
  CheckpointMeta meta;
  try {
    auto j = nlohmann::json::parse(text);
    const int64_t format = j.at("format");
    if (format > kCheckpointFormat) {
      throw std::runtime_error("checkpoint '" + path + "' has format " + std::to_string(format) +
                               ", this build reads up to " + std::to_string(kCheckpointFormat));
    }
    meta.model = ModelConfig::from_json(j.at("model").dump());
    meta.state.step = j.at("step");
    meta.state.sampler_state = j.at("sampler_state");
    meta.state.loss_scale = j.at("loss_scale");
    meta.state.scale_good_steps = j.at("scale_good_steps");
    meta.state.train_config_json = j.at("train_config").dump();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("checkpoint '" + path + "' has malformed metadata: " + e.what());
  }
  return meta;
}

CheckpointMeta meta_from_archive(torch::serialize::InputArchive& archive, const std::string& path) {
  c10::IValue meta_value;
  if (!archive.try_read("meta", meta_value) || !meta_value.isString()) {
    throw std::runtime_error("checkpoint '" + path + "' has no flashcos metadata (not a flashcos checkpoint?)");
  }
  return meta_from_json(meta_value.toStringRef(), path);
}

// The model from the weights alone (checkpoint_weights.h: the optimiser state, two thirds of the
// file, is never read), or nullopt when that reader meets anything it does not expect (another
// layout, a damaged file, a parameter missing or of another shape): the caller then reads the whole
// file with libtorch, which loads what it can and otherwise gives the canonical error.
// FLASHCOS_CHECKPOINT_FULL_READ=1 skips it (for comparisons).
// The recorded model config with `impl` (when non-empty) as its attention implementation.
void override_attention_impl(CheckpointMeta& meta, const std::string& impl) {
  if (impl.empty()) return;
  meta.model.attention_impl = impl;
  meta.model.validate();
}

std::optional<GPT> load_weights_only(const std::string& path, CheckpointMeta* meta_out, const std::string& impl) {
  const char* full = std::getenv("FLASHCOS_CHECKPOINT_FULL_READ");
  if (full && std::string(full) == "1") return std::nullopt;
  std::unique_ptr<WeightsReader> weights;
  CheckpointMeta meta;
  try {
    weights = std::make_unique<WeightsReader>(path);
    meta = meta_from_json(weights->meta_json(), path);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  override_attention_impl(meta, impl);
  GPT model(meta.model, /*initialise=*/false);  // every weight comes from the file
  try {
    weights->load_into(model);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  *meta_out = meta;
  return model;
}

// Weights (and optimiser state, when given) from an open archive into `model`.
void load_from_archive(torch::serialize::InputArchive& archive, const std::string& path, GPT& model,
                       torch::optim::Optimizer* optimizer) {
  try {
    torch::serialize::InputArchive model_archive;
    archive.read("model", model_archive);
    // Module::load replaces each tensor wholesale (set_), so a checkpoint of another shape would
    // load silently: compare every parameter's shape with the one the config built.
    std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
    for (const auto& p : model->named_parameters()) expected.emplace_back(p.key(), p.value().sizes().vec());
    model->load(model_archive);
    const auto loaded = model->named_parameters();
    for (const auto& [name, sizes] : expected) {
      const auto got = loaded[name].sizes().vec();
      if (got != sizes) {
        throw std::runtime_error("parameter '" + name + "' has shape " + c10::str(c10::IntArrayRef(got)) +
                                 " in the file, the model expects " + c10::str(c10::IntArrayRef(sizes)));
      }
    }
    if (optimizer) {
      torch::serialize::InputArchive opt_archive;
      if (!archive.try_read("optimizer", opt_archive)) {
        throw std::runtime_error("it holds no optimiser state (saved for inference only?)");
      }
      optimizer->load(opt_archive);
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint '" + path + "' does not match the model: " +
                             std::string(e.what()).substr(0, 300));
  }
}

}  // namespace

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  auto archive = open_archive(path, torch::kCPU);
  return meta_from_archive(archive, path);
}

void load_checkpoint(const std::string& path, GPT& model, torch::optim::Optimizer* optimizer,
                     const torch::Device& device) {
  auto archive = open_archive(path, device);
  load_from_archive(archive, path, model, optimizer);
  check_loaded_weights_finite(model, path);
}

GPT load_model(const std::string& path, const torch::Device& device, CheckpointMeta* meta_out,
               const std::string& attention_impl) {
  CheckpointMeta meta;
  std::optional<GPT> model = load_weights_only(path, &meta, attention_impl);
  if (!model) {
    // One read of the whole file (the archive holds the optimiser state too: reading it once on
    // the CPU is the least libtorch's archive allows), then the weights move.
    auto archive = open_archive(path, torch::kCPU);
    meta = meta_from_archive(archive, path);
    override_attention_impl(meta, attention_impl);
    model.emplace(meta.model, /*initialise=*/false);  // every weight comes from the file
    load_from_archive(archive, path, *model, nullptr);
  }
  check_loaded_weights_finite(*model, path);
  (*model)->to(device);
  (*model)->eval();
  if (meta_out) *meta_out = meta;
  return *model;
}

}  // namespace flashcos::model
