// TrainConfig: its checks (before anything is created) and its JSON form (config.json and the
// checkpoint's record, which a resume starts from).
#include "model/trainer.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/log.h"
#include "model/determinism.h"

namespace flashcos::model {

void validate_train_config(const TrainConfig& c) {
  auto require = [](bool ok, const std::string& msg) {
    if (!ok) throw std::invalid_argument(msg);
  };
  require(c.seq_len >= 1, "--seq-len must be >= 1, got " + std::to_string(c.seq_len));
  require(c.batch >= 1, "--batch must be >= 1, got " + std::to_string(c.batch));
  require(c.grad_accum >= 1, "--grad-accum must be >= 1, got " + std::to_string(c.grad_accum));
  require(c.steps >= 1, "--steps must be >= 1, got " + std::to_string(c.steps));
  require(c.lr > 0 && std::isfinite(c.lr), "--lr must be a positive number");
  require(c.clip_grad >= 0, "--clip-grad must be >= 0 (0 disables clipping)");
  require(c.schedule == "constant" || c.schedule == "cosine", "--schedule must be constant or cosine, got '" + c.schedule + "'");
  if (c.model.deterministic) {
    const std::string workspace = cublas_workspace_problem(std::getenv("CUBLAS_WORKSPACE_CONFIG"));
    require(workspace.empty(), "--deterministic: " + workspace);
  }
  require(c.validate_every >= 1 && c.generate_every >= 0 && c.save_every >= 1 && c.log_every >= 1,
          "--validate-every, --save-every, --log-every must be >= 1 (--generate-every 0 disables samples)");
  require(c.seq_len <= c.model.max_seq_len, "--seq-len " + std::to_string(c.seq_len) + " exceeds the model's max_seq_len " +
                                                std::to_string(c.model.max_seq_len));
  require(c.seq_len <= (int64_t(1) << 30), "--seq-len must be <= 2^30 (1073741824), got " + std::to_string(c.seq_len));
  require(c.warmup >= 0, "--warmup must be >= 0, got " + std::to_string(c.warmup));
  require(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1, strf("--min-lr-ratio must be in [0, 1], got %g", c.min_lr_ratio));
  require(c.weight_decay >= 0 && std::isfinite(c.weight_decay), strf("--weight-decay must be >= 0, got %g", c.weight_decay));
  require(c.adam_beta1 >= 0 && c.adam_beta1 < 1, strf("--adam-beta1 must be in [0, 1), got %g", c.adam_beta1));
  require(c.adam_beta2 >= 0 && c.adam_beta2 < 1, strf("--adam-beta2 must be in [0, 1), got %g", c.adam_beta2));
  require(c.val_windows >= 1, "--val-windows must be >= 1, got " + std::to_string(c.val_windows));
  require(c.generate_length >= 1, "--generate-length must be >= 1, got " + std::to_string(c.generate_length));
  require(c.profile_steps >= 0, "--profile-steps must be >= 0, got " + std::to_string(c.profile_steps));
  require(c.profile_steps <= c.steps, "--profile-steps must be <= --steps (" + std::to_string(c.steps) + "), got " +
                                          std::to_string(c.profile_steps));
  require(c.cuda_graph == "auto" || c.cuda_graph == "on" || c.cuda_graph == "off",
          "--cuda-graph must be auto, on or off, got '" + c.cuda_graph + "'");
  require(c.run.find('/') == std::string::npos && c.run != "." && c.run != "..",
          "--run must be a plain folder name (no '/'), got '" + c.run + "'");
  c.model.validate();
}

std::string TrainConfig::to_json() const {
  nlohmann::json j = {{"data", data}, {"split", split}, {"seq_len", seq_len}, {"batch", batch},
                      {"grad_accum", grad_accum}, {"steps", steps}, {"lr", lr}, {"warmup", warmup},
                      {"schedule", schedule}, {"min_lr_ratio", min_lr_ratio}, {"weight_decay", weight_decay},
                      {"adam_beta1", adam_beta1}, {"adam_beta2", adam_beta2},
                      {"clip_grad", clip_grad}, {"precision", precision}, {"validate_every", validate_every},
                      {"val_windows", val_windows}, {"generate_every", generate_every},
                      {"generate_length", generate_length}, {"save_every", save_every}, {"log_every", log_every},
                      {"checkpoint_dir", checkpoint_dir}, {"run", run}, {"resume", resume}, {"seed", seed},
                      {"device", device}};
  return j.dump();
}

TrainConfig TrainConfig::from_json(const std::string& json, const TrainConfig& d) {
  TrainConfig c = d;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
    c.data = j.value("data", d.data);
    c.split = j.value("split", d.split);
    c.seq_len = j.value("seq_len", d.seq_len);
    c.batch = j.value("batch", d.batch);
    c.grad_accum = j.value("grad_accum", d.grad_accum);
    c.steps = j.value("steps", d.steps);
    c.lr = j.value("lr", d.lr);
    c.warmup = j.value("warmup", d.warmup);
    c.schedule = j.value("schedule", d.schedule);
    c.min_lr_ratio = j.value("min_lr_ratio", d.min_lr_ratio);
    c.weight_decay = j.value("weight_decay", d.weight_decay);
    // Checkpoints from before the option trained with libtorch's defaults, whatever today's are.
    c.adam_beta1 = j.value("adam_beta1", 0.9);
    c.adam_beta2 = j.value("adam_beta2", 0.999);
    c.clip_grad = j.value("clip_grad", d.clip_grad);
    c.precision = j.value("precision", d.precision);
    c.validate_every = j.value("validate_every", d.validate_every);
    c.val_windows = j.value("val_windows", d.val_windows);
    c.generate_every = j.value("generate_every", d.generate_every);
    c.generate_length = j.value("generate_length", d.generate_length);
    c.save_every = j.value("save_every", d.save_every);
    c.log_every = j.value("log_every", d.log_every);
    c.checkpoint_dir = j.value("checkpoint_dir", d.checkpoint_dir);
    c.run = j.value("run", d.run);
    c.resume = j.value("resume", d.resume);
    c.seed = j.value("seed", d.seed);
    c.device = j.value("device", d.device);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("malformed train config: ") + e.what());
  }
  return c;
}

}  // namespace flashcos::model
