#include "model/determinism.h"

#include <ATen/Context.h>

#include <cstdlib>
#include <stdexcept>

namespace flashcos::model {

std::string cublas_workspace_problem(const char* value) {
  if (value == nullptr) return "";
  const std::string v(value);
  if (v == ":4096:8" || v == ":16:8") return "";
  return "CUBLAS_WORKSPACE_CONFIG is '" + v + "', but deterministic cuBLAS GEMMs need ':4096:8' or ':16:8' " +
         "(unset it and --deterministic sets " + kDeterministicCublasWorkspace + ")";
}

DeterministicAlgorithms::DeterministicAlgorithms() {
  const char* workspace = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string problem = cublas_workspace_problem(workspace);
  if (!problem.empty()) throw std::invalid_argument("--deterministic: " + problem);
  if (workspace == nullptr) ::setenv("CUBLAS_WORKSPACE_CONFIG", kDeterministicCublasWorkspace, 1);
  auto& ctx = at::globalContext();
  algorithms_ = ctx.deterministicAlgorithms();
  warn_only_ = ctx.deterministicAlgorithmsWarnOnly();
  fill_ = ctx.deterministicFillUninitializedMemory();
  cudnn_deterministic_ = ctx.deterministicCuDNN();
  cudnn_benchmark_ = ctx.benchmarkCuDNN();
  ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
  ctx.setDeterministicFillUninitializedMemory(false);
  ctx.setDeterministicCuDNN(true);
  ctx.setBenchmarkCuDNN(false);
}

DeterministicAlgorithms::~DeterministicAlgorithms() {
  auto& ctx = at::globalContext();
  ctx.setDeterministicAlgorithms(algorithms_, warn_only_);
  ctx.setDeterministicFillUninitializedMemory(fill_);
  ctx.setDeterministicCuDNN(cudnn_deterministic_);
  ctx.setBenchmarkCuDNN(cudnn_benchmark_);
}

}  // namespace flashcos::model
