// Checkpoints: one file (checkpoints/<run>/latest.pt) holding the model, the optimiser, the
// loss scaler, the step, the data sampler's generator and the full model + train config, so
// sample / eval rebuild the model from it alone and --resume continues exactly.
// Written to a temporary file in the same folder, then renamed: a crash never leaves a
// half-written checkpoint, and a failed save never overwrites the previous one.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/gpt.h"

namespace flashcos::model {

constexpr int64_t kCheckpointFormat = 1;

struct TrainState {
  int64_t step = 0;               // optimiser steps done
  std::string sampler_state;      // data::BatchSampler::state()
  double loss_scale = 1.0;        // fp16 dynamic loss scale
  int64_t scale_good_steps = 0;   // steps since the last scale change
  std::string train_config_json;  // the resolved train config, for the record
};

struct CheckpointMeta {
  ModelConfig model;
  TrainState state;
};

// Throws std::runtime_error (and writes nothing) if a parameter is not finite.
void save_checkpoint(const std::string& path, GPT& model, torch::optim::Optimizer* optimizer,
                     const ModelConfig& config, const TrainState& state);

// Removes the .tmp file that save_checkpoint is writing, if it is writing one; async-signal-safe (the
// trainer's handler of a second Ctrl-C calls it before it exits at once).
void remove_checkpoint_tmp_in_progress() noexcept;

// Reads only the metadata. Errors name the file and what is wrong (missing, corrupt, not a
// flashcos checkpoint, newer format).
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Loads weights (and optimiser state, when given) into a model built from read_checkpoint_meta.
// Weights that are not finite are an error (a damaged file), here and in load_model.
void load_checkpoint(const std::string& path, GPT& model, torch::optim::Optimizer* optimizer,
                     const torch::Device& device);

// A model rebuilt from the checkpoint alone, on `device`, in eval mode. A non-empty
// `attention_impl` replaces the recorded one (the weights are the same for every implementation).
// Reads the metadata and the weights only, not the optimiser state (checkpoint_weights.h), with
// libtorch's full read as the fallback for anything that reader does not expect.
GPT load_model(const std::string& path, const torch::Device& device, CheckpointMeta* meta = nullptr,
               const std::string& attention_impl = "");

// "checkpoints/run" or "checkpoints/run/latest.pt" -> the .pt path.
std::string resolve_checkpoint_path(const std::string& path_or_dir);

}  // namespace flashcos::model
