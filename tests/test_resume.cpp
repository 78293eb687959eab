// ./train --resume end to end on a tiny CPU model (issue 18, point 1): the checkpoint's saved
// configuration is restored, options given on the command line override it (each printed),
// model-shape options that differ are refused, and the run continues in its own folder with
// exactly the losses of an uninterrupted run.
#include "train_process_util.h"

#include <cmath>

#include "model/checkpoint.h"

namespace {
using namespace train_test;

// Non-default options everywhere: a resume that fell back to defaults would show.
// (The schedule stays constant: a cosine schedule depends on --steps, which the resume raises.)
const char* kRunOptions = "--seq-len 24 --batch 3 --lr 1e-3 --weight-decay 0.01 --warmup 2 --clip-grad 0.25 "
                          "--seed 7 --save-every 2 --max-seq-len 24 --adam-beta1 0.8 --adam-beta2 0.95";

TEST(ResumeCli, RestoresTheSavedConfigurationAndContinuesExactly) {
  TempRun t;
  // Uninterrupted reference: 6 steps.
  RunResult ref = run_train(t.tiny(std::string(kRunOptions) + " --steps 6 --run ref"));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // The same run stopped after 4 steps, then resumed with nothing but --resume and the new --steps.
  RunResult first = run_train(t.tiny(std::string(kRunOptions) + " --steps 4 --run part"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  RunResult resumed = run_train("--resume " + quote(t.run_dir("part")) + " --steps 6");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;

  // The override is printed; nothing else is.
  EXPECT_NE(resumed.output.find("--steps 6 overrides the checkpoint's 4"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("--lr"), std::string::npos) << resumed.output;

  // It wrote into the original run folder (no new folder) and config.json keeps the run's options.
  EXPECT_EQ(t.run_count(), 2u);
  const auto cfg = read_json_file(t.run_dir("part") + "/config.json");
  EXPECT_EQ(cfg["train"]["seq_len"], 24) << cfg.dump(2);
  EXPECT_EQ(cfg["train"]["batch"], 3);
  EXPECT_EQ(cfg["train"]["lr"], 1e-3);
  EXPECT_EQ(cfg["train"]["weight_decay"], 0.01);
  EXPECT_EQ(cfg["train"]["warmup"], 2);
  EXPECT_EQ(cfg["train"]["clip_grad"], 0.25);
  EXPECT_EQ(cfg["train"]["adam_beta1"], 0.8);
  EXPECT_EQ(cfg["train"]["adam_beta2"], 0.95);
  EXPECT_EQ(cfg["train"]["seed"], 7);
  EXPECT_EQ(cfg["train"]["steps"], 6);
  EXPECT_EQ(flashcos::model::read_checkpoint_meta(t.run_dir("part") + "/latest.pt").state.step, 6);

  // Steps 5 and 6 have the uninterrupted run's losses and learning rates, bit for bit.
  const auto a = metrics(t.run_dir("ref")), b = metrics(t.run_dir("part"));
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << a[i]["step"];
    EXPECT_EQ(a[i]["lr"].get<double>(), b[i]["lr"].get<double>()) << "step " << a[i]["step"];
    // The gradients' norm before clipping: logged every step, and the same bits after the resume.
    ASSERT_TRUE(a[i].contains("grad_norm") && b[i].contains("grad_norm")) << a[i].dump();
    const double norm = a[i]["grad_norm"].get<double>();
    EXPECT_TRUE(std::isfinite(norm) && norm > 0) << a[i].dump();
    EXPECT_EQ(norm, b[i]["grad_norm"].get<double>()) << "step " << a[i]["step"];
  }
}

TEST(ResumeCli, OverridesArePrintedAndModelShapeChangesRefused) {
  TempRun t;
  RunResult first = run_train(t.tiny("--seq-len 24 --steps 2 --save-every 2 --run r"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string resume = "--resume " + quote(t.run_dir("r") + "/latest.pt");

  // A model-shape option that differs: exit 2, naming the option and both values.
  for (const std::string bad : {"--dim 32", "--depth 2", "--heads 4 --dim-head 4", "--attention softmax"}) {
    RunResult r = run_train(resume + " --steps 3 " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.output;
    EXPECT_NE(r.output.find(bad.substr(0, bad.find(' '))), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("cannot change"), std::string::npos) << r.output;
  }
  EXPECT_EQ(flashcos::model::read_checkpoint_meta(t.run_dir("r") + "/latest.pt").state.step, 2);

  // Options that may change are applied and printed; a model option equal to the checkpoint's is fine.
  RunResult ok = run_train(resume + " --steps 3 --lr 5e-4 --batch 1 --dim 16");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("--lr 0.0005 overrides the checkpoint's 0.0002"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("--batch 1 overrides the checkpoint's 2"), std::string::npos) << ok.output;
  const auto cfg = read_json_file(t.run_dir("r") + "/config.json");
  EXPECT_EQ(cfg["train"]["lr"], 5e-4);
  EXPECT_EQ(cfg["train"]["batch"], 1);
  EXPECT_EQ(cfg["train"]["seq_len"], 24);  // restored, not the default 1024
}

// --deterministic is a run-time choice: recorded in config.json, and turned on by a resume.
TEST(ResumeCli, DeterministicIsRecordedAndTurnedOnByAResume) {
  TempRun t;
  RunResult first = run_train(t.tiny("--steps 2 --save-every 2 --run det"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(read_json_file(t.run_dir("det") + "/config.json")["model"]["deterministic"], false);
  RunResult resumed = run_train("--resume " + quote(t.run_dir("det")) + " --steps 3 --deterministic");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("--deterministic overrides the checkpoint's default backward"), std::string::npos)
      << resumed.output;
  EXPECT_EQ(read_json_file(t.run_dir("det") + "/config.json")["model"]["deterministic"], true);
}

}  // namespace
