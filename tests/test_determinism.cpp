// --deterministic beyond the fused attention (model/determinism.h): libtorch's deterministic mode is
// on while a DeterministicAlgorithms lives and restored after it, CUBLAS_WORKSPACE_CONFIG is set when
// unset and a value that rules out repeatable GEMMs is refused before any run folder exists, and a
// run in that mode (validation and samples included) repeats itself bit for bit: on the CPU, and on a
// GPU (skipped without one) for the fused step, the composite ops and --attention-impl sdpa, where no
// libtorch op of the step may throw for want of a deterministic implementation. At seq 8192 the same
// is docs/quality.md's run Q1.
#include "train_process_util.h"

#include <ATen/Context.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "model/determinism.h"

namespace {
using namespace train_test;
namespace fm = flashcos::model;

// Sets or unsets an environment variable for one scope, then puts the old value back.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1); else ::unsetenv(name);
  }
  ~EnvScope() {
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1); else ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

TEST(Determinism, CublasWorkspaceValues) {
  EXPECT_EQ(fm::cublas_workspace_problem(nullptr), "");
  EXPECT_EQ(fm::cublas_workspace_problem(":4096:8"), "");
  EXPECT_EQ(fm::cublas_workspace_problem(":16:8"), "");
  for (const char* bad : {"", ":0:0", ":4096:2", "4096:8"}) {
    const std::string why = fm::cublas_workspace_problem(bad);
    EXPECT_TRUE(contains(why, "CUBLAS_WORKSPACE_CONFIG")) << "'" << bad << "': " << why;
    EXPECT_TRUE(contains(why, ":4096:8")) << "'" << bad << "': " << why;
  }
}

TEST(Determinism, ScopeTurnsLibtorchDeterministicAndRestoresIt) {
  auto& ctx = at::globalContext();
  ASSERT_FALSE(ctx.deterministicAlgorithms()) << "another test left libtorch's deterministic mode on";
  const bool fill = ctx.deterministicFillUninitializedMemory(), benchmark = ctx.benchmarkCuDNN();
  {
    EnvScope unset("CUBLAS_WORKSPACE_CONFIG", nullptr);
    {
      fm::DeterministicAlgorithms on;
      EXPECT_TRUE(ctx.deterministicAlgorithms());
      EXPECT_FALSE(ctx.deterministicAlgorithmsWarnOnly());
      EXPECT_TRUE(ctx.deterministicCuDNN());
      EXPECT_FALSE(ctx.benchmarkCuDNN());
      EXPECT_FALSE(ctx.deterministicFillUninitializedMemory());
      ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
      EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), fm::kDeterministicCublasWorkspace);
    }
    EXPECT_FALSE(ctx.deterministicAlgorithms());
    EXPECT_EQ(ctx.deterministicFillUninitializedMemory(), fill);
    EXPECT_EQ(ctx.benchmarkCuDNN(), benchmark);
  }
  {
    EnvScope kept("CUBLAS_WORKSPACE_CONFIG", ":16:8");  // a good value is left as it is
    fm::DeterministicAlgorithms on;
    EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":16:8");
  }
  {
    EnvScope bad("CUBLAS_WORKSPACE_CONFIG", ":0:0");
    EXPECT_THROW(fm::DeterministicAlgorithms on, std::invalid_argument);
    EXPECT_FALSE(ctx.deterministicAlgorithms());
  }
}

TEST(TrainCli, DeterministicRefusesAnotherCublasWorkspace) {
  TempRun t;
  RunResult r = run_train(t.tiny("--steps 2 --deterministic"), "CUBLAS_WORKSPACE_CONFIG=:0:0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--deterministic")) << r.output;
  EXPECT_TRUE(contains(r.output, "CUBLAS_WORKSPACE_CONFIG is ':0:0'")) << r.output;
  EXPECT_EQ(t.run_count(), 0u) << r.output;
}

// Two runs of `opts` with --deterministic (env: a prefix such as FLASHCOS_FUSED_OPS=0) exit 0, validate
// twice and log the same losses and gradient norms, bit for bit, at each of their 4 steps.
void expect_repeats_itself(const TempRun& t, const std::string& opts, const std::string& env, const std::string& name) {
  const std::string all = opts + " --steps 4 --deterministic --validate-every 2 --generate-every 2 --generate-length 8";
  RunResult a = run_train(t.tiny(all + " --run " + name + "-a"), env);
  ASSERT_EQ(a.exit_code, 0) << name << "\n" << a.output;
  EXPECT_TRUE(contains(a.output, "determinism on:") && contains(a.output, "CUBLAS_WORKSPACE_CONFIG=:"))
      << name << ": the start-up table does not say the run is deterministic\n" << a.output;
  RunResult b = run_train(t.tiny(all + " --run " + name + "-b"), env);
  ASSERT_EQ(b.exit_code, 0) << name << "\n" << b.output;
  expect_same_training(t.run_dir(name + "-a"), t.run_dir(name + "-b"), 4, name);
  EXPECT_EQ(metrics(t.run_dir(name + "-a"), "val").size(), 2u) << name;
}

TEST(TrainCli, DeterministicCpuRunRepeatsItself) {
  TempRun t;
  expect_repeats_itself(t, "", "", "cpu");
}

// A small CUDA model (grad-accum 2, so the CUDA graph replays) on each program of the step.
TEST(TrainCli, DeterministicCudaProgramsRepeatThemselves) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  TempRun t;
  const std::string cuda = "--device cuda --seq-len 256 --batch 2 --grad-accum 2 --dim 128 --depth 2 --heads 2 --dim-head 64";
  expect_repeats_itself(t, cuda + " --use-cuda-kernel", "", "fused");
  expect_repeats_itself(t, cuda + " --use-cuda-kernel", "FLASHCOS_FUSED_OPS=0", "composite");
  expect_repeats_itself(t, cuda + " --attention-impl sdpa", "", "sdpa");
}

}  // namespace
