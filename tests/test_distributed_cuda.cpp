// Data-parallel training on two GPUs (NCCL), with real processes of the built ./train: two ranks
// with batch b follow one process with batch 2b (the same global batch, the same data stream), on
// the path the trainer takes on GPUs: the fused attention kernels, the fused operators (whose
// weight gradients then go through autograd, since the Reducer hooks their accumulation) and
// c10d's Reducer over NCCL. Skips without two CUDA devices (CI, one-GPU machines).
//
// Precision fp32, so that one process and two ranks differ only in the order of the sums (the
// micro-batch split and the all-reduce): the losses agree to 1e-4, the weights to a small fraction
// of how far they moved. A rank that trained on its own gradients (no averaging) or on the wrong
// rows would move the weights by a comparable amount in other directions and fail the check.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <torch/torch.h>


#include <cmath>
#include <string>
#include <vector>

#include "flashcos/attention.h"
#include "model/checkpoint.h"
#include "tests/train_process_util.h"

namespace {

using train_test::free_port;
using train_test::metrics;
using train_test::quote;
using train_test::RunResult;
using train_test::run_shell;
using train_test::TempRun;

TEST(DistributedTrainCuda, TwoNcclRanksFollowOneProcessWithTheSameGlobalBatch) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2 || !flashcos::fused_kernels_compiled())
    GTEST_SKIP() << "needs two CUDA devices and the fused kernels";
  TempRun tmp;
  const auto args = [&](const std::string& run, int batch) {
    return tmp.tiny("--device cuda --precision fp32 --use-cuda-kernel --seq-len 128 --dim 64 --depth 2 --heads 2 "
                    "--dim-head 32 --grad-accum 2 --lr 3e-3 --steps 6 --validate-every 6 --val-windows 8 "
                    "--save-every 1000 --run " + run + " --batch " + std::to_string(batch));
  };
  const std::string launch = "MASTER_PORT=" + std::to_string(free_port()) + " bash " +
                             quote(std::string(FLASHCOS_SOURCE_DIR) + "/scripts/launch.sh") + " --nproc 2 --grace 5 " +
                             quote(FLASHCOS_TRAIN_BIN) + " ";
  const RunResult two = run_shell(launch + args("two", 2));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("rank 0 of 2"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("nccl"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("comm        NCCL "), std::string::npos) << "the NCCL version and settings\n" << two.output;
  const RunResult one = run_shell(quote(FLASHCOS_TRAIN_BIN) + " " + args("one", 4));
  ASSERT_EQ(one.exit_code, 0) << one.output;

  const auto t2 = metrics(tmp.run_dir("two"), "train");
  const auto t1 = metrics(tmp.run_dir("one"), "train");
  ASSERT_EQ(t2.size(), 6u) << "rank 0 writes one record per step";
  ASSERT_EQ(t1.size(), 6u);
  for (size_t i = 0; i < t1.size(); ++i)
    EXPECT_NEAR(t2[i]["loss"].get<double>(), t1[i]["loss"].get<double>(), 1e-4) << "step " << i + 1;
  EXPECT_GT(t1[0]["loss"].get<double>() - t1[5]["loss"].get<double>(), 0.05) << "the loss should move";
  const auto v2 = metrics(tmp.run_dir("two"), "val");
  const auto v1 = metrics(tmp.run_dir("one"), "val");
  ASSERT_EQ(v2.size(), 1u);
  ASSERT_EQ(v1.size(), 1u);
  EXPECT_NEAR(v2[0]["loss"].get<double>(), v1[0]["loss"].get<double>(), 1e-4);

  // Weights: the two runs' updates agree to 2 % of the update's own size, tensor by tensor.
  flashcos::model::CheckpointMeta m2, m1;
  auto g2 = flashcos::model::load_model(tmp.run_dir("two") + "/latest.pt", torch::kCPU, &m2);
  auto g1 = flashcos::model::load_model(tmp.run_dir("one") + "/latest.pt", torch::kCPU, &m1);
  EXPECT_EQ(m2.state.step, 6);
  EXPECT_EQ(m2.state.sampler_state, m1.state.sampler_state);
  const auto p2 = g2->named_parameters(), p1 = g1->named_parameters();
  ASSERT_EQ(p2.size(), p1.size());
  double apart = 0;
  for (const auto& kv : p1) {
    const auto& a = p2[kv.key()];
    ASSERT_TRUE(torch::isfinite(a).all().item<bool>()) << kv.key();
    apart += (a - kv.value()).to(torch::kDouble).pow(2).sum().item<double>();
  }
  // The distance moved from initialisation is not in the checkpoint; Adam's steps are about lr
  // per element and step, so 6 steps move a tensor of n elements by about 6 lr sqrt(n).
  int64_t n = 0;
  for (const auto& kv : p1) n += kv.value().numel();
  const double moved = 6 * 3e-3 * std::sqrt(double(n));
  EXPECT_LT(std::sqrt(apart), 0.02 * moved) << "two ranks' weights are " << std::sqrt(apart)
                                             << " from one process's; the updates' size is about " << moved;
}

}  // namespace
