// ./train bench end to end on the CPU: runs the built binary, reads its --json output, and checks
// that bad options exit non-zero with a message naming the option.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/train_process_util.h"

namespace {

using train_test::RunResult;
using train_test::run_train;

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/flashcos_" + name + "_" +
         std::to_string(getpid()) + ".json";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "no JSON written at " << path;
  nlohmann::json doc;
  if (in) in >> doc;
  return doc;
}

const char* kSmall =
    "bench --device cpu --seq-lens 1,63 --dim-head 16 --batch 1 --heads 2 "
    "--iters 2 --warmup 1";

TEST(BenchCli, CpuRunWritesEveryMeasurement) {
  const std::string json = temp_path("bench");
  const RunResult r = run_train(std::string(kSmall) + " --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The seed's table and the full table are printed.
  EXPECT_NE(r.output.find("seq_len: 1 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("seq_len: 63 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("float32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TFLOP/s"), std::string::npos) << r.output;

  const nlohmann::json doc = read_json(json);
  std::remove(json.c_str());
  ASSERT_TRUE(doc.contains("results")) << doc.dump(2);
  EXPECT_EQ(doc["device_type"], "cpu");
  EXPECT_EQ(doc["config"]["seq_lens"], nlohmann::json({1, 63}));
  EXPECT_EQ(doc["config"]["dim_heads"], nlohmann::json({16}));
  EXPECT_EQ(doc["config"]["passes"], nlohmann::json({"fwd", "bwd", "fwd+bwd"}));
  EXPECT_EQ(doc["config"]["warmup"], 1);
  EXPECT_DOUBLE_EQ(doc["config"]["warmup_s"].get<double>(), 1.0);  // the default; the CPU ignores it

  // plain and tiled: a positive time and TFLOP/s for every pass x length, with the right FLOPs.
  std::map<std::string, std::set<std::string>> seen;  // impl -> "pass/seq_len"
  std::set<int64_t> seq_lens;
  for (const auto& r : doc["results"]) {
    const std::string impl = r["impl"];
    seq_lens.insert(r["seq_len"].get<int64_t>());
    EXPECT_EQ(r["dtype"], "fp32");
    EXPECT_EQ(r["batch"], 1);
    EXPECT_EQ(r["heads"], 2);
    EXPECT_EQ(r["dim_head"], 16);
    if (impl != "plain" && impl != "tiled") continue;
    ASSERT_EQ(r["status"], "ok") << r.dump();
    const double ms = r["ms"].get<double>();
    EXPECT_GT(ms, 0.0) << r.dump();
    EXPECT_GT(r["tflops"].get<double>(), 0.0) << r.dump();
    EXPECT_EQ(r["iters"], 2);
    const int64_t n = r["seq_len"];
    const std::string pass = r["pass"];
    const double factor = pass == "fwd" ? 1.0 : pass == "bwd" ? 2.5 : 3.5;
    EXPECT_DOUBLE_EQ(r["flops"].get<double>(), 4.0 * 1 * 2 * n * n * 16 * factor) << r.dump();
    seen[impl].insert(pass + "/" + std::to_string(n));
  }
  EXPECT_EQ(seq_lens, (std::set<int64_t>{1, 63}));
  const std::set<std::string> expected = {"fwd/1",  "fwd/63",    "bwd/1",
                                          "bwd/63", "fwd+bwd/1", "fwd+bwd/63"};
  EXPECT_EQ(seen["plain"], expected);
  EXPECT_EQ(seen["tiled"], expected);
}

TEST(BenchCli, OnlyForwardsCausalRestrictedImpls) {
  const std::string json = temp_path("bench_fwd");
  const RunResult r = run_train(std::string(kSmall) +
                                " --only-forwards --causal --mask-prob 0.25 --impls tiled,plain "
                                "--json " +
                                json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json doc = read_json(json);
  std::remove(json.c_str());
  ASSERT_EQ(doc["results"].size(), 4u) << doc.dump(2);  // 2 impls x 2 lengths x fwd
  for (const auto& rec : doc["results"]) {
    EXPECT_EQ(rec["pass"], "fwd");
    EXPECT_EQ(rec["causal"], true);
    EXPECT_EQ(rec["status"], "ok") << rec.dump();
    const int64_t n = rec["seq_len"];
    EXPECT_DOUBLE_EQ(rec["flops"].get<double>(), 4.0 * 2 * n * n * 16 / 2);
  }
}

TEST(BenchCli, RoundsKeepOneResultPerImplementationAndLength) {
  const std::string json = temp_path("bench_rounds");
  const RunResult r = run_train(std::string(kSmall) + " --only-backwards --impls plain,tiled --rounds 3 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rounds: 3"), std::string::npos) << r.output;
  const nlohmann::json doc = read_json(json);
  std::remove(json.c_str());
  EXPECT_EQ(doc["config"]["rounds"], 3);
  ASSERT_EQ(doc["results"].size(), 4u) << doc.dump(2);  // 2 impls x 2 lengths, not x 3 rounds
  std::set<std::string> seen;
  for (const auto& rec : doc["results"]) {
    EXPECT_EQ(rec["status"], "ok") << rec.dump();
    EXPECT_GT(rec["ms"].get<double>(), 0.0) << rec.dump();
    // Every round's median, the reported ms the least of them.
    ASSERT_TRUE(rec.contains("round_ms")) << rec.dump();
    const std::vector<double> rounds = rec["round_ms"].get<std::vector<double>>();
    ASSERT_EQ(rounds.size(), 3u) << rec.dump();
    EXPECT_DOUBLE_EQ(rec["ms"].get<double>(), *std::min_element(rounds.begin(), rounds.end())) << rec.dump();
    seen.insert(rec["impl"].get<std::string>() + "/" + std::to_string(rec["seq_len"].get<int64_t>()));
  }
  EXPECT_EQ(seen, (std::set<std::string>{"plain/1", "plain/63", "tiled/1", "tiled/63"}));
  // The table's spread column: the slowest round over the fastest, as a percentage.
  EXPECT_NE(r.output.find("   spread"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("%\n"), std::string::npos) << r.output;
}

TEST(BenchCli, BiasRunsOursWithItsGradientAndSdpaWithTheMask) {
  for (const char* bias : {"head", "batch"}) {
    const std::string json = temp_path(std::string("bench_bias_") + bias);
    const RunResult r = run_train(std::string(kSmall) + " --causal --mask-prob 0.25 --bias " + bias +
                                  " --impls plain,tiled,sdpa-math --json " + json);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(std::string(", bias ") + bias), std::string::npos) << r.output;
    const nlohmann::json doc = read_json(json);
    std::remove(json.c_str());
    EXPECT_EQ(doc["config"]["bias"], bias);
    ASSERT_EQ(doc["results"].size(), 18u) << doc.dump(2);  // 3 impls x 2 lengths x 3 passes
    for (const auto& rec : doc["results"]) {
      EXPECT_EQ(rec["status"], "ok") << rec.dump();
      EXPECT_EQ(rec["bias"], bias);
    }
  }
}

TEST(BenchCli, ExpKindRunsOursAndMarksSdpaNotApplicable) {
  const RunResult r = run_train(std::string(kSmall) +
                                " --only-backwards --attention exp --impls plain,tiled,sdpa-math");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no unnormalised exp variant"), std::string::npos) << r.output;
}

TEST(BenchCli, HelpListsTheOptions) {
  const RunResult r = run_train("bench --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* opt :
       {"--causal", "--mask-prob", "--bias", "--only-forwards", "--only-backwards", "--dtype", "--batch",
        "--heads", "--dim-head", "--seq-lens", "--json", "--impls", "--device", "--rounds", "--profile", "--clocks"}) {
    EXPECT_NE(r.output.find(opt), std::string::npos) << opt << "\n" << r.output;
  }
}

void expect_rejected(const std::string& args, const std::string& named) {
  const RunResult r = run_train("bench --device cpu " + args);
  EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(named), std::string::npos)
      << "the error for '" << args << "' should name " << named << ":\n"
      << r.output;
  EXPECT_EQ(r.output.find("seq_len:"), std::string::npos) << "nothing should run:\n" << r.output;
}

TEST(BenchCli, BadOptionsExitNonZeroNamingTheOption) {
  expect_rejected("--dtype fp8", "--dtype");
  expect_rejected("--dtype bf16,fp8", "--dtype");
  expect_rejected("--seq-lens abc", "--seq-lens");
  expect_rejected("--seq-lens 128,", "--seq-lens");
  expect_rejected("--seq-lens 0", "--seq-lens");
  expect_rejected("--dim-head 6x4", "--dim-head");
  expect_rejected("--batch -1", "--batch");
  expect_rejected("--no-such-option", "no-such-option");
  expect_rejected("--mask-prob 1.5", "--mask-prob");
  expect_rejected("--bias rows", "--bias");
  expect_rejected("--only-forwards --only-backwards", "--only-backwards");
  expect_rejected("--impls plain,flash3", "--impls");
  expect_rejected("--attention softmax", "--attention");
  expect_rejected("--device tpu", "--device");
  expect_rejected("--iters 0", "--iters");
  expect_rejected("--rounds 0", "--rounds");
  expect_rejected("--rounds 2147483648", "--rounds");  // past an int: no longer wraps to 0 rounds
  expect_rejected("--iters 4294967297", "--iters");
  expect_rejected("--warmup 4294967296", "--warmup");
  expect_rejected("--warmup-s -0.5", "--warmup-s");
  expect_rejected("--warmup-s soon", "--warmup-s");
  expect_rejected("stray", "stray");
  expect_rejected("--profile -1", "--profile");
  expect_rejected("--profile 1001", "--profile");
  expect_rejected("--profile 2", "--profile");  // the CPU has no CUDA kernels to report
  expect_rejected("--clocks", "--clocks");      // nor a GPU clock to sample
}

// A bench run on the GPU with --json: its output, exit code and JSON (read and removed); gpu false
// (nothing else set) where this machine has no CUDA device, for the caller to skip.
struct CudaRun {
  bool gpu = false;
  RunResult r;
  nlohmann::json doc;
};
CudaRun run_bench_on_cuda(const std::string& args, const std::string& json_name) {
  CudaRun run;
  const std::string json = temp_path(json_name);
  run.r = run_train("bench --device cuda " + args + " --json " + json);
  run.gpu = run.r.output.find("no CUDA device is available") == std::string::npos;
  if (run.gpu && run.r.exit_code == 0) run.doc = read_json(json);
  std::remove(json.c_str());
  return run;
}

// --profile on a GPU (skipped without one): below each table, each implementation's kernels over the
// profiled iterations, their summed time against the span, and the same report in the JSON.
TEST(BenchCli, ProfileReportsEachImplementationsKernelsOnCuda) {
  const CudaRun run = run_bench_on_cuda("--seq-lens 200,1000 --dim-head 64 --batch 1 --heads 2 --iters 3 --warmup 1 "
                                        "--warmup-s 0 --only-backwards --impls fused,tiled --rounds 2 --profile 2",
                                        "bench_profile");
  if (!run.gpu) GTEST_SKIP() << "no GPU here";
  const RunResult& r = run.r;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json& doc = run.doc;
  for (const char* impl : {"fused", "tiled"}) {
    for (const char* n : {"200", "1000"}) {
      const std::string title = std::string("backward, ") + impl + ", seq_len " + n + ": where 2 more iterations went";
      const size_t at = r.output.find(title);
      ASSERT_NE(at, std::string::npos) << title << "\n" << r.output;
      // Its report: the kernels' summed time and the span per iteration, then the kernel table.
      const size_t busy = r.output.find("profile over 2 iterations: kernel time ", at);
      ASSERT_NE(busy, std::string::npos) << r.output;
      EXPECT_LT(busy - at, title.size() + 20) << "the report should follow its title:\n" << r.output;
      EXPECT_NE(r.output.find("ms/iteration", busy), std::string::npos) << r.output;
    }
  }
  ASSERT_EQ(doc["results"].size(), 4u) << doc.dump(2);
  for (const auto& rec : doc["results"]) {
    ASSERT_EQ(rec["status"], "ok") << rec.dump();
    ASSERT_TRUE(rec.contains("profile")) << rec.dump();
    const std::string report = rec["profile"].get<std::string>();
    EXPECT_EQ(report.rfind("profile over 2 iterations: kernel time ", 0), 0u) << report;
    EXPECT_NE(report.find("calls  kernel"), std::string::npos) << report;
  }
}

// --clocks on a GPU (skipped without one): each row's SM clock, power and power-cap share over its
// timed iterations, in the table and the JSON, within what an NVIDIA data-centre GPU can report;
// each round's in round_clocks, the kept (fastest) round's the row's.
TEST(BenchCli, ClocksAddTheSmClockAndPowerOfEachRowOnCuda) {
  const CudaRun run = run_bench_on_cuda("--seq-lens 4096 --dim-head 64 --batch 4 --heads 8 --iters 200 --warmup 2 "
                                        "--warmup-s 0.2 --only-forwards --impls fused,tiled --rounds 2 --clocks",
                                        "bench_clocks");
  if (!run.gpu) GTEST_SKIP() << "no GPU here";
  const RunResult& r = run.r;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SM MHz      W  capped"), std::string::npos) << r.output;
  const nlohmann::json& doc = run.doc;
  EXPECT_EQ(doc["config"]["clocks"], true) << doc["config"].dump(2);
  // Which power reading the rows carry: the board's instantaneous one where the driver gives it.
  ASSERT_TRUE(doc["config"].contains("clock_power")) << doc["config"].dump(2);
  const std::string power = doc["config"]["clock_power"].get<std::string>();
  EXPECT_TRUE(power == "instantaneous" || power == "one-second average") << power;
  const std::string header =
      std::string("clocks: SM clock, power (") + (power == "instantaneous" ? "instantaneous" : "NVML's");
  EXPECT_NE(r.output.find(header), std::string::npos) << r.output;
  ASSERT_EQ(doc["results"].size(), 2u) << doc.dump(2);
  for (const auto& rec : doc["results"]) {
    ASSERT_EQ(rec["status"], "ok") << rec.dump();
    ASSERT_TRUE(rec.contains("clock_samples")) << rec.dump();
    ASSERT_TRUE(rec.contains("round_clocks")) << rec.dump();
    const std::vector<double> round_ms = rec["round_ms"].get<std::vector<double>>();
    ASSERT_EQ(round_ms.size(), 2u) << rec.dump();
    ASSERT_EQ(rec["round_clocks"].size(), 2u) << rec.dump();
    const size_t kept = round_ms[0] <= round_ms[1] ? 0 : 1;
    EXPECT_EQ(rec["round_clocks"][kept]["clock_samples"], rec["clock_samples"]) << rec.dump();
    EXPECT_EQ(rec["round_clocks"][kept]["sm_mhz"], rec["sm_mhz"]) << rec.dump();
    EXPECT_EQ(rec["round_clocks"][kept]["watts"], rec["watts"]) << rec.dump();
    if (rec["clock_samples"].get<int>() == 0) {  // iterations shorter than one sampling period
      EXPECT_TRUE(rec["sm_mhz"].is_null()) << rec.dump();
      continue;
    }
    const double mhz = rec["sm_mhz"].get<double>(), watts = rec["watts"].get<double>();
    const double capped = rec["power_capped_share"].get<double>();
    EXPECT_GT(mhz, 100.0) << rec.dump();
    EXPECT_LT(mhz, 5000.0) << rec.dump();
    EXPECT_GT(watts, 1.0) << rec.dump();
    EXPECT_LT(watts, 2000.0) << rec.dump();
    EXPECT_GE(capped, 0.0) << rec.dump();
    EXPECT_LE(capped, 1.0) << rec.dump();
  }
}

// A bench that timed nothing (here: only GPU implementations on the CPU) is not a success.
TEST(BenchCli, NothingTimedIsAnError) {
  const RunResult r = run_train(std::string(kSmall) + " --only-forwards --impls sdpa-cudnn");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("nothing was timed"), std::string::npos) << r.output;
}

TEST(BenchCli, UnwritableJsonPathFails) {
  const RunResult r = run_train(std::string(kSmall) +
                                " --only-forwards --impls plain --json /nonexistent-dir/x.json");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--json"), std::string::npos) << r.output;
}

TEST(BenchCli, JsonPathThatIsAFolderFailsAndLeavesNoTmp) {
  const std::string dir = temp_path("bench_json_dir");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  const RunResult r = run_train(std::string(kSmall) + " --only-forwards --impls plain --json " + dir);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--json"), std::string::npos) << r.output;
  EXPECT_NE(::access((dir + ".tmp").c_str(), F_OK), 0) << "the temporary file was left behind";
  ::unlink((dir + ".tmp").c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
