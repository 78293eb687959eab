// What the GPU tests of the fused attention share (test_attention_cuda.cpp and
// test_attention_cuda_misc.cpp): whether they can run, which kernel family a compute capability 9.0
// device should run, and the FusedAttentionMisc fixture (one suite name needs one fixture class, so
// both files take it from here).
#pragma once

#include <flashcos/attention.h>

#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>

namespace flashcos::test {

// A CUDA device and a build with the fused kernels.
inline bool have_fused_gpu() { return torch::cuda::is_available() && flashcos::fused_kernels_compiled(); }

// The build has the Hopper family, the device is compute capability 9.0 and FLASHCOS_HOPPER is not 0.
inline bool hopper_family_expected() {
#ifdef FLASHCOS_HAS_HOPPER
  const auto prop = at::cuda::getCurrentDeviceProperties();
  const char* env = std::getenv("FLASHCOS_HOPPER");
  return prop->major == 9 && prop->minor == 0 && (env == nullptr || env[0] != '0');
#else
  return false;
#endif
}

// Skipped without a GPU; FLASHCOS_POISON=1, so every output is NaN before the kernels write it.
class FusedAttentionMisc : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_fused_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
    setenv("FLASHCOS_POISON", "1", 1);
  }
};

}  // namespace flashcos::test
