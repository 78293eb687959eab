// The trainer keeps its promises (issue 18), checked with real ./train processes on a tiny CPU
// model: run folders never collide, a full disk during a save is survived, SIGTERM / SIGHUP save
// like Ctrl-C, a fused-kernel checkpoint samples on a CPU, bad options are refused before any
// run folder exists, and --help names the subcommands.
#include "train_process_util.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>

#include "common/log.h"
#include "data/corpus.h"
#include "model/checkpoint.h"
#include "model/gpt.h"

namespace {
using namespace train_test;
namespace fm = flashcos::model;

// ---- 2. run names ----------------------------------------------------------------------------

TEST(TrainCli, ExistingRunFolderIsRefusedUnlessOverwrite) {
  TempRun t;
  ASSERT_EQ(run_train(t.tiny("--steps 2 --run same")).exit_code, 0);
  const auto before = metrics(t.run_dir("same"));
  ASSERT_EQ(before.size(), 2u);

  RunResult again = run_train(t.tiny("--steps 3 --run same"));
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_TRUE(contains(again.output, "already exists")) << again.output;
  EXPECT_TRUE(contains(again.output, "--overwrite")) << again.output;
  EXPECT_EQ(metrics(t.run_dir("same")).size(), 2u);  // untouched
  EXPECT_EQ(fm::read_checkpoint_meta(t.run_dir("same") + "/latest.pt").state.step, 2);

  RunResult over = run_train(t.tiny("--steps 3 --run same --overwrite"));
  ASSERT_EQ(over.exit_code, 0) << over.output;
  EXPECT_EQ(metrics(t.run_dir("same")).size(), 3u);  // a fresh metrics file, not appended
  EXPECT_EQ(fm::read_checkpoint_meta(t.run_dir("same") + "/latest.pt").state.step, 3);
}

TEST(TrainCli, DefaultRunNamesStartedTogetherAreUnique) {
  TempRun t;
  // Two runs started in the same second under the default name: two folders, each a whole run.
  BackgroundTrain a(t.tiny("--steps 3"), t.dir() + "/a.log");
  BackgroundTrain b(t.tiny("--steps 3"), t.dir() + "/b.log");
  const int sa = a.wait(120), sb = b.wait(120);
  ASSERT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << a.log();
  ASSERT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << b.log();
  ASSERT_EQ(t.run_count(), 2u);
  for (const auto& e : fs::directory_iterator(t.ckpts())) {
    EXPECT_EQ(metrics(e.path().string()).size(), 3u) << e.path();
    EXPECT_EQ(fm::read_checkpoint_meta(e.path().string() + "/latest.pt").state.step, 3);
  }
}

// ---- 3. a full disk during a save ----------------------------------------------------------

TEST(TrainCli, FailedSavesAreSurvivedAndKeepTheLastGoodCheckpoint) {
  TempRun t;
  ASSERT_EQ(run_train(t.tiny("--steps 2 --save-every 2 --run r")).exit_code, 0);
  const std::string ckpt = t.run_dir("r") + "/latest.pt";
  const auto good_size = fs::file_size(ckpt);
  const std::string good_bytes = read_text(ckpt);
  // A file-size limit below the checkpoint's size makes every write past it fail (EFBIG), as a
  // full disk does. bash's ulimit -f counts 1024-byte blocks.
  const std::string limit = "ulimit -f " + std::to_string(good_size / 1024 / 2) + ";";
  RunResult r = run_train("--resume " + quote(t.run_dir("r")) + " --steps 7 --save-every 2", limit);

  EXPECT_EQ(r.exit_code, 1) << r.output;  // the final save failed: not a success
  EXPECT_TRUE(contains(r.output, "step 7/7")) << r.output;  // training went on after the failures
  size_t failures = 0;
  for (size_t pos = 0; (pos = r.output.find("could not save the checkpoint", pos)) != std::string::npos; ++pos) ++failures;
  EXPECT_EQ(failures, 3u) << r.output;  // steps 4, 6 and 7: each save retried
  EXPECT_TRUE(contains(r.output, ckpt + ".tmp")) << r.output;
  EXPECT_TRUE(contains(r.output, std::strerror(EFBIG))) << r.output;
  EXPECT_TRUE(contains(r.output, "MiB free")) << r.output;
  EXPECT_FALSE(fs::exists(ckpt + ".tmp"));
  EXPECT_EQ(read_text(ckpt), good_bytes);
  EXPECT_EQ(fm::read_checkpoint_meta(ckpt).state.step, 2);

  // Without the limit the same resume saves again.
  RunResult ok = run_train("--resume " + quote(t.run_dir("r")) + " --steps 3");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(fm::read_checkpoint_meta(ckpt).state.step, 3);
}

// ---- 4. SIGTERM / SIGHUP --------------------------------------------------------------------

void expect_signal_saves(int sig) {
  TempRun t;
  BackgroundTrain train(t.tiny("--steps 1000000 --save-every 1000000 --run sig"), t.dir() + "/train.log");
  ASSERT_TRUE(wait_until([&] { return metrics(t.run_dir("sig")).size() >= 2; }, 120)) << train.log();
  ASSERT_EQ(kill(train.pid(), sig), 0);
  const int status = train.wait(120);
  ASSERT_NE(status, -1) << "no exit within 120 s after " << strsignal(sig) << "\n" << train.log();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << "\n" << train.log();
  EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << train.log();
  const std::string ckpt = t.run_dir("sig") + "/latest.pt";
  ASSERT_TRUE(fs::exists(ckpt)) << train.log();
  const int64_t step = fm::read_checkpoint_meta(ckpt).state.step;
  EXPECT_GE(step, 2);
  EXPECT_EQ(static_cast<int64_t>(metrics(t.run_dir("sig")).size()), step);  // it finished the step it was in
  EXPECT_TRUE(contains(train.log(), "resume with --resume " + ckpt)) << train.log();
}

TEST(TrainCli, SigtermFinishesTheStepSavesAndExits143) { expect_signal_saves(SIGTERM); }
TEST(TrainCli, SighupFinishesTheStepSavesAndExits129) { expect_signal_saves(SIGHUP); }

// ---- 5. a fused-kernel checkpoint on a CPU ---------------------------------------------------

TEST(TrainCli, FusedCheckpointSamplesAndEvaluatesOnCpu) {
  TempRun t;
  fm::ModelConfig mc;
  mc.dim = 16;
  mc.depth = 1;
  mc.heads = 2;
  mc.dim_head = 8;
  mc.max_seq_len = 16;
  mc.attention_impl = "fused";
  torch::manual_seed(3);
  fm::GPT gpt(mc);
  const std::string ckpt = t.dir() + "/fused.pt";
  fm::save_checkpoint(ckpt, gpt, nullptr, mc, fm::TrainState{});

  RunResult s = run_train("sample --checkpoint " + quote(ckpt) + " --prime 'the cat' --length 8 --device cpu");
  EXPECT_EQ(s.exit_code, 0) << s.output;
  EXPECT_TRUE(contains(s.output, "using --attention-impl tiled")) << s.output;
  RunResult e = run_train("eval --checkpoint " + quote(ckpt) + " --data " + quote(t.corpus()) +
                          " --split 0.8,0.1,0.1 --seq-len 16 --max-windows 3 --device cpu");
  EXPECT_EQ(e.exit_code, 0) << e.output;
  EXPECT_TRUE(contains(e.output, "bits/char")) << e.output;
  // The same weights through the plain reference give the same loss: only the implementation changed.
  RunResult p = run_train("eval --checkpoint " + quote(ckpt) + " --data " + quote(t.corpus()) +
                          " --split 0.8,0.1,0.1 --seq-len 16 --max-windows 3 --device cpu --attention-impl plain");
  EXPECT_EQ(p.exit_code, 0) << p.output;
  auto nats = [](const std::string& out) {
    const auto at = out.find("loss ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 5));
  };
  EXPECT_NEAR(nats(e.output), nats(p.output), 1e-3) << e.output << p.output;
  // Asking for fused explicitly where it cannot run is an error, not a silent fallback.
  RunResult f = run_train("sample --checkpoint " + quote(ckpt) + " --prime ab --length 4 --device cpu --attention-impl fused");
  EXPECT_EQ(f.exit_code, 2) << f.output;
  EXPECT_TRUE(contains(f.output, "--attention-impl fused")) << f.output;
}

// ---- 6-8. bad options are refused before a run folder exists --------------------------------

TEST(TrainCli, BadOptionsAreRefusedBeforeAnyRunFolderExists) {
  TempRun t;
  struct Case {
    std::string args, names;
    int code;
  };
  const Case cases[] = {
      {"--use-cuda-kernel", "--use-cuda-kernel", 2},
      {"--generate-length -5 --generate-every 1", "--generate-length", 2},
      {"--val-windows 0", "--val-windows", 2},
      {"--min-lr-ratio -0.5", "--min-lr-ratio", 2},
      {"--adam-beta2 1", "--adam-beta2", 2},
      {"--log-level verbose", "--log-level", 2},
      {"--run a/b", "--run", 2},
      {"--data " + quote(t.dir() + "/missing.txt"), "not found", 1},
      {"--attn-scale 0", "--attn-scale", 2},
      {"--dist-backend foo", "--dist-backend", 2},
      {"--profile-steps 3", "--profile-steps", 2},
      {"--resume ''", "--resume", 2},
      {"--seq-len 9223372036854775807", "--seq-len", 2},
      {"--split 4000000000G,4000000000G,4000000000G", "--split", 2},
      {"--depth 1000000000", "use a smaller model", 2},
  };
  for (const auto& c : cases) {
    RunResult r = run_train(t.tiny("--steps 2 " + c.args));
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.names)) << c.args << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "flashcos train:")) << "the config table was printed for " << c.args;
    EXPECT_EQ(t.run_count(), 0u) << "a run folder was created for " << c.args;
  }
}

// An allocation that cannot succeed (a batch of 1e14 windows, 1.4e16 bytes: past the address space, so it fails at
// once even where memory is overcommitted) is an error of one line, without the
// C++ backtrace libtorch attaches to it.
TEST(TrainCli, OutOfMemoryIsOneLineWithoutABacktrace) {
  TempRun t;
  RunResult r = run_train(t.tiny("--steps 2 --batch 100000000000000"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // The CPU allocator says "can't allocate memory"; with CUDA present the batch is pinned host
  // memory, whose allocator says "CUDA error: out of memory".
  EXPECT_TRUE(contains(r.output, "allocate") || contains(r.output, "out of memory")) << r.output;
  EXPECT_FALSE(contains(r.output, "frame #")) << r.output;
  EXPECT_FALSE(contains(r.output, "Exception raised from")) << r.output;
}

TEST(TrainCli, LogLevelIsCaseInsensitiveAndUnknownLevelsAreRefused) {
  EXPECT_NO_THROW(flashcos::log::init("WARN"));
  EXPECT_NO_THROW(flashcos::log::init("Info"));
  EXPECT_THROW(flashcos::log::init("loud"), std::invalid_argument);
  TempRun t;
  RunResult upper = run_train(t.tiny("--steps 1 --log-level INFO --run up"));
  EXPECT_EQ(upper.exit_code, 0) << upper.output;
  EXPECT_TRUE(contains(upper.output, "flashcos train:")) << upper.output;  // info lines shown
  RunResult warn = run_train(t.tiny("--steps 1 --log-level Warn --run w"));
  EXPECT_EQ(warn.exit_code, 0) << warn.output;
  EXPECT_FALSE(contains(warn.output, "flashcos train:")) << warn.output;
  RunResult bad = run_train(t.tiny("--steps 1 --log-level chatty"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "trace, debug, info, warn, error or off")) << bad.output;
}

TEST(TrainCli, GzFileThatIsNotGzipIsRefused) {
  TempRun t;
  const std::string bz = t.dir() + "/text.gz";
  {
    std::ofstream out(bz, std::ios::binary);
    out << "BZh91AY&SY";
    for (int i = 0; i < 4096; ++i) out.put(static_cast<char>((i * 7919) & 0xff));
  }
  RunResult r = run_train(t.tiny("--steps 1 --data " + quote(bz)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is not gzip")) << r.output;
  EXPECT_TRUE(contains(r.output, "bzip2")) << r.output;
  EXPECT_EQ(t.run_count(), 0u);
  // Random bytes under a .gz name: refused too, showing the first bytes.
  const std::string junk = t.dir() + "/junk.gz";
  {
    std::ofstream out(junk, std::ios::binary);
    for (int i = 0; i < 4096; ++i) out.put(static_cast<char>(0x41 + i % 7));
  }
  EXPECT_THROW(flashcos::data::load_corpus(junk, flashcos::data::parse_split("0.8,0.1,0.1"), 17), std::runtime_error);
  try {
    flashcos::data::load_corpus(junk, flashcos::data::parse_split("0.8,0.1,0.1"), 17);
  } catch (const std::exception& e) {
    EXPECT_TRUE(contains(e.what(), "41 42 43 44")) << e.what();
  }
}

TEST(TrainCli, SampleLengthBeyondMemoryIsRefused) {
  TempRun t;
  ASSERT_EQ(run_train(t.tiny("--steps 1 --run s")).exit_code, 0);
  RunResult r = run_train("sample --checkpoint " + quote(t.run_dir("s")) + " --prime ab --length 4000000000000000");
  EXPECT_EQ(r.exit_code, 2) << r.output.substr(0, 2000);
  EXPECT_TRUE(contains(r.output, "--length")) << r.output.substr(0, 2000);
  EXPECT_TRUE(contains(r.output, "memory")) << r.output.substr(0, 2000);
}

// ---- 10. an exploding (finite) loss ------------------------------------------------------------

TEST(TrainCli, ExplodingLossWarnsOnce) {
  TempRun t;
  // lr 1000 without clipping: the loss climbs to ~1e7 and stays finite (the NaN check never fires).
  RunResult r = run_train(t.tiny("--steps 15 --lr 1000 --clip-grad 0 --log-every 5 --run boom"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto m = metrics(t.run_dir("boom"));
  ASSERT_EQ(m.size(), 3u);
  EXPECT_GT(m.back()["loss"].get<double>(), 1e4);
  EXPECT_TRUE(std::isfinite(m.back()["loss"].get<double>()));
  size_t warnings = 0;
  for (size_t pos = 0; (pos = r.output.find("for 10 steps in a row", pos)) != std::string::npos; ++pos) ++warnings;
  EXPECT_EQ(warnings, 1u) << r.output;
  // A healthy run says nothing of the kind.
  RunResult calm = run_train(t.tiny("--steps 5 --log-every 5 --run calm"));
  EXPECT_EQ(calm.exit_code, 0) << calm.output;
  EXPECT_FALSE(contains(calm.output, "in a row")) << calm.output;
}

// ---- 11. validation and samples leave the training alone -----------------------------------

// Validation and samples between steps only read the model: a run that validates every step and
// samples every other one logs the same training losses and gradient norms, bit for bit, as one
// that does neither (on the GPU, run P4 of docs/quality.md found the same for the fused CUDA step).
TEST(TrainCli, ValidationAndSamplesDoNotChangeTraining) {
  TempRun t;
  RunResult quiet = run_train(t.tiny("--steps 6 --run quiet"));
  ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
  RunResult busy = run_train(t.tiny("--steps 6 --validate-every 1 --generate-every 2 --run busy"));
  ASSERT_EQ(busy.exit_code, 0) << busy.output;
  EXPECT_EQ(metrics(t.run_dir("busy"), "val").size(), 6u) << busy.output;
  EXPECT_NE(busy.output.find("---- sample (step 2)"), std::string::npos) << busy.output;
  expect_same_training(t.run_dir("quiet"), t.run_dir("busy"), 6);
}

// ---- 9. --help -------------------------------------------------------------------------------

TEST(TrainCli, HelpNamesTheSubcommands) {
  RunResult r = run_train("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* sub : {"sample", "eval", "bench"}) EXPECT_TRUE(contains(r.output, sub)) << r.output;
}

}  // namespace
