// Model, checkpoint, trainer and CLI behaviour on the CPU: initial loss, overfitting, the
// attention implementations agreeing, checkpoint round trips and failures, exact --resume,
// seeded sampling, and clear CLI errors. Runs the built ./train for the end-to-end parts.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>

#include "model/checkpoint.h"
#include "model/fused/switch.h"
#include "model/gpt.h"
#include "tests/shell_util.h"

namespace fs = std::filesystem;
using flashcos::model::GPT;
using flashcos::model::ModelConfig;

namespace {

ModelConfig tiny_config(const std::string& impl = "plain") {
  ModelConfig c;
  c.dim = 32;
  c.depth = 1;
  c.heads = 2;
  c.dim_head = 16;
  c.max_seq_len = 64;
  c.attention_impl = impl;
  return c;
}

struct CmdResult {
  int code;
  std::string out;
};

CmdResult run_cmd(const std::string& cmd) {
  CmdResult r{-1, ""};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p)) r.out += buf.data();
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string train_bin() { return FLASHCOS_TRAIN_BIN; }

// A temp folder per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("flashcos_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    remove_tree();
    fs::create_directories(path_);
  }
  // Not fs::remove_all: tests/shell_util.h says why.
  ~TempDir() { remove_tree(); }
  void remove_tree() const { test_shell::remove_tree(path_.string()); }
  std::string str(const std::string& name = "") const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// 200 KB of pseudo-text whose statistics a tiny model can learn a little of.
std::string write_corpus(const TempDir& dir) {
  const std::string path = dir.str("corpus.txt");
  std::ofstream out(path, std::ios::binary);
  std::mt19937 gen(7);
  const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "dog ", "ran ", "far. "};
  size_t n = 0;
  while (n < 200000) {
    const char* w = words[gen() % 10];
    out << w;
    n += std::strlen(w);
  }
  return path;
}

std::vector<std::string> train_losses(const std::string& metrics_path) {
  std::vector<std::string> losses;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"event\":\"train\"") == std::string::npos) continue;
    const auto a = line.find("\"loss\":");
    losses.push_back(line.substr(a, line.find(',', a) - a));
  }
  return losses;
}

}  // namespace

TEST(Model, InitialLossIsNearLn256) {
  torch::manual_seed(1);
  GPT model(tiny_config());
  auto window = torch::randint(0, 256, {8, 65}, torch::kLong);
  const double loss = model->loss(window).item<double>();
  EXPECT_NEAR(loss, std::log(256.0), 0.05);
}

TEST(Model, OverfitsATinyText) {
  torch::manual_seed(2);
  GPT model(tiny_config());
  std::string text;
  while (text.size() < 65) text += "hello world ";
  auto window = torch::from_blob(text.data(), {1, 65}, torch::kUInt8).to(torch::kLong).repeat({4, 1});
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 80; ++step) {
    opt.zero_grad();
    auto loss = model->loss(window);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_GT(first, 5.0);
  EXPECT_LT(last, 0.5) << "a model that cannot memorise 65 bytes cannot learn";
}

TEST(Model, AttentionImplementationsAgree) {
  auto window = torch::randint(0, 256, {2, 40}, torch::kLong);
  torch::Tensor reference;
  for (const std::string impl : {"plain", "tiled", "sdpa"}) {
    torch::manual_seed(3);
    GPT model(tiny_config(impl));
    model->to(torch::kDouble);
    auto logits = model->forward(window);
    if (!reference.defined()) {
      reference = logits;
      continue;
    }
    EXPECT_LT((logits - reference).abs().max().item<double>(), 1e-9) << impl;
  }
}

namespace {

// The textbook pre-LN stack rebuilt from a model's own submodules with torch ops: x + attn(norm(x)),
// x + ff_out(gelu(ff_in(norm(x)))) per block, then norm_out and to_logits: (B, T) -> (B, T, 256).
torch::Tensor pre_ln_logits(GPT& model, const torch::Tensor& tokens) {
  auto mods = model->named_modules("", /*include_self=*/false);
  auto norm = [&](const std::string& name, const torch::Tensor& x) {
    return mods[name]->as<torch::nn::LayerNorm>()->forward(x);
  };
  auto linear = [&](const std::string& name, const torch::Tensor& x) {
    return mods[name]->as<torch::nn::Linear>()->forward(x);
  };
  torch::Tensor x = mods["token_emb"]->as<torch::nn::Embedding>()->forward(tokens);
  for (int64_t i = 0; i < model->config().depth; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    x = x + mods[b + "attn"]->as<flashcos::model::Attention>()->forward(norm(b + "norm_attn", x));
    x = x + linear(b + "ff_out", torch::gelu(linear(b + "ff_in", norm(b + "norm_ff", x))));
  }
  return linear("to_logits", norm("norm_out", x));
}

// Adds N(0, 0.3^2) to every bias and LayerNorm weight / bias (the init zeroes the biases), so that
// a bias left out anywhere changes the logits.
void perturb_biases_and_norms(GPT& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    const std::string& k = p.key();
    const bool bias = k.size() >= 4 && k.compare(k.size() - 4, 4, "bias") == 0;
    if (bias || k.find("norm") != std::string::npos) p.value().add_(0.3 * torch::randn_like(p.value()));
  }
}

}  // namespace

namespace {

// A 3-block float64 model with random biases and norms, and a (2, 41) window of bytes.
std::pair<GPT, torch::Tensor> pre_ln_case(uint64_t seed) {
  torch::manual_seed(seed);
  auto cfg = tiny_config();
  cfg.depth = 3;
  GPT model(cfg);
  model->to(torch::kDouble);
  perturb_biases_and_norms(model);
  return {model, torch::randint(0, 256, {2, 41}, torch::kLong)};
}

}  // namespace

// The blocks hand their feed-forward output on unadded (model/gpt.h, Residual): the logits and the
// loss must still be those of the textbook pre-LN stack, with the last block's output added before
// norm_out.
TEST(Model, CarriedResidualIsThePreLnSum) {
  const auto c = pre_ln_case(4);
  GPT model = c.first;
  const torch::Tensor window = c.second;
  auto tokens = window.slice(1, 0, 40);
  const auto logits_ref = pre_ln_logits(model, tokens);
  const auto logits = model->forward(tokens);
  const double scale = logits_ref.abs().max().item<double>();
  EXPECT_LE((logits - logits_ref).abs().max().item<double>(), 1e-12 * scale);
  // GPT::loss takes the cross-entropy in float32 whatever the model's dtype.
  const auto loss_ref =
      torch::cross_entropy_loss(logits_ref.reshape({-1, 256}).to(torch::kFloat), window.slice(1, 1, 41).reshape({-1}));
  EXPECT_NEAR(model->loss(window).item<double>(), loss_ref.item<double>(), 1e-6);
}

// The loss and every parameter's gradient against the textbook pre-LN stack (float64, random
// biases and norms), on the composite path CPU training takes and with the fused structure the
// CUDA path takes (fused::FusedOpsOnCpuForTesting: the operators' libtorch-op paths): ff_in's bias
// inside fused::bias_gelu, ff_out's GEMM without its bias and the bias carried in Residual to the
// next add + LayerNorm, which adds it and sums its gradient. A bias dropped or a bias gradient lost
// on either path fails here.
TEST(Model, CarriedBiasesAndAllGradientsMatchThePreLnBlock) {
  const auto c = pre_ln_case(6);
  GPT model = c.first;
  const torch::Tensor window = c.second;
  auto tokens = window.slice(1, 0, 40);
  auto target = window.slice(1, 1, 41).reshape({-1});
  // The float64 cross entropy of the logits, and every parameter's gradient of it.
  auto run = [&](const std::function<torch::Tensor()>& logits) {
    model->zero_grad();
    auto loss = torch::cross_entropy_loss(logits().reshape({-1, 256}), target);
    loss.backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto ref = run([&] { return pre_ln_logits(model, tokens); });
  const auto names = model->named_parameters();
  for (const bool fused_structure : {false, true}) {
    SCOPED_TRACE(fused_structure ? "fused structure" : "composite path");
    std::optional<flashcos::model::fused::FusedOpsOnCpuForTesting> on;
    if (fused_structure) on.emplace();
    const auto got = run([&] { return model->forward(tokens); });
    EXPECT_NEAR(got.first, ref.first, 1e-12 * ref.first);
    for (size_t i = 0; i < ref.second.size(); ++i) {
      ASSERT_TRUE(got.second[i].defined()) << names[i].key() << " got no gradient";
      const double scale = ref.second[i].abs().max().item<double>();
      EXPECT_GT(scale, 0.0) << names[i].key();
      EXPECT_LE((got.second[i] - ref.second[i]).abs().max().item<double>(), 1e-10 * scale) << names[i].key();
    }
    // GPT::loss: float32 cross entropy on the composite path, float64 in the fused classifier's.
    const double loss = model->loss(window).item<double>();
    EXPECT_NEAR(loss, ref.first, fused_structure ? 1e-12 * ref.first : 1e-6 * (1 + ref.first));
  }
}

TEST(Checkpoint, RoundTripRestoresModelAndConfig) {
  TempDir dir;
  torch::manual_seed(4);
  auto cfg = tiny_config();
  cfg.attn_scale = 7.5;
  GPT model(cfg);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto window = torch::randint(0, 256, {2, 33}, torch::kLong);
  model->loss(window).backward();
  opt.step();
  flashcos::model::TrainState st;
  st.step = 17;
  st.sampler_state = "abc";
  const auto path = dir.str("run/latest.pt");
  flashcos::model::save_checkpoint(path, model, &opt, cfg, st);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  flashcos::model::CheckpointMeta meta;
  auto loaded = flashcos::model::load_model(path, torch::kCPU, &meta);
  EXPECT_EQ(meta.model.to_json(), cfg.to_json());
  EXPECT_EQ(meta.state.step, 17);
  EXPECT_EQ(meta.state.sampler_state, "abc");
  model->eval();
  EXPECT_TRUE(torch::equal(loaded->forward(window), model->forward(window)));
  // A folder resolves to its latest.pt.
  EXPECT_EQ(flashcos::model::resolve_checkpoint_path(dir.str("run")), path);
}

TEST(Checkpoint, CorruptMissingAndMismatchedFilesGiveClearErrors) {
  TempDir dir;
  torch::manual_seed(5);
  auto cfg = tiny_config();
  GPT model(cfg);
  const auto good = dir.str("good.pt");
  flashcos::model::save_checkpoint(good, model, nullptr, cfg, {});

  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { flashcos::model::read_checkpoint_meta(dir.str("nope.pt")); }, "does not exist");
  {
    std::ofstream(dir.str("junk.pt")) << "not a checkpoint";
    expect_error([&] { flashcos::model::read_checkpoint_meta(dir.str("junk.pt")); }, "corrupt");
  }
  {
    // Truncated copy of a real checkpoint.
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir.str("cut.pt"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    expect_error([&] { flashcos::model::read_checkpoint_meta(dir.str("cut.pt")); }, "corrupt");
  }
  {
    auto other = cfg;
    other.dim = 48;
    GPT wrong(other);
    expect_error([&] { flashcos::model::load_checkpoint(good, wrong, nullptr, torch::kCPU); }, "does not match");
  }
}

TEST(Checkpoint, NonFiniteModelIsNeverSavedAndOldFileIsKept) {
  TempDir dir;
  auto cfg = tiny_config();
  GPT model(cfg);
  const auto path = dir.str("latest.pt");
  flashcos::model::save_checkpoint(path, model, nullptr, cfg, {});
  const auto size_before = fs::file_size(path);
  {
    torch::NoGradGuard g;
    model->parameters()[0].view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  }
  EXPECT_THROW(flashcos::model::save_checkpoint(path, model, nullptr, cfg, {}), std::runtime_error);
  EXPECT_EQ(fs::file_size(path), size_before);
  EXPECT_NO_THROW(flashcos::model::read_checkpoint_meta(path));
}

TEST(TrainCli, ResumeReproducesTheUninterruptedLosses) {
  TempDir dir;
  const auto corpus = write_corpus(dir);
  const std::string common = train_bin() + " --device cpu --data " + corpus +
                             " --split 150K,25K,25K --dim 32 --depth 1 --heads 2 --dim-head 16 --seq-len 32"
                             " --batch 2 --grad-accum 2 --log-every 1 --validate-every 4 --val-windows 2"
                             " --generate-every 0 --save-every 4 --seed-recipe --checkpoint-dir " + dir.str("ck");
  auto full = run_cmd(common + " --steps 8 --run full");
  ASSERT_EQ(full.code, 0) << full.out;
  auto half = run_cmd(common + " --steps 4 --run part");
  ASSERT_EQ(half.code, 0) << half.out;
  auto rest = run_cmd(train_bin() + " --device cpu --data " + corpus + " --split 150K,25K,25K --seq-len 32 --batch 2"
                      " --grad-accum 2 --log-every 1 --validate-every 4 --val-windows 2 --generate-every 0"
                      " --save-every 4 --checkpoint-dir " + dir.str("ck") + " --steps 8 --resume " +
                      dir.str("ck/part/latest.pt"));
  ASSERT_EQ(rest.code, 0) << rest.out;
  const auto a = train_losses(dir.str("ck/full/metrics.jsonl"));
  const auto b = train_losses(dir.str("ck/part/metrics.jsonl"));
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;

  // Model flags that contradict the checkpoint are refused.
  auto clash = run_cmd(common + " --steps 9 --dim 64 --resume " + dir.str("ck/part/latest.pt"));
  EXPECT_EQ(clash.code, 2);
  EXPECT_NE(clash.out.find("--dim"), std::string::npos) << clash.out;

  // sample and eval work from the checkpoint alone, and a seed reproduces the text.
  const std::string sample = train_bin() + " sample --device cpu --checkpoint " + dir.str("ck/full") +
                             " --prime 'the cat' --length 40 --seed ";
  auto s1 = run_cmd(sample + "3");
  auto s2 = run_cmd(sample + "3");
  ASSERT_EQ(s1.code, 0) << s1.out;
  // sample ends with a timing line on stderr ("generated N bytes in S s (B bytes/s, ...)"): drop it.
  for (auto* s : {&s1, &s2}) {
    const auto at = s->out.find("generated 40 bytes in ");
    ASSERT_NE(at, std::string::npos) << s->out;
    s->out.erase(at, s->out.find('\n', at) + 1 - at);
  }
  EXPECT_EQ(s1.out, s2.out);
  EXPECT_EQ(s1.out.rfind("the cat", 0), 0u) << s1.out;
  EXPECT_GE(s1.out.size(), 47u);
  auto ev = run_cmd(train_bin() + " eval --device cpu --checkpoint " + dir.str("ck/full/latest.pt") +
                    " --max-windows 3");
  ASSERT_EQ(ev.code, 0) << ev.out;
  EXPECT_NE(ev.out.find("96 tokens in 3 windows of 32"), std::string::npos) << ev.out;
  EXPECT_NE(ev.out.find("bits/char"), std::string::npos) << ev.out;
}

TEST(TrainCli, BadInputGetsAClearError) {
  TempDir dir;
  struct Case {
    std::string args;
    int code;
    std::string needle;
  };
  const Case cases[] = {
      {"--seq-len 0", 2, "--seq-len"},
      {"--precision fp8", 2, "--precision"},
      {"--attention flash", 2, "--attention"},
      {"--device cpu --data " + dir.str("missing.txt"), 1, "download_enwik8"},
      {"--bogus-flag", 2, "bogus"},
      {"sample", 2, "--checkpoint"},
      {"sample --checkpoint " + dir.str("none.pt"), 1, "does not exist"},
      {"eval --checkpoint " + dir.str("none.pt"), 1, "does not exist"},
      {"frobnicate", 2, "unknown subcommand"},
      // A value that does not parse names its option and what the option takes.
      {"--batch abc", 2, "--batch 'abc': expected an integer"},
      {"--lr=fast", 2, "--lr 'fast': expected a number"},
      {"--run abc --seq-len abc", 2, "--seq-len 'abc': expected an integer"},
      {"sample --checkpoint x.pt --length 2k", 2, "--length '2k': expected an integer"},
      {"eval --checkpoint x.pt --max-windows many", 2, "--max-windows 'many'"},
      {"sample --checkpoint x.pt --seed -1", 2, "--seed '-1': expected an integer >= 0"},
      {"--batch 99999999999999999999", 2, "--batch '99999999999999999999': expected an integer in this option's range"},
  };
  for (const auto& c : cases) {
    auto r = run_cmd(train_bin() + " " + c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << "\n" << r.out;
  }
  for (const char* sub : {"", "sample", "eval", "bench"}) {
    auto r = run_cmd(train_bin() + " " + sub + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub << r.out;
  }
}
