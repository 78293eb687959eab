// Data-parallel training on the CPU (Gloo), with real processes of the built ./train:
//  - 2 ranks (through scripts/launch.sh) give the losses, validation loss and checkpoint of one
//    process with the same global batch;
//  - a 2-rank checkpoint resumes in 1 process;
//  - killing one rank ends the other with an error naming its rank, within the timeout;
// plus the environment parsing (torchrun and Slurm forms).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/checkpoint.h"
#include "model/distributed.h"
#include "tests/train_process_util.h"

namespace fs = std::filesystem;
using flashcos::model::DistEnv;
using flashcos::model::detect_dist_env;

namespace {

using train_test::free_port;
using train_test::remove_tree;
using train_test::RunResult;
using train_test::run_shell;

class DistributedTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gloo_available()) GTEST_SKIP() << "this build has no Gloo backend (install libgloo-dev, re-run cmake)";
    dir_ = fs::temp_directory_path() / ("flashcos_dist_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    remove_tree(dir_.string());  // not fs::remove_all: tests/shell_util.h says why
    fs::create_directories(dir_);
    // A small corpus of random words (not random bytes: the loss should move).
    std::mt19937 gen(7);
    const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "dog ", "ran\n", "far, "};
    std::ofstream out(dir_ / "corpus.txt", std::ios::binary);
    for (int i = 0; i < 20000; ++i) out << words[gen() % 10];
  }
  void TearDown() override {
    if (!dir_.empty()) remove_tree(dir_.string());
  }

  static bool gloo_available() { return flashcos::model::gloo_backend_built(); }

  // Tiny model, fp32 on the CPU, one metrics record per step.
  std::string train_args(const std::string& run, int64_t batch, int64_t steps) const {
    return "--data " + (dir_ / "corpus.txt").string() +
           " --split 40K,8K,8K --device cpu --precision fp32 --dim 32 --depth 2 --heads 2 --dim-head 16"
           " --seq-len 32 --grad-accum 2 --lr 3e-3 --warmup 0 --schedule constant --log-every 1 --validate-every 5 --val-windows 10"
           " --generate-every 0 --save-every 1000 --checkpoint-dir " +
           (dir_ / "ckpt").string() + " --run " + run + " --batch " + std::to_string(batch) +
           " --steps " + std::to_string(steps);
  }
  std::string launch(int nproc, int port) const {
    return std::string("MASTER_PORT=") + std::to_string(port) + " bash \"" + FLASHCOS_SOURCE_DIR +
           "/scripts/launch.sh\" --nproc " + std::to_string(nproc) + " --grace 5 \"" + FLASHCOS_TRAIN_BIN + "\" ";
  }
  std::string single() const { return std::string("\"") + FLASHCOS_TRAIN_BIN + "\" "; }

  std::vector<nlohmann::json> metrics(const std::string& run, const std::string& event) const {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir_ / "ckpt" / run / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) {
        auto j = nlohmann::json::parse(line);
        if (j["event"] == event) out.push_back(j);
      }
    return out;
  }
  std::string ckpt(const std::string& run) const { return (dir_ / "ckpt" / run / "latest.pt").string(); }

  fs::path dir_;
};

TEST_F(DistributedTrain, TwoRanksMatchOneProcessWithTheSameGlobalBatch) {
  // 2 ranks x batch 2 x grad-accum 2 == 1 process x batch 4 x grad-accum 2.
  const RunResult two = run_shell(launch(2, free_port()) + train_args("two", 2, 5));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("rank 0 of 2"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("global batch 8"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("comm        Gloo;"), std::string::npos) << "the backend and its settings\n" << two.output;
  const RunResult one = run_shell(single() + train_args("one", 4, 5));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(one.output.find("rank"), std::string::npos) << "single process mentions ranks:\n" << one.output;

  const auto t2 = metrics("two", "train"), t1 = metrics("one", "train");
  ASSERT_EQ(t2.size(), 5u) << "only rank 0 writes metrics, one record per step";
  ASSERT_EQ(t1.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(t2[i]["loss"].get<double>(), t1[i]["loss"].get<double>(), 1e-5) << "step " << i + 1;
  }
  EXPECT_GT(t1[0]["loss"].get<double>() - t1[4]["loss"].get<double>(), 0.01) << "the loss should move";
  const auto v2 = metrics("two", "val"), v1 = metrics("one", "val");
  ASSERT_EQ(v2.size(), 1u);
  ASSERT_EQ(v1.size(), 1u);
  EXPECT_NEAR(v2[0]["loss"].get<double>(), v1[0]["loss"].get<double>(), 1e-5);

  // Checkpoints: same step, same sampler position, same weights to 1e-5 (the all-reduce sums in a
  // different order than one process does, and Adam's m / sqrt(v) magnifies that where gradients
  // are near zero: a few 1e-6 after 5 steps at lr 3e-3).
  flashcos::model::CheckpointMeta m2, m1;
  auto g2 = flashcos::model::load_model(ckpt("two"), torch::kCPU, &m2);
  auto g1 = flashcos::model::load_model(ckpt("one"), torch::kCPU, &m1);
  EXPECT_EQ(m2.state.step, 5);
  EXPECT_EQ(m2.state.step, m1.state.step);
  EXPECT_EQ(m2.state.sampler_state, m1.state.sampler_state);
  const auto p2 = g2->named_parameters(), p1 = g1->named_parameters();
  ASSERT_EQ(p2.size(), p1.size());
  for (const auto& kv : p1) {
    const auto& a = p2[kv.key()];
    EXPECT_TRUE(torch::allclose(a, kv.value(), 1e-4, 1e-5))
        << kv.key() << ": max diff " << (a - kv.value()).abs().max().item<double>();
  }
  // Rank 1 wrote nothing of its own: one metrics file, one checkpoint.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "ckpt"), fs::directory_iterator{}), 2);
}

TEST_F(DistributedTrain, TwoRankCheckpointResumesInOneProcess) {
  const RunResult two = run_shell(launch(2, free_port()) + train_args("resume", 2, 3));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  // Continue to step 5 alone with the same global batch (4 x 2), and compare with a 1-process run
  // that went 5 steps straight: same sampler stream, so the same losses.
  const RunResult more = run_shell(single() + train_args("resume", 4, 5) + " --resume " + ckpt("resume"));
  ASSERT_EQ(more.exit_code, 0) << more.output;
  EXPECT_NE(more.output.find("resumed at step 3"), std::string::npos) << more.output;
  const RunResult straight = run_shell(single() + train_args("straight", 4, 5));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const auto r = metrics("resume", "train"), s = metrics("straight", "train");
  ASSERT_EQ(r.size(), 5u);
  ASSERT_EQ(s.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(r[i]["loss"].get<double>(), s[i]["loss"].get<double>(), 1e-5) << "step " << i + 1;
}

TEST_F(DistributedTrain, KillingOneRankEndsTheOtherWithAnErrorNamingItsRank) {
  const int port = free_port();
  const std::string log0 = (dir_ / "rank0.log").string();
  auto spawn = [&](int rank, const std::string& log) {
    const std::string cmd = "RANK=" + std::to_string(rank) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                            std::to_string(port) + " exec " + single() + train_args("kill", 2, 100000) +
                            " --dist-timeout 20 > " + log + " 2>&1";
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  };
  const pid_t r0 = spawn(0, log0), r1 = spawn(1, (dir_ / "rank1.log").string());
  // Wait until training runs (rank 0 has written a few steps), then kill rank 1.
  const auto start = std::chrono::steady_clock::now();
  while (metrics("kill", "train").size() < 3 && std::chrono::steady_clock::now() - start < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(metrics("kill", "train").size(), 3u) << "training did not start";
  kill(r1, SIGKILL);
  waitpid(r1, nullptr, 0);
  const auto killed = std::chrono::steady_clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(r0, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() - killed < std::chrono::seconds(40))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (done == 0) {
    kill(r0, SIGKILL);
    waitpid(r0, nullptr, 0);
    FAIL() << "rank 0 still running 40 s after rank 1 died (timeout 20 s)";
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::ifstream in(log0);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << out;
  EXPECT_NE(out.find("error: rank 0 of 2"), std::string::npos) << out;
  EXPECT_LT(secs, 30.0) << out;
}

TEST_F(DistributedTrain, LauncherReturnsAFailingRanksStatus) {
  // Rank 1 fails at once; the others would sleep on without the grace period.
  const RunResult r = run_shell("bash \"" + std::string(FLASHCOS_SOURCE_DIR) +
                                "/scripts/launch.sh\" --nproc 3 --grace 1 sh -c '[ $RANK = 1 ] && exit 7; exec sleep 30'");
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("rank 1 exited with status 7"), std::string::npos) << r.output;
  const RunResult ok = run_shell("bash \"" + std::string(FLASHCOS_SOURCE_DIR) +
                                 "/scripts/launch.sh\" --nproc 2 sh -c 'echo r$RANK/$WORLD_SIZE/$LOCAL_RANK'");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("r0/2/0"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("r1/2/1"), std::string::npos) << ok.output;
  EXPECT_EQ(run_shell("bash \"" + std::string(FLASHCOS_SOURCE_DIR) + "/scripts/launch.sh\" --nproc 0 true").exit_code, 2);
}

TEST(DistEnv, TorchrunSlurmAndNone) {
  std::map<std::string, std::string> none;
  EXPECT_FALSE(detect_dist_env(&none).has_value());
  std::map<std::string, std::string> tr{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                        {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "1234"}};
  auto d = detect_dist_env(&tr);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rank, 3);
  EXPECT_EQ(d->world_size, 4);
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->master_addr, "node7");
  EXPECT_EQ(d->master_port, 1234);
  std::map<std::string, std::string> sl{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                        {"SLURM_JOB_NODELIST", "gpu[003-004,010],cpu1"}};
  d = detect_dist_env(&sl);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rank, 5);
  EXPECT_EQ(d->world_size, 8);
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->master_addr, "gpu003");
  EXPECT_EQ(d->source, "slurm");
  std::map<std::string, std::string> one_task{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}};
  EXPECT_FALSE(detect_dist_env(&one_task).has_value()) << "a one-task Slurm job is a plain run";
  EXPECT_EQ(flashcos::model::first_slurm_host("a,b"), "a");
  EXPECT_EQ(flashcos::model::first_slurm_host("n[12-15]"), "n12");
  std::map<std::string, std::string> bad{{"RANK", "2"}, {"WORLD_SIZE", "2"}};
  EXPECT_THROW(detect_dist_env(&bad), std::invalid_argument);
  std::map<std::string, std::string> no_world{{"RANK", "0"}};
  EXPECT_THROW(detect_dist_env(&no_world), std::invalid_argument);
}

}  // namespace
