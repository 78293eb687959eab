// ./train [train] --data data/enwik8 --seq-len 8192 --use-cuda-kernel ...
#include <nlohmann/json.hpp>

#include <filesystem>
#include <stdexcept>

#include "app/cli.h"
#include "app/commands.h"
#include "common/log.h"
#include "model/checkpoint.h"
#include "model/trainer.h"

namespace flashcos::app {
namespace {

// Model options that fix the weights' shapes or meaning: a resume refuses a value that differs
// from the checkpoint's. (--attention-impl / --use-cuda-kernel may change: same weights.)
const char* kModelFlags[] = {"dim", "depth", "heads", "dim-head", "attention",
                             "attn-scale", "l2norm-groups", "max-seq-len", "fastmax-p", "pos", "rope-base"};

// The options --seed-recipe sets (unless given themselves; run_train has the values). On --resume
// they count as given, so the recipe overrides the checkpoint's.
const char* kSeedRecipeFlags[] = {"lr", "warmup", "schedule", "adam-beta2"};

bool set_by_seed_recipe(const cxxopts::ParseResult& r, const std::string& flag) {
  if (!r.count("seed-recipe")) return false;
  for (const char* f : kSeedRecipeFlags)
    if (flag == f) return true;
  return false;
}

std::string json_key(const std::string& flag) {
  std::string key = flag;
  for (auto& ch : key)
    if (ch == '-') ch = '_';
  return key;
}

// --resume: the checkpoint's saved train config is the base; each option given on this command
// line overrides it (and is printed); model-shape options must agree with the checkpoint.
model::TrainConfig resolve_resume(const model::TrainConfig& cli, const cxxopts::ParseResult& r) {
  const std::string path = model::resolve_checkpoint_path(cli.resume);
  const auto meta = model::read_checkpoint_meta(path);
  const auto saved = nlohmann::json::parse(model::TrainConfig::from_json(meta.state.train_config_json, cli).to_json());
  const auto given = nlohmann::json::parse(cli.to_json());
  const auto saved_model = nlohmann::json::parse(meta.model.to_json());
  const auto given_model = nlohmann::json::parse(cli.model.to_json());

  for (const char* flag : kModelFlags) {
    const std::string key = json_key(flag);
    if (!r.count(flag) || !given_model.contains(key) || given_model[key] == saved_model[key]) continue;
    throw std::invalid_argument(std::string("--") + flag + " " + given_model[key].dump() + " differs from the checkpoint's " +
                                saved_model[key].dump() + ": the model's shape cannot change on --resume (drop --" +
                                flag + ", or start a new run)");
  }

  log::info("resume: restoring the run's configuration from " + path + " (options given here override it)");
  nlohmann::json merged = saved;
  for (const auto& [key, value] : given.items()) {
    std::string flag = key;
    for (auto& ch : flag)
      if (ch == '_') ch = '-';
    if (key == "resume") {
      merged[key] = value;
    } else if (key == "run" || key == "checkpoint_dir") {
      // Default: continue in the checkpoint's own run folder (the trainer derives it from the path).
      // --checkpoint-dir alone: a folder of the checkpoint's run name there.
      if (key == "run" && !r.count("run") && r.count("checkpoint-dir")) {
        merged[key] = std::filesystem::absolute(path).parent_path().filename().string();
      } else {
        merged[key] = r.count(flag) ? value : nlohmann::json(key == "run" ? "" : cli.checkpoint_dir);
      }
      if (r.count(flag)) log::info("resume: --" + flag + " " + value.dump() + " (a new run folder, not the checkpoint's)");
    } else if (r.count(flag) || set_by_seed_recipe(r, flag)) {
      merged[key] = value;
      if (!saved.contains(key) || saved[key] != value) {
        log::info("resume: --" + flag + " " + value.dump() + " overrides the checkpoint's " +
                  (saved.contains(key) ? saved[key].dump() : std::string("(not recorded)")));
      }
    }
  }
  model::TrainConfig c = model::TrainConfig::from_json(merged.dump(), cli);
  c.profile_steps = cli.profile_steps;
  c.cuda_graph = cli.cuda_graph;
  c.overwrite = cli.overwrite;
  c.model = meta.model;
  if (r.count("attention-impl") || r.count("use-cuda-kernel")) {
    c.model.attention_impl = cli.model.attention_impl;
    if (cli.model.attention_impl != meta.model.attention_impl) {
      log::info("resume: attention implementation " + cli.model.attention_impl + " overrides the checkpoint's " +
                meta.model.attention_impl + " (same weights)");
    }
  }
  // The deterministic backward is a run-time choice like the implementation: --deterministic turns it
  // on for a run saved without it (a run saved with it keeps it).
  if (r.count("deterministic") && !c.model.deterministic) {
    c.model.deterministic = true;
    log::info("resume: --deterministic overrides the checkpoint's default backward (same weights)");
  }
  return c;
}

}  // namespace

int run_train(int argc, char** argv) {
  model::TrainConfig d;
  cxxopts::Options options("./train", "Train the byte-level GPT on enwik8 (or any byte corpus).\n"
                                      "Other subcommands: ./train sample | eval | bench (each with --help).");
  options.add_options("data")
      ("data", "corpus file, raw or .gz (get enwik8 with scripts/download_enwik8.sh)", cxxopts::value<std::string>()->default_value(d.data))
      ("split", "train,val,test bytes (K/M/G suffixes) or fractions", cxxopts::value<std::string>()->default_value(d.split))
      ("seq-len", "training sequence length", cxxopts::value<int64_t>()->default_value(std::to_string(d.seq_len)))
      ("batch", "sequences per micro-batch", cxxopts::value<int64_t>()->default_value(std::to_string(d.batch)))
      ("grad-accum", "micro-batches per optimiser step", cxxopts::value<int64_t>()->default_value(std::to_string(d.grad_accum)));
  options.add_options("model")
      ("dim", "model width", cxxopts::value<int64_t>()->default_value("512"))
      ("depth", "transformer blocks", cxxopts::value<int64_t>()->default_value("8"))
      ("heads", "attention heads", cxxopts::value<int64_t>()->default_value("8"))
      ("dim-head", "head dimension", cxxopts::value<int64_t>()->default_value("64"))
      ("max-seq-len", "context of the model: learned positions, sampling window (default: --seq-len)", cxxopts::value<int64_t>())
      ("pos", "positions: rope (rotary, q and k rotated after their l2norm) | learned | none", cxxopts::value<std::string>()->default_value("rope"))
      ("rope-base", "rotary base: pair m of a group of gs features turns by position * base^(-2m/gs)", cxxopts::value<double>()->default_value("10000"))
      ("attn-scale", "cosine-sim attention scale", cxxopts::value<double>()->default_value("10"))
      ("l2norm-groups", "groups of the q/k l2norm", cxxopts::value<int64_t>()->default_value("1"))
      ("attention", "cosine | exp (unnormalised exp(scale q.k) on l2-normalised q, k) | softmax | fastmax", cxxopts::value<std::string>()->default_value("cosine"))
      ("attention-impl", "plain | sdpa | tiled", cxxopts::value<std::string>()->default_value("plain"))
      ("use-cuda-kernel", "use the fused CUDA attention kernel")
      ("deterministic", "bit-identical training from run to run on one GPU model: the fused attention backward sums dq in an order-independent way (on Hopper: each part rounded to a per-row grid where float32 adds are exact; elsewhere: a fixed order) and dbias per head (costs some backward speed: ./train bench --deterministic); our other kernels of the step are repeatable already, and libtorch's (the composite ops of FLASHCOS_FUSED_OPS=0, --attention-impl sdpa) run in libtorch's deterministic mode, with CUBLAS_WORKSPACE_CONFIG=:4096:8 set when unset")
      ("fastmax-p", "fastmax polynomial order (1 or 2)", cxxopts::value<int64_t>()->default_value("2"));
  options.add_options("optimisation")
      ("steps", "total optimiser steps", cxxopts::value<int64_t>()->default_value(std::to_string(d.steps)))
      ("lr", "peak learning rate", cxxopts::value<double>()->default_value("3e-3"))
      ("warmup", "linear warmup steps", cxxopts::value<int64_t>()->default_value(std::to_string(d.warmup)))
      ("schedule", "constant | cosine", cxxopts::value<std::string>()->default_value(d.schedule))
      ("min-lr-ratio", "cosine schedule floor, as a fraction of --lr", cxxopts::value<double>()->default_value("0.1"))
      ("seed-recipe", "the seed's recipe instead of the default: lr 2e-4, constant, no warmup, Adam betas 0.9, 0.999 (an explicit --lr, --warmup, --schedule or --adam-beta2 still wins)")
      ("weight-decay", "AdamW weight decay (0: Adam)", cxxopts::value<double>()->default_value("0"))
      ("adam-beta1", "Adam(W) first-moment decay", cxxopts::value<double>()->default_value(strf("%g", d.adam_beta1)))
      ("adam-beta2", "Adam(W) second-moment decay", cxxopts::value<double>()->default_value(strf("%g", d.adam_beta2)))
      ("clip-grad", "gradient norm clip (0: off)", cxxopts::value<double>()->default_value("0.5"))
      ("precision", "auto | bf16 | fp16 | fp32 (auto: bf16 on CUDA, fp32 on CPU)", cxxopts::value<std::string>()->default_value("auto"))
      ("seed", "random seed", cxxopts::value<uint64_t>()->default_value("42"))
      ("device", "auto | cuda | cpu", cxxopts::value<std::string>()->default_value("auto"));
  // Data parallel: read only when RANK/WORLD_SIZE (scripts/launch.sh, torchrun) or SLURM_* say so.
  options.add_options("several GPUs (scripts/launch.sh --nproc N ./train ..., or srun)")
      ("dist-backend", "nccl | gloo | auto (nccl on CUDA, gloo on CPU)", cxxopts::value<std::string>()->default_value(d.dist_backend))
      ("dist-timeout", "seconds a collective may take before the job fails, naming the rank", cxxopts::value<int64_t>()->default_value(std::to_string(d.dist_timeout_s)));
  options.add_options("monitoring")
      ("validate-every", "steps between validations", cxxopts::value<int64_t>()->default_value("100"))
      ("val-windows", "fixed validation windows per validation", cxxopts::value<int64_t>()->default_value("16"))
      ("generate-every", "steps between samples (0: never)", cxxopts::value<int64_t>()->default_value("500"))
      ("generate-length", "bytes per sample", cxxopts::value<int64_t>()->default_value("512"))
      ("save-every", "steps between checkpoints", cxxopts::value<int64_t>()->default_value("500"))
      ("log-every", "steps between progress lines / metrics records", cxxopts::value<int64_t>()->default_value("10"))
      ("checkpoint-dir", "folder of runs", cxxopts::value<std::string>()->default_value(d.checkpoint_dir))
      ("run", "run name (default run-<date>-<time>)", cxxopts::value<std::string>())
      ("resume", "continue from a checkpoint file or run folder: its saved options are restored, options given here override them", cxxopts::value<std::string>())
      ("overwrite", "reuse an existing --run folder, replacing its checkpoint and metrics")
      ("profile-steps", "record GPU time per kernel over N steps (after 2 warm-up steps), print it and save profile.json in the run folder", cxxopts::value<int64_t>()->default_value("0"))
      ("cuda-graph", "auto | on | off: after the first step, replay each micro-step (forward + backward) from one CUDA graph; auto: on with CUDA and bf16 / fp32 (not with fp16's loss scaling; with several GPUs every micro-step but each step's last, which all-reduces, and none with --grad-accum 1)", cxxopts::value<std::string>()->default_value("auto"))
      ("log-level", "trace | debug | info | warn | error", cxxopts::value<std::string>()->default_value("info"))
      ("h,help", "print this help");

  cxxopts::ParseResult r;
  int code = 0;
  if (!parse_or_exit(options, argc, argv, r, code)) return code;

  return run_guarded([&] {
    log::init(r["log-level"].as<std::string>());
    model::TrainConfig c;
    c.data = r["data"].as<std::string>();
    c.split = r["split"].as<std::string>();
    c.seq_len = r["seq-len"].as<int64_t>();
    if (c.seq_len < 1) throw std::invalid_argument("--seq-len must be >= 1, got " + std::to_string(c.seq_len));
    c.batch = r["batch"].as<int64_t>();
    c.grad_accum = r["grad-accum"].as<int64_t>();
    c.steps = r["steps"].as<int64_t>();
    c.lr = r["lr"].as<double>();
    c.warmup = r["warmup"].as<int64_t>();
    c.schedule = r["schedule"].as<std::string>();
    c.min_lr_ratio = r["min-lr-ratio"].as<double>();
    c.adam_beta2 = r["adam-beta2"].as<double>();
    if (r.count("seed-recipe")) {  // kSeedRecipeFlags
      if (!r.count("lr")) c.lr = 2e-4;
      if (!r.count("warmup")) c.warmup = 0;
      if (!r.count("schedule")) c.schedule = "constant";
      if (!r.count("adam-beta2")) c.adam_beta2 = 0.999;
    }
    c.weight_decay = r["weight-decay"].as<double>();
    c.adam_beta1 = r["adam-beta1"].as<double>();
    c.clip_grad = r["clip-grad"].as<double>();
    c.precision = r["precision"].as<std::string>();
    c.seed = r["seed"].as<uint64_t>();
    c.device = r["device"].as<std::string>();
    c.dist_backend = r["dist-backend"].as<std::string>();
    if (c.dist_backend != "nccl" && c.dist_backend != "gloo" && c.dist_backend != "auto") {
      throw std::invalid_argument("--dist-backend must be nccl, gloo or auto, got '" + c.dist_backend + "'");
    }
    c.dist_timeout_s = r["dist-timeout"].as<int64_t>();
    if (c.dist_timeout_s < 1) throw std::invalid_argument("--dist-timeout must be >= 1 second, got " + std::to_string(c.dist_timeout_s));
    c.validate_every = r["validate-every"].as<int64_t>();
    c.val_windows = r["val-windows"].as<int64_t>();
    c.generate_every = r["generate-every"].as<int64_t>();
    c.generate_length = r["generate-length"].as<int64_t>();
    c.save_every = r["save-every"].as<int64_t>();
    c.log_every = r["log-every"].as<int64_t>();
    c.checkpoint_dir = r["checkpoint-dir"].as<std::string>();
    c.profile_steps = r["profile-steps"].as<int64_t>();
    c.cuda_graph = r["cuda-graph"].as<std::string>();
    if (c.profile_steps < 0) throw std::invalid_argument("--profile-steps must be >= 0, got " + std::to_string(c.profile_steps));
    if (r.count("run")) c.run = r["run"].as<std::string>();
    if (r.count("resume")) {
      c.resume = r["resume"].as<std::string>();
      if (c.resume.empty()) throw std::invalid_argument("--resume needs a checkpoint file or run folder, got an empty string");
    }
    c.overwrite = r.count("overwrite") > 0;

    auto& m = c.model;
    m.dim = r["dim"].as<int64_t>();
    m.depth = r["depth"].as<int64_t>();
    m.heads = r["heads"].as<int64_t>();
    m.dim_head = r["dim-head"].as<int64_t>();
    m.max_seq_len = r.count("max-seq-len") ? r["max-seq-len"].as<int64_t>() : c.seq_len;
    m.attn_scale = r["attn-scale"].as<double>();
    m.l2norm_groups = r["l2norm-groups"].as<int64_t>();
    m.attention = r["attention"].as<std::string>();
    m.attention_impl = r["attention-impl"].as<std::string>();
    if (r.count("use-cuda-kernel")) {
      if (r.count("attention-impl") && m.attention_impl != "fused") {
        throw std::invalid_argument("--use-cuda-kernel and --attention-impl " + m.attention_impl +
                                    " contradict each other: pick one");
      }
      m.attention_impl = "fused";
    }
    m.fastmax_p = r["fastmax-p"].as<int64_t>();
    m.pos = r["pos"].as<std::string>();
    m.rope_base = r["rope-base"].as<double>();
    m.deterministic = r.count("deterministic") > 0;
    m.validate();

    if (!c.resume.empty()) c = resolve_resume(c, r);
    model::validate_train_config(c);
    return model::train(c);
  });
}

}  // namespace flashcos::app
