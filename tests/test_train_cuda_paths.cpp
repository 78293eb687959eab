// The trainer's CUDA paths without the captured micro-step, as real ./train processes: --cuda-graph
// off and --precision fp16 (whose dynamic loss scale rules the graph out) each train several steps
// with the fused operators, where the q / k / v weight gradients are row blocks of one buffer
// (.grad views) that every step must drop and make anew. Skips without a CUDA device.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>

#include <flashcos/attention.h>

#include "tests/train_process_util.h"

namespace {

using train_test::RunResult;
using train_test::run_train;
using train_test::TempRun;

void expect_trains(const std::string& extra, const std::string& graph_line) {
  if (!torch::cuda::is_available() || !flashcos::fused_kernels_compiled())
    GTEST_SKIP() << "needs a CUDA device and the fused kernels";
  TempRun tmp;
  const RunResult r = run_train(tmp.tiny("--device cuda --use-cuda-kernel --seq-len 128 --dim 64 --heads 2 --dim-head 32 "
                                         "--grad-accum 2 --steps 4 --save-every 1000 --run r " + extra));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(graph_line), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 4/4"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("nan"), std::string::npos) << r.output;
}

TEST(TrainCli, CudaGraphOffTrainsSeveralSteps) {
  expect_trains("--cuda-graph off", "cuda graph  off (--cuda-graph off)");
}

TEST(TrainCli, CudaFp16WithLossScalingTrainsSeveralSteps) {
  expect_trains("--precision fp16", "cuda graph  off (fp16");
}

TEST(TrainCli, CudaGraphOnTrainsSeveralSteps) {
  expect_trains("--cuda-graph on", "cuda graph  on");
}

}  // namespace
