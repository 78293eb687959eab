// The training loop: data + model + optimiser -> loop -> metrics / checkpoints.
// Config comes resolved from app/train.cpp; nothing here sees the command line.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace flashcos::model {

struct TrainConfig {
  std::string data = "data/enwik8";  // raw or .gz; data/enwik8.gz is tried when this is missing
  std::string split = "90M,5M,5M";
  int64_t seq_len = 1024;
  int64_t batch = 4;
  int64_t grad_accum = 4;
  int64_t steps = 100000;           // total optimiser steps (a resumed run continues up to this)
  // The default recipe (warmup + cosine, peak lr 3e-3) beat the seed's (lr 2e-4 constant; --seed-recipe)
  // by 0.32 bpc at step 500, seq 8192 (README, "Recipe").
  double lr = 3e-3;
  int64_t warmup = 100;             // linear warmup steps
  std::string schedule = "cosine";  // constant | cosine (to min_lr_ratio * lr at `steps`)
  double min_lr_ratio = 0.1;
  double weight_decay = 0.0;        // > 0: AdamW (decoupled), else Adam
  double adam_beta1 = 0.9;          // Adam(W) moment decays; a checkpoint that records none ran 0.9 / 0.999.
  double adam_beta2 = 0.95;         // 0.95 beat 0.99 and 0.999 at step 500, seq 8192 (README, "Recipe")
  double clip_grad = 0.5;
  std::string precision = "auto";   // auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp16 | fp32
  int64_t validate_every = 100;
  int64_t val_windows = 16;         // fixed validation windows per validation
  int64_t generate_every = 500;
  int64_t generate_length = 512;
  int64_t save_every = 500;         // also saved at the end, on Ctrl-C and after each validation
  int64_t log_every = 10;
  int64_t profile_steps = 0;        // > 0: GPU time per kernel over this many steps, after 2 warm-up steps
  std::string cuda_graph = "auto";  // auto | on | off: micro-steps replayed from one CUDA graph (train_graph.h)
  std::string checkpoint_dir = "checkpoints";
  std::string run;                  // run name (default: run-<date>-<time>)
  std::string resume;               // checkpoint file or run folder to continue
  bool overwrite = false;           // replace an existing run folder's files (else it is refused)
  uint64_t seed = 42;
  std::string device = "auto";      // auto | cuda | cpu
  // Data parallel (model/distributed.h), used only when the environment describes a job
  // (RANK/WORLD_SIZE as torchrun sets, or SLURM_PROCID/SLURM_NTASKS > 1).
  std::string dist_backend = "auto";  // nccl | gloo | auto (nccl on CUDA, gloo on CPU)
  int64_t dist_timeout_s = 300;       // a collective not done within this fails, naming the rank
  ModelConfig model;

  // Every field the command line sets except the model, profile_steps, cuda_graph and overwrite (the JSON
  // keys are the option names with '_' for '-'). from_json takes missing keys from `defaults`.
  std::string to_json() const;
  static TrainConfig from_json(const std::string& json, const TrainConfig& defaults);
};

// Process exit codes of train(). A signal that asked for a stop exits with 128 + the signal
// (143 for SIGTERM, 129 for SIGHUP) after the checkpoint is saved, as schedulers expect of a
// job that was told to stop; the first Ctrl-C (SIGINT) saves and exits 0.
constexpr int kExitDiverged = 1;      // non-finite loss: nothing saved, last good checkpoint kept
constexpr int kExitSaveFailed = 1;    // the final (or interrupt) checkpoint could not be written

// Throws std::invalid_argument naming the first bad option (no files are touched).
void validate_train_config(const TrainConfig& cfg);

// Runs training; returns the process exit code (0 also after a Ctrl-C that saved).
int train(TrainConfig cfg);

}  // namespace flashcos::model
