// What --deterministic switches on besides the fused attention's deterministic backward
// (ModelConfig::deterministic): libtorch's own kernels in deterministic mode, so that every path of
// the step repeats itself bit for bit on one GPU model, not only the fused one: the composite ops
// (FLASHCOS_FUSED_OPS=0), --attention-impl sdpa, and whatever libtorch runs around them.
#pragma once

#include <string>

namespace flashcos::model {

// The value libtorch and cuBLAS need in CUBLAS_WORKSPACE_CONFIG for repeatable GEMMs.
inline constexpr const char* kDeterministicCublasWorkspace = ":4096:8";

// Why a CUBLAS_WORKSPACE_CONFIG value (nullptr: unset) rules out deterministic GEMMs, "" when it
// does not: unset, ":4096:8" and ":16:8" are fine (an unset one is set by DeterministicAlgorithms).
std::string cublas_workspace_problem(const char* value);

// While it lives: libtorch's deterministic algorithms (an op with no deterministic implementation
// then throws, naming itself, instead of summing in a different order each run), cuDNN's
// deterministic mode without its benchmark search, and cuBLAS's fixed workspace
// (CUBLAS_WORKSPACE_CONFIG, set to kDeterministicCublasWorkspace when unset and left set; libtorch
// refuses a CUDA GEMM in deterministic mode without it). Uninitialised memory is not filled (a cost
// on every allocation; our code reads nothing it has not written). Make it before the process's
// first cuBLAS call; the destructor restores libtorch's previous flags. Throws
// std::invalid_argument when CUBLAS_WORKSPACE_CONFIG holds another value.
class DeterministicAlgorithms {
 public:
  DeterministicAlgorithms();
  ~DeterministicAlgorithms();
  DeterministicAlgorithms(const DeterministicAlgorithms&) = delete;
  DeterministicAlgorithms& operator=(const DeterministicAlgorithms&) = delete;

 private:
  bool algorithms_, warn_only_, fill_, cudnn_deterministic_, cudnn_benchmark_;
};

}  // namespace flashcos::model
