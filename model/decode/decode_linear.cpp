// The decode step's one-row linear layer on libtorch tensors (decode_linear.h): checks, launch.
#include "model/decode/decode_linear.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "model/decode/cuda/decode_linear.h"
#include "model/kernel_tensors.h"
#endif

namespace flashcos::model {

#ifdef FLASHCOS_WITH_CUDA
namespace {

namespace fc = flashcos::cuda;

fc::DType dtype_of(at::ScalarType t) { return kernel_dtype(t, "decode_linear"); }

}  // namespace

bool decode_linear_available(const at::Device& device, int64_t k) {
  const char* env = std::getenv("FLASHCOS_DECODE_LINEAR");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  return device.is_cuda() && k <= fc::kDecodeLinearMaxK && fc::decode_linear_supported(static_cast<int>(k));
}

void decode_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& out,
                   const at::Tensor& ln_gamma, const at::Tensor& ln_beta, double ln_eps, bool gelu, bool accumulate,
                   const DecodeLinearFolds& folds) {
  TORCH_CHECK(w.dim() == 2 && w.is_cuda() && w.is_contiguous() && aligned16(w), "decode_linear: w ", w.sizes(),
              " must be a contiguous, 16-byte aligned (N, K) CUDA matrix");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(fc::decode_linear_supported(static_cast<int>(std::min<int64_t>(K, 1 << 30))),
              "decode_linear: K = ", K, " is not a multiple of 8 in [8, ", fc::kDecodeLinearMaxK, "]");
  const bool table = folds.token.defined();
  TORCH_CHECK(x.is_contiguous() && aligned16(x) && x.device() == w.device() &&
                  (table ? x.dim() == 2 && x.size(1) == K : x.numel() == K) &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == w.scalar_type()),
              "decode_linear: x must be a contiguous, 16-byte aligned ", table ? "(rows, " : "(1, ", K,
              ") on w's device in float32 or w's dtype");
  TORCH_CHECK(!table || (folds.token.scalar_type() == at::kLong && folds.token.numel() == 1 &&
                         folds.token.device() == w.device()),
              "decode_linear: token must be one int64 on w's device");
  const bool store = folds.x_store.defined();
  TORCH_CHECK(!store || (table && folds.x_store.scalar_type() == at::kFloat && folds.x_store.is_contiguous() &&
                         aligned16(folds.x_store) && folds.x_store.numel() == K &&
                         folds.x_store.device() == w.device()),
              "decode_linear: x_store must be a contiguous, 16-byte aligned (1, ", K,
              ") float32 on w's device, with a token");
  TORCH_CHECK(!folds.pos.defined() || (folds.pos.scalar_type() == at::kLong && folds.pos.numel() == 1 &&
                                       folds.pos.device() == w.device()),
              "decode_linear: pos must be one int64 on w's device");
  TORCH_CHECK(out.is_contiguous() && out.numel() == N && out.device() == w.device() &&
                  (out.scalar_type() == at::kFloat || (!accumulate && out.scalar_type() == w.scalar_type())),
              "decode_linear: out must be a contiguous (1, ", N, ") on w's device, float32",
              accumulate ? " (accumulate)" : " or w's dtype");
  TORCH_CHECK(!bias.defined() || (bias.is_contiguous() && bias.numel() == N && bias.scalar_type() == w.scalar_type() &&
                                  bias.device() == w.device()),
              "decode_linear: bias must be (", N, ") in w's dtype");
  const bool ln = ln_gamma.defined();
  TORCH_CHECK(!ln || (ln_beta.defined() && ln_gamma.scalar_type() == at::kFloat && ln_beta.scalar_type() == at::kFloat &&
                      ln_gamma.is_contiguous() && ln_beta.is_contiguous() && aligned16(ln_gamma) &&
                      aligned16(ln_beta) && ln_gamma.numel() == K && ln_beta.numel() == K &&
                      ln_gamma.device() == w.device() && ln_beta.device() == w.device()),
              "decode_linear: ln_gamma / ln_beta must be contiguous, 16-byte aligned (", K, ") float32 on w's device");
  const bool aliased = x.data_ptr() == out.data_ptr() || (store && folds.x_store.data_ptr() == out.data_ptr());
  TORCH_CHECK(!(accumulate && aliased),
              "decode_linear: the accumulated out cannot be x or x_store (other warps read x while it changes)");
  fc::DecodeLinearParams p;
  p.x = x.data_ptr(), p.x_dtype = dtype_of(x.scalar_type());
  if (table) p.token = folds.token.data_ptr<int64_t>();
  if (store) p.x_store = folds.x_store.data_ptr<float>();
  if (folds.pos.defined()) p.pos = folds.pos.data_ptr<int64_t>();
  if (ln) p.ln_gamma = ln_gamma.data_ptr<float>(), p.ln_beta = ln_beta.data_ptr<float>();
  p.ln_eps = static_cast<float>(ln_eps);
  p.w = w.data_ptr(), p.w_dtype = dtype_of(w.scalar_type());
  p.bias = bias.defined() ? bias.data_ptr() : nullptr;
  p.out = out.data_ptr(), p.out_dtype = dtype_of(out.scalar_type());
  p.n = static_cast<int>(N), p.k = static_cast<int>(K);
  p.gelu = gelu, p.accumulate = accumulate;
  const c10::cuda::CUDAGuard guard(w.device());
  C10_CUDA_CHECK(fc::run_decode_linear(p, at::cuda::getCurrentCUDAStream()));
}

#else

bool decode_linear_available(const at::Device&, int64_t) { return false; }

void decode_linear(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                   const at::Tensor&, double, bool, bool, const DecodeLinearFolds&) {
  throw std::invalid_argument("decode_linear: this build has no CUDA");
}

#endif

}  // namespace flashcos::model
