// gemm_at_b_accumulate (gemm_accumulate.h): one cuBLAS GemmEx call.
#include "model/fused/gemm_accumulate.h"

#include <c10/util/Exception.h>

#include <algorithm>

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>
#include <dlfcn.h>
#endif

namespace flashcos::model::fused {

#ifdef FLASHCOS_WITH_CUDA
namespace {

// cublasGemmEx (the C entry point, 32-bit sizes) from the libcuBLAS libtorch loaded (it is in the
// process's global scope).
using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                  const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                  cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

GemmEx gemm_ex() {
  static const auto fn = reinterpret_cast<GemmEx>(dlsym(RTLD_DEFAULT, "cublasGemmEx"));
  TORCH_CHECK(fn != nullptr, "flashcos gemm_at_b_accumulate: cublasGemmEx not found in the process (libtorch_cuda "
              "should have loaded libcublas)");
  return fn;
}

}  // namespace

void gemm_at_b_accumulate(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, float beta) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda() && a.device() == b.device() && c.device() == a.device(),
              "flashcos gemm_at_b_accumulate: a, b and c must be on one CUDA device");
  TORCH_CHECK((a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf) && b.scalar_type() == a.scalar_type(),
              "flashcos gemm_at_b_accumulate: a and b must both be bfloat16 or both float16, got ", a.scalar_type(),
              " and ", b.scalar_type());
  TORCH_CHECK(c.scalar_type() == at::kFloat, "flashcos gemm_at_b_accumulate: c must be float32, got ", c.scalar_type());
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2 && a.size(0) == b.size(0) && c.size(0) == a.size(1) &&
                  c.size(1) == b.size(1),
              "flashcos gemm_at_b_accumulate: shapes a ", a.sizes(), ", b ", b.sizes(), ", c ", c.sizes(),
              " are not (k, m), (k, n), (m, n)");
  TORCH_CHECK(a.stride(1) == 1 && b.stride(1) == 1 && c.stride(1) == 1,
              "flashcos gemm_at_b_accumulate: a, b and c need unit column strides");
  TORCH_CHECK(beta == 0.f || beta == 1.f, "flashcos gemm_at_b_accumulate: beta must be 0 or 1, got ", beta);
  const int64_t k = a.size(0), m = a.size(1), n = b.size(1);
  const int64_t lda = std::max<int64_t>(a.stride(0), std::max<int64_t>(m, 1));
  const int64_t ldb = std::max<int64_t>(b.stride(0), std::max<int64_t>(n, 1));
  const int64_t ldc = std::max<int64_t>(c.stride(0), std::max<int64_t>(n, 1));
  constexpr int64_t kMax = 0x7fffffff;
  TORCH_CHECK(k <= kMax && m <= kMax && n <= kMax && lda <= kMax && ldb <= kMax && ldc <= kMax,
              "flashcos gemm_at_b_accumulate: sizes beyond 32-bit cuBLAS arguments");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.f) c.zero_();
    return;
  }
  const c10::cuda::CUDAGuard guard(a.device());
  const cudaDataType_t in_type = a.scalar_type() == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.f;
  // Column-major view: C^T (n x m) = B^T (n x k) * A (k x m), A read transposed from its row-major (k x m).
  const cublasStatus_t status =
      gemm_ex()(at::cuda::getCurrentCUDABlasHandle(), CUBLAS_OP_N, CUBLAS_OP_T, int(n), int(m), int(k), &alpha,
                b.data_ptr(), in_type, int(ldb), a.data_ptr(), in_type, int(lda), &beta, c.data_ptr(), CUDA_R_32F,
                int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "flashcos gemm_at_b_accumulate: cublasGemmEx failed with status ",
              int(status), " (m ", m, ", n ", n, ", k ", k, ")");
}

#else

void gemm_at_b_accumulate(const at::Tensor&, const at::Tensor&, const at::Tensor&, float) {
  TORCH_CHECK(false, "flashcos gemm_at_b_accumulate: this build has no CUDA");
}

#endif

}  // namespace flashcos::model::fused
