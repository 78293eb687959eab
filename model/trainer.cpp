// The training loop. Per optimiser step: grad_accum micro-batches of random crops (pinned,
// copied non-blocking), autocast forward, backward, clip, Adam(W) step, LR schedule. Every
// validate_every steps: loss on fixed validation windows; every generate_every: a sample.
// Checkpoints are atomic (model/checkpoint.h); a failed save (full disk) is logged and retried at
// the next save, never fatal. The first Ctrl-C / SIGTERM / SIGHUP finishes the step and saves.
#include "model/trainer.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <unistd.h>

#include "common/log.h"
#include "data/corpus.h"
#include "model/checkpoint.h"
#include "model/determinism.h"
#include "model/device.h"
#include "model/distributed.h"
#include "model/fused/grad_accumulate.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "model/loss_scaler.h"
#include "model/autocast.h"
#include "model/optim.h"
#include "model/profile.h"
#include "model/run_dir.h"
#include "model/train_graph.h"
#include "model/train_report.h"

namespace flashcos::model {
namespace fs = std::filesystem;

namespace {

constexpr double kLn2 = 0.69314718055994530942;

std::atomic<int> g_interrupts{0};
std::atomic<int> g_stop_signal{0};  // the first SIGINT / SIGTERM / SIGHUP received
extern "C" void on_stop_signal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);
  if (g_interrupts.fetch_add(1) >= 1) {  // a second signal: leave at once, without a half-written .tmp
    remove_checkpoint_tmp_in_progress();
    std::_Exit(128 + sig);
  }
}

// A loss above kExplodingLoss for kExplodingSteps steps in a row (finite, so the NaN check does
// not fire) is worth a warning. Tracked on the device: no host sync per step.
constexpr double kExplodingLoss = 1e4;
constexpr int64_t kExplodingSteps = 10;

struct Precision {
  bool autocast = false;
  at::ScalarType dtype = at::kFloat;
  bool loss_scaling = false;
  std::string name;
};

Precision resolve_precision(const std::string& p, const c10::Device& device) {
  std::string name = p == "auto" ? (device.is_cuda() ? "bf16" : "fp32") : p;
  if (name == "fp32") return {false, at::kFloat, false, name};
  if (name == "bf16") return {true, at::kBFloat16, false, name};
  if (name == "fp16") {
    if (!device.is_cuda()) throw std::invalid_argument("--precision fp16 needs a CUDA device (use bf16 or fp32)");
    return {true, at::kHalf, true, name};
  }
  throw std::invalid_argument("--precision must be auto, bf16, fp16 or fp32, got '" + p + "'");
}

double lr_at(const TrainConfig& cfg, int64_t step) {
  if (cfg.warmup > 0 && step < cfg.warmup) return cfg.lr * static_cast<double>(step + 1) / cfg.warmup;
  if (cfg.schedule == "cosine") {
    const double span = std::max<int64_t>(1, cfg.steps - cfg.warmup);
    const double t = std::min(1.0, static_cast<double>(step - cfg.warmup) / span);
    const double min_lr = cfg.lr * cfg.min_lr_ratio;
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1.0 + std::cos(M_PI * t));
  }
  return cfg.lr;
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

// The training run itself; dp is null for a single process (no distributed code on the path).
int train_process(TrainConfig cfg, DataParallel* dp) {
  validate_train_config(cfg);
  const c10::Device device = dp ? dp->device() : resolve_device(cfg.device);
  const bool main_rank = !dp || dp->is_main();  // [dp] only rank 0 logs, writes metrics, saves
  const int64_t world = dp ? dp->world_size() : 1;
  const Precision precision = resolve_precision(cfg.precision, device);
  if (cfg.model.attention_impl == "fused") {
    const std::string why = fused_attention_unavailable(device);
    if (!why.empty()) throw std::invalid_argument("--use-cuda-kernel (--attention-impl fused): " + why);
  }
  torch::manual_seed(cfg.seed);

  // ---- resume: model config, step, sampler and scaler state come from the checkpoint ----
  CheckpointMeta meta;
  std::string resume_path;
  if (!cfg.resume.empty()) {
    resume_path = resolve_checkpoint_path(cfg.resume);
    meta = read_checkpoint_meta(resume_path);
    if (cfg.steps <= meta.state.step) {
      throw std::invalid_argument(strf("--steps %lld: the checkpoint is at step %lld already; pass a larger --steps to "
                                       "train on", static_cast<long long>(cfg.steps),
                                       static_cast<long long>(meta.state.step)));
    }
    // The run-time fields a resume may change (app/train.cpp resolve_resume): the implementation
    // and the deterministic backward.
    const std::string impl = cfg.model.attention_impl;
    const bool deterministic = cfg.model.deterministic;
    cfg.model = meta.model;
    cfg.model.attention_impl = impl;
    cfg.model.deterministic = deterministic;
    if (cfg.run.empty()) {  // continue in the checkpoint's own run folder (also for a bare file name)
      const fs::path folder = fs::absolute(resume_path).parent_path();
      cfg.run = folder.filename().string();
      cfg.checkpoint_dir = folder.parent_path().empty() ? "." : folder.parent_path().string();
    }
    validate_train_config(cfg);
  }
  // A model whose float32 weights, gradients and Adam moments alone (16 bytes a parameter, counted
  // from a lower bound of its parameters) pass the device's whole memory cannot train: say so now,
  // instead of allocating until the allocator fails (or the OS stops the process).
  {
    const double params = cfg.model.parameters_at_least(), need = 16.0 * params, have = total_memory_bytes(device);
    if (have > 0 && need > have) {
      throw std::invalid_argument(strf(
          "the model (--dim %lld, --depth %lld, --heads %lld x --dim-head %lld) has at least %.3g parameters, whose "
          "weights, gradients and Adam state alone need %.1f GiB, more than the %.1f GiB of %s: use a smaller model",
          static_cast<long long>(cfg.model.dim), static_cast<long long>(cfg.model.depth),
          static_cast<long long>(cfg.model.heads), static_cast<long long>(cfg.model.dim_head), params,
          need / 1073741824.0, have / 1073741824.0, device_description(device).c_str()));
    }
  }
  // --deterministic: libtorch's kernels too (model/determinism.h), before the first cuBLAS call, so
  // that the composite ops and --attention-impl sdpa repeat themselves like the fused step.
  std::optional<DeterministicAlgorithms> deterministic_algorithms;
  if (cfg.model.deterministic) deterministic_algorithms.emplace();
  // The run folder is checked now and created only once data and model are ready, so a failed
  // start leaves no empty folder behind.
  const bool default_name = cfg.run.empty();
  if (default_name) cfg.run = default_run_name();
  fs::path run_dir = fs::path(cfg.checkpoint_dir) / cfg.run;
  std::error_code same_ec;
  const bool resuming_here = !resume_path.empty() && fs::exists(run_dir) &&
                             fs::equivalent(fs::absolute(resume_path).parent_path(), run_dir, same_ec);
  if (!default_name && fs::exists(run_dir) && !resuming_here && !cfg.overwrite) {
    std::error_code ec;
    if (fs::exists(run_dir / "latest.pt", ec)) {
      throw std::invalid_argument("run folder '" + run_dir.string() + "' already exists: continue it with --resume " +
                                  run_dir.string() + ", replace its files with --overwrite, or pick another --run");
    }
    throw std::invalid_argument("run folder '" + run_dir.string() + "' already exists and holds no checkpoint (a run "
                                "that stopped before its first save?): replace its files with --overwrite, or pick "
                                "another --run");
  }

  // ---- data ----
  cfg.data = data::resolve_corpus_path(cfg.data);
  auto corpus = data::load_corpus(cfg.data, data::parse_split(cfg.split), cfg.seq_len + 1);
  // [dp] Every rank draws the same global batch of batch x world windows from one generator (same
  // seed) and keeps rows [rank * batch, (rank + 1) * batch): distinct windows per rank, and exactly
  // the windows of a single process run with --batch batch x world (checkpoints move between
  // world sizes with the sampler state unchanged).
  data::BatchSampler sampler(corpus.train, cfg.seq_len, cfg.batch * world, cfg.seed);
  auto val_windows = data::fixed_windows(corpus.val, cfg.seq_len, cfg.val_windows);

  // ---- model + optimiser ----
  GPT model(cfg.model);
  model->to(device);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  const std::tuple<double, double> betas{cfg.adam_beta1, cfg.adam_beta2};
  if (cfg.weight_decay > 0) {
    optimizer = std::make_unique<FusedAdamW>(
        model->parameters(), torch::optim::AdamWOptions(cfg.lr).betas(betas).weight_decay(cfg.weight_decay));
  } else {
    optimizer = std::make_unique<FusedAdam>(model->parameters(), torch::optim::AdamOptions(cfg.lr).betas(betas));
  }
  TrainState state;
  state.loss_scale = precision.loss_scaling ? 65536.0 : 1.0;
  if (!resume_path.empty()) {
    load_checkpoint(resume_path, model, optimizer.get(), device);
    // The optimiser's saved options came back with its state: the run's (resolved) betas and weight
    // decay win (a --weight-decay given on --resume, or 0 for Adam, whose decay would be L2).
    for (auto& group : optimizer->param_groups()) {
      if (cfg.weight_decay > 0) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).betas(betas).weight_decay(cfg.weight_decay);
      } else {
        static_cast<torch::optim::AdamOptions&>(group.options()).betas(betas).weight_decay(0);
      }
    }
    state = meta.state;
    sampler.load_state(state.sampler_state);
  }
  // --cuda-graph (train_graph.h): from this run's second step on, every micro-step replays one
  // captured graph ([dp] only the micro-steps before each step's last, which all-reduces). auto
  // leaves it off quietly where it does not apply; on says why. The graph's stream is made current
  // here, before the data-parallel Reducer makes the parameters' gradient accumulators: they keep
  // the stream they were made on, and one made on another stream breaks the capture.
  const std::string graph_off =
      train_graph_off_reason(cfg.cuda_graph, device, dp != nullptr && cfg.grad_accum == 1, precision.loss_scaling);
  std::unique_ptr<GraphStreamScope> graph_stream;
  if (graph_off.empty()) graph_stream = std::make_unique<GraphStreamScope>(device);
  if (dp) {
    // [dp] rank 0's weights everywhere (a resumed optimiser state is the same file on every rank),
    // then gradient averaging.
    std::vector<at::Tensor> sync = model->parameters();
    for (const auto& t : model->buffers()) sync.push_back(t);
    dp->broadcast_from_main(sync);
    dp->attach_reducer(model->parameters());
  }

  // ---- the run folder (claimed now: every check above has passed) ----
  if (main_rank) {  // [dp] only rank 0 writes
    run_dir = claim_run_dir(cfg.checkpoint_dir, cfg.run, default_name);
    if (cfg.overwrite && !resuming_here) {
      for (const char* f : kRunFiles) fs::remove(run_dir / f);
    }
  }
  const std::string ckpt_path = (run_dir / "latest.pt").string();
  state.train_config_json = cfg.to_json();

  // ---- start-up table ----
  const int64_t tokens_per_step = cfg.batch * cfg.grad_accum * world * cfg.seq_len;
  if (main_rank) {
    RunStart start;
    start.device = device_description(device);
    start.precision = precision.name;
    start.train_bytes = corpus.train.numel();
    start.val_bytes = corpus.val.numel();
    start.test_bytes = corpus.test.numel();
    if (dp) {
      start.parallel = dp->describe();
      start.comm = dp->backend_settings();
    }
    start.world = world;
    start.tokens_per_step = tokens_per_step;
    start.resumed_at = resume_path.empty() ? -1 : state.step;
    start.determinism = deterministic_algorithms.has_value();
    start.run_dir = run_dir.string();
    log_run_start(cfg, start);
  }

  // [dp] ranks other than 0 write nothing: no metrics file, no config, no checkpoints.
  std::unique_ptr<MetricsLog> metrics_file;
  if (main_rank) metrics_file = std::make_unique<MetricsLog>((run_dir / "metrics.jsonl").string());
  auto write_metrics = [&](const nlohmann::json& record) {
    if (metrics_file) metrics_file->write(record.dump());
  };
  if (main_rank) write_run_config(run_dir, cfg);

  // A failed save (full disk, quota, file-size limit) is logged and retried at the next save;
  // the previous checkpoint stays in place (the write goes to a .tmp that is removed).
  auto save = [&](const char* why) {
    if (!main_rank) return true;
    try {
      save_checkpoint(ckpt_path, model, optimizer.get(), cfg.model, state);
    } catch (const std::exception& e) {
      log::error(strf("could not save the checkpoint at step %lld: %s; %s in '%s'. The previous checkpoint (if any) "
                      "is kept; training goes on and the next save tries again.",
                      static_cast<long long>(state.step), e.what(), free_space(run_dir).c_str(),
                      run_dir.string().c_str()));
      return false;
    }
    log::info(strf("saved %s at step %lld (%s)", ckpt_path.c_str(), static_cast<long long>(state.step), why));
    return true;
  };

  auto evaluate_val = [&]() {
    torch::NoGradGuard no_grad;
    model->eval();
    double total = 0;
    int64_t count = 0;
    // [dp] rank r takes a contiguous 1/world share of the windows; sums and counts are reduced.
    const int64_t n = val_windows.size(0);
    const int64_t rank = dp ? dp->rank() : 0;
    const int64_t lo = n * rank / world, hi = n * (rank + 1) / world;
    for (int64_t i = lo; i < hi; i += cfg.batch) {
      auto w = val_windows.slice(0, i, std::min(hi, i + cfg.batch)).to(device);
      AutocastScope autocast(precision.autocast, device.type(), precision.dtype);
      total += model->loss(w).item<double>() * w.size(0);
      count += w.size(0);
    }
    model->train();
    if (dp) {
      auto sums = torch::tensor({total, static_cast<double>(count)}, torch::TensorOptions().dtype(at::kDouble))
                      .to(device);
      dp->all_reduce_sum(sums);
      sums = sums.cpu();
      total = sums[0].item<double>();
      count = static_cast<int64_t>(sums[1].item<double>());
    }
    return total / std::max<int64_t>(1, count);
  };

  auto sample_text = [&]() {
    auto start = val_windows[static_cast<int64_t>(state.step / std::max<int64_t>(1, cfg.generate_every)) %
                             val_windows.size(0)];
    auto prime = start.slice(0, 0, std::min<int64_t>(128, cfg.seq_len)).unsqueeze(0).to(device);
    SampleOptions so;
    so.length = std::min(cfg.generate_length, cfg.model.max_seq_len);
    so.seed = cfg.seed + static_cast<uint64_t>(state.step);
    AutocastScope autocast(precision.autocast, device.type(), precision.dtype);
    auto out = generate(model, prime, so);
    std::printf("\n---- prime ----\n%s\n---- sample (step %lld) ----\n%s\n-----------------\n",
                data::decode_bytes(prime.cpu()).c_str(), static_cast<long long>(state.step),
                data::decode_bytes(out).c_str());
    std::fflush(stdout);
  };

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGHUP, on_stop_signal);
  std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit then fails the write (EFBIG) instead of killing us
  const bool tty = isatty(fileno(stderr));
  if (cfg.cuda_graph == "on" && !graph_off.empty()) log::warn("--cuda-graph on: not used: " + graph_off);
  // One micro-batch's loss over grad_accum, under autocast where the precision asks for it (the
  // eager micro-step and the captured one).
  auto micro_loss = [&](const at::Tensor& window) {
    AutocastScope autocast(precision.autocast, device.type(), precision.dtype);
    return model->loss(window) / static_cast<double>(cfg.grad_accum);
  };
  std::unique_ptr<TrainStepGraph> graph_step;
  if (graph_off.empty()) {
    graph_step = std::make_unique<TrainStepGraph>([&](const at::Tensor& window) {
      const at::Tensor loss = micro_loss(window);
      loss.backward();
      return loss.detach();
    });
  }
  if (main_rank) {
    log::info(!graph_step ? "  cuda graph  off (" + graph_off + ")"
              : dp        ? "  cuda graph  on: micro-steps before each step's last (which all-reduces) replayed from one "
                            "CUDA graph after the first step"
                          : "  cuda graph  on: micro-steps replayed from one CUDA graph after the first step");
  }
  model->train();
  reset_peak_memory(device);
  auto params = model->parameters();
  auto last_log = std::chrono::steady_clock::now();
  int64_t steps_since_log = 0;
  at::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
  // The gradients' joint norm before clipping, summed over the steps since the last log line.
  at::Tensor norm_sum = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t norm_steps = 0;
  int64_t skipped = 0;
  at::Tensor exploding_streak = torch::zeros({}, torch::TensorOptions().device(device));
  bool warned_exploding = false;
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t first_step = state.step;

  // --profile-steps: steps [first_step + 2, first_step + 2 + profile_steps) are recorded.
  const int64_t profile_begin = first_step + 2, profile_end = profile_begin + cfg.profile_steps;
  if (cfg.profile_steps > 0 && profile_end > cfg.steps) {
    log::warn(strf("--profile-steps %lld needs --steps >= %lld (2 warm-up steps first); no profile this run",
                   static_cast<long long>(cfg.profile_steps), static_cast<long long>(profile_end)));
  }
  bool profiling = false;
  // Leaving the loop with the profiler on (Ctrl-C, an error) stops it without a report; left on, it
  // crashed the process's exit.
  struct ProfilerOff {
    const bool& on;
    ~ProfilerOff() {
      if (on) abandon_step_profile();
    }
  } profiler_off{profiling};

  while (state.step < cfg.steps) {
    if (cfg.profile_steps > 0 && main_rank && state.step == profile_begin && profile_end <= cfg.steps) {
      synchronize(device);
      start_step_profile();
      profiling = true;
    }
    const double lr = lr_at(cfg, state.step);
    set_lr(*optimizer, lr);
    // With the graph, grads are zeroed in place (the captured backward adds into their storage), by
    // one multi-tensor kernel instead of a fill per parameter.
    if (graph_step) {
      zero_grads_in_place(params);
    } else {
      drop_grads(params);  // not optimizer->zero_grad: its detach_() refuses .grad views (fused::linear's)
    }
    at::Tensor step_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
      auto batch = sampler.next();
      if (dp) batch = batch.slice(0, dp->rank() * cfg.batch, (dp->rank() + 1) * cfg.batch);
      // [dp] only the last micro-batch's backward averages gradients over ranks (no_sync before;
      // the Reducer's hooks then do nothing, and the fused operators may add into .grad themselves).
      const bool reduce_now = dp && micro == cfg.grad_accum - 1;
      std::optional<fused::IdleAccumulatorPostHooks> hooks_idle;
      if (dp && !reduce_now) hooks_idle.emplace();
      if (graph_step && state.step > first_step && !reduce_now) {
        try {
          step_loss += graph_step->run(batch);  // the first call captures
          continue;
        } catch (const std::exception& e) {
          log::warn(std::string("CUDA graph capture failed, training on without it: ") + e.what());
          graph_step.reset();
        }
      }
      batch = batch.to(device, /*non_blocking=*/true);
      if (reduce_now) dp->prepare_for_forward();
      const at::Tensor loss = micro_loss(batch);
      if (reduce_now) dp->prepare_for_backward(loss);
      (precision.loss_scaling ? loss * state.loss_scale : loss).backward();
      step_loss += loss.detach();
    }
    bool do_step = true;
    if (precision.loss_scaling) {
      // Dynamic loss scaling: unscale, skip the step and halve the scale on inf/NaN grads,
      // double it after 2000 clean steps.
      auto grads = defined_grads(params);
      if (!unscale_grads_and_update_scale(grads, state.loss_scale, state.scale_good_steps)) {
        do_step = false;
        ++skipped;
      }
    }
    if (do_step) {
      const at::Tensor norm = cfg.clip_grad > 0 ? clip_grad_norm(params, cfg.clip_grad) : grad_norm(params);
      if (norm.defined()) {
        norm_sum += norm;
        ++norm_steps;
      }
      optimizer->step();
      model->refresh_weight_copies();  // the captured micro-step reads them (GPTImpl)
    }
    state.sampler_state = sampler.state();
    ++state.step;
    if (profiling && state.step == profile_end) {
      profiling = false;
      synchronize(device);
      const std::string trace = (run_dir / "profile.json").string();
      if (tty) std::fprintf(stderr, "\n");
      std::printf("%s", stop_step_profile(cfg.profile_steps, trace).c_str());
      std::fflush(stdout);
      log::info("profile trace (chrome://tracing, Perfetto): " + trace);
    }
    ++steps_since_log;
    loss_sum += step_loss;
    exploding_streak = (exploding_streak + 1) * (step_loss > kExplodingLoss);

    const bool log_now = state.step % cfg.log_every == 0 || state.step == cfg.steps;
    // [dp] the loss is averaged over ranks and Ctrl-C / SIGTERM agreed on at logging steps (which
    // synchronise anyway), so all ranks diverge, stop and save after the same step.
    bool dp_stop = false;
    if (dp && log_now) {
      auto both = torch::stack({loss_sum.to(at::kFloat) / static_cast<double>(world),
                                torch::full({}, g_interrupts.load() > 0 ? 1.0 : 0.0, loss_sum.options().dtype(at::kFloat))});
      dp->all_reduce_sum(both);
      loss_sum.copy_(both[0]);
      dp_stop = both[1].item<float>() > 0;
    }
    if (log_now) {
      const double loss = loss_sum.item<double>() / steps_since_log;
      if (!std::isfinite(loss) && !precision.loss_scaling) {
        log::error(strf("loss is %f at step %lld: the run diverged; not saving (last good checkpoint kept). "
                        "Try a lower --lr or --precision fp32.", loss, static_cast<long long>(state.step)));
        return kExitDiverged;
      }
      if (exploding_streak.item<double>() >= kExplodingSteps) {
        if (!warned_exploding) {
          log::warn(strf("loss above %g for %lld steps in a row (now %.4g at step %lld): the run is blowing up; "
                         "try a lower --lr, a warmup or a smaller --clip-grad",
                         kExplodingLoss, static_cast<long long>(kExplodingSteps), loss, static_cast<long long>(state.step)));
        }
        warned_exploding = true;
      } else {
        warned_exploding = false;
      }
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - last_log).count();
      const double tok_s = static_cast<double>(steps_since_log * tokens_per_step) / std::max(dt, 1e-9);
      const double elapsed = std::chrono::duration<double>(now - t_start).count();
      const double eta = elapsed / (state.step - first_step) * (cfg.steps - state.step);
      const double mem = peak_memory_gib(device);
      const double norm = norm_steps > 0 ? norm_sum.item<double>() / norm_steps : 0.0;
      std::string line = strf("step %lld/%lld | loss %.4f | bpc %.4f | lr %.2e", static_cast<long long>(state.step),
                              static_cast<long long>(cfg.steps), loss, loss / kLn2, lr);
      if (norm_steps > 0) line += strf(" | grad norm %.3f", norm);
      line += strf(" | %.1fk tok/s | ETA %s", tok_s / 1e3, format_duration(eta).c_str());
      if (device.is_cuda()) line += strf(" | peak mem %.2f GiB", mem);
      if (precision.loss_scaling) line += strf(" | scale %.0f (%lld skipped)", state.loss_scale, static_cast<long long>(skipped));
      if (!main_rank) {
      } else if (tty) {
        std::fprintf(stderr, "\r\033[K%s", line.c_str());
        std::fflush(stderr);
      } else {
        log::info(line);
      }
      nlohmann::json record = {{"event", "train"}, {"step", state.step}, {"loss", loss}, {"bpc", loss / kLn2},
                               {"lr", lr}, {"tok_per_s", tok_s}, {"peak_mem_gib", mem}, {"time_s", elapsed}};
      if (norm_steps > 0) record["grad_norm"] = norm;  // mean over the steps since the last record
      write_metrics(record);
      loss_sum.zero_();
      norm_sum.zero_();
      norm_steps = 0;
      steps_since_log = 0;
      last_log = std::chrono::steady_clock::now();
    }
    const bool interrupted = dp ? dp_stop : g_interrupts.load() > 0;
    if (state.step % cfg.validate_every == 0 || state.step == cfg.steps) {
      const double val = evaluate_val();
      if (main_rank) {
      if (tty) std::fprintf(stderr, "\n");
      log::info(strf("step %lld validation: loss %.4f nats, %.4f bpc (%lld windows of %lld)",
                     static_cast<long long>(state.step), val, val / kLn2,
                     static_cast<long long>(val_windows.size(0)), static_cast<long long>(cfg.seq_len)));
      }
      write_metrics({{"event", "val"}, {"step", state.step}, {"loss", val}, {"bpc", val / kLn2}});
    }
    if (cfg.generate_every > 0 && state.step % cfg.generate_every == 0 && !interrupted && main_rank) sample_text();
    bool saved = true;
    if (state.step % cfg.save_every == 0 || state.step == cfg.steps || interrupted) {
      saved = save(interrupted ? "interrupted" : state.step == cfg.steps ? "done" : "periodic");
    }
    if (interrupted) {
      const int sig = g_stop_signal.load();
      if (!saved) {
        log::error("stopped by signal " + std::to_string(sig) + " but the checkpoint could not be saved (see above)");
        return kExitSaveFailed;
      }
      // [dp] a rank stopped by the others' signal (sig 0) ends like a Ctrl-C.
      if (main_rank) {
        log::info(strf("stopped by %s: checkpoint saved, resume with --resume %s",
                       sig > 0 ? strsignal(sig) : "another rank's signal", ckpt_path.c_str()));
      }
      return sig == 0 || sig == SIGINT ? 0 : 128 + sig;
    }
    if (state.step == cfg.steps && !saved) {
      log::error("training finished but the final checkpoint could not be saved (see above)");
      return kExitSaveFailed;
    }
  }
  if (tty && main_rank) std::fprintf(stderr, "\n");
  if (main_rank) log::info(strf("done: %lld steps, peak memory %.2f GiB", static_cast<long long>(state.step), peak_memory_gib(device)));
  return 0;
}

}  // namespace

int train(TrainConfig cfg) {
  const auto env = detect_dist_env();
  if (!env) return train_process(std::move(cfg), nullptr);  // today's single-process trainer
  // [dp] one process of a data-parallel job (model/distributed.h).
  const c10::Device device = device_for_rank(resolve_device(cfg.device), *env);
  auto dp = DataParallel::create(*env, cfg.dist_backend, device, std::chrono::milliseconds(cfg.dist_timeout_s * 1000));
  if (!dp->is_main()) log::init("warn");  // progress, tables and saves come from rank 0
  try {
    return train_process(std::move(cfg), dp.get());
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    if (msg.rfind("rank ", 0) == 0) throw;  // already names the rank
    // Errors from the reducer's all-reduce surface from backward(): say what they usually mean.
    const bool comm = msg.find("Gloo") != std::string::npos || msg.find("NCCL") != std::string::npos ||
                      msg.find("onnection") != std::string::npos || msg.find("imed out") != std::string::npos;
    throw std::runtime_error(dp->rank_error(comm ? msg + " (a collective failed: another rank probably died, hangs "
                                                         "or was stopped; see its own error)"
                                                 : msg));
  }
}

}  // namespace flashcos::model
