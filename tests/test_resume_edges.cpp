// ./train --resume at its edges, on a tiny CPU model (found by a CLI audit): options given on a
// resume that the optimiser's saved state used to override (--weight-decay), --seed-recipe's values,
// where the resumed run writes (a bare latest.pt from inside its folder, --checkpoint-dir alone), a
// --steps the checkpoint has already reached, an empty --resume, and a run folder left without a
// checkpoint by a run that failed before its first save.
#include "train_process_util.h"

#include <cstdlib>

#include "model/checkpoint.h"

namespace {
using namespace train_test;
namespace fm = flashcos::model;

TEST(ResumeEdges, WeightDecayGivenOnAResumeIsApplied) {
  TempRun t;
  ASSERT_EQ(run_train(t.tiny("--steps 2 --save-every 2 --weight-decay 0.1 --lr 3e-3 --run base")).exit_code, 0);
  const std::string resume = "--resume " + quote(t.run_dir("base")) + " --steps 6 ";
  for (const std::string run : {"a", "b", "c"}) {
    const std::string wd = run == "a" ? "0.1" : run == "b" ? "0.5" : "0.1";
    RunResult r = run_train(resume + "--checkpoint-dir " + quote(t.ckpts()) + " --run " + run + " --weight-decay " + wd);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const auto a = metrics(t.run_dir("a")), b = metrics(t.run_dir("b")), c = metrics(t.run_dir("c"));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  // The same decay twice: the same losses; a larger decay: other losses from the second resumed step.
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a[i]["loss"].get<double>(), c[i]["loss"].get<double>()) << i;
  EXPECT_NE(a[3]["loss"].get<double>(), b[3]["loss"].get<double>());
  EXPECT_EQ(read_json_file(t.run_dir("b") + "/config.json")["train"]["weight_decay"], 0.5);
}

TEST(ResumeEdges, SeedRecipeOverridesTheSavedSchedule) {
  TempRun t;
  ASSERT_EQ(run_train(t.tiny("--steps 2 --save-every 2 --lr 1e-3 --warmup 5 --schedule cosine --run r")).exit_code, 0);
  RunResult r = run_train("--resume " + quote(t.run_dir("r")) + " --steps 3 --seed-recipe");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto cfg = read_json_file(t.run_dir("r") + "/config.json")["train"];
  EXPECT_EQ(cfg["lr"], 2e-4);
  EXPECT_EQ(cfg["warmup"], 0);
  EXPECT_EQ(cfg["schedule"], "constant");
  EXPECT_EQ(cfg["adam_beta2"], 0.999);
}

TEST(ResumeEdges, WhereTheResumedRunWrites) {
  TempRun t;
  ASSERT_EQ(run_train(t.tiny("--steps 2 --save-every 2 --run r")).exit_code, 0);
  // A bare file name from inside the run folder: the run continues there, no nested folder.
  RunResult here = run_shell("cd " + quote(t.run_dir("r")) + " && " + quote(FLASHCOS_TRAIN_BIN) +
                             " --resume latest.pt --steps 3");
  ASSERT_EQ(here.exit_code, 0) << here.output;
  EXPECT_EQ(fm::read_checkpoint_meta(t.run_dir("r") + "/latest.pt").state.step, 3);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(t.run_dir("r"))) entries += e.is_directory() ? 1 : 0;
  EXPECT_EQ(entries, 0u) << "a folder was created inside the run folder";
  // --checkpoint-dir alone: the run's name under that folder, the checkpoint left as it was.
  const std::string other = t.dir() + "/other";
  RunResult moved = run_train("--resume " + quote(t.run_dir("r")) + " --steps 4 --checkpoint-dir " + quote(other));
  ASSERT_EQ(moved.exit_code, 0) << moved.output;
  EXPECT_EQ(fm::read_checkpoint_meta(other + "/r/latest.pt").state.step, 4);
  EXPECT_EQ(fm::read_checkpoint_meta(t.run_dir("r") + "/latest.pt").state.step, 3);
}

TEST(ResumeEdges, RefusedResumesTouchNothing) {
  TempRun t;
  ASSERT_EQ(run_train(t.tiny("--steps 3 --save-every 3 --run r")).exit_code, 0);
  const std::string config = read_text(t.run_dir("r") + "/config.json");
  for (const std::string steps : {"2", "3"}) {
    RunResult r = run_train("--resume " + quote(t.run_dir("r")) + " --steps " + steps);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "at step 3 already")) << r.output;
  }
  EXPECT_EQ(read_text(t.run_dir("r") + "/config.json"), config);
  RunResult empty = run_train(t.tiny("--steps 3 --resume ''"));
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_TRUE(contains(empty.output, "--resume needs a checkpoint")) << empty.output;
  EXPECT_EQ(t.run_count(), 1u);
}

TEST(ResumeEdges, AFolderWithoutACheckpointPointsToOverwrite) {
  TempRun t;
  // What a run that failed before its first save leaves: its folder with config and metrics only.
  fs::create_directories(t.run_dir("failed"));
  std::ofstream(t.run_dir("failed") + "/config.json") << "{}\n";
  RunResult r = run_train(t.tiny("--steps 2 --run failed"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "holds no checkpoint")) << r.output;
  EXPECT_TRUE(contains(r.output, "--overwrite")) << r.output;
  EXPECT_FALSE(contains(r.output, "--resume")) << r.output;
  RunResult over = run_train(t.tiny("--steps 2 --run failed --overwrite"));
  EXPECT_EQ(over.exit_code, 0) << over.output;
  EXPECT_EQ(fm::read_checkpoint_meta(t.run_dir("failed") + "/latest.pt").state.step, 2);
}

}  // namespace
