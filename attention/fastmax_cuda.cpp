// Tensor -> Params bridge for the Fastmax CUDA kernels (attention/cuda/fastmax.cu). In a build
// without nvcc (no FLASHCOS_WITH_CUDA) the entry points raise a clear error instead.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "attention/fastmax.h"
#include "attention/fastmax_impl.h"

#ifdef FLASHCOS_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "attention/cuda/fastmax.cuh"
#endif

namespace flashcos {

bool fastmax_cuda_compiled() {
#ifdef FLASHCOS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace detail {

#ifdef FLASHCOS_WITH_CUDA
namespace {

bool kernel_dtype(at::ScalarType t, cuda::FmDtype* out) {
  switch (t) {
    case at::kDouble: *out = cuda::FmDtype::kF64; return true;
    case at::kFloat: *out = cuda::FmDtype::kF32; return true;
    case at::kBFloat16: *out = cuda::FmDtype::kBF16; return true;
    case at::kHalf: *out = cuda::FmDtype::kF16; return true;
    default: return false;
  }
}

}  // namespace
#endif

at::Tensor fastmax_features_cuda(const at::Tensor& x, const FastmaxCoef& c, bool with_coef) {
#ifdef FLASHCOS_WITH_CUDA
  cuda::FmDtype dt;
  const int64_t D = x.size(-1);
  // float64 and very wide heads take the libtorch formulation (same math).
  if (!kernel_dtype(x.scalar_type(), &dt) || D > cuda::kFastmaxMaxHeadDim) return fastmax_features(x, c, with_coef);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor xc = x.contiguous();
  const int64_t F = fastmax_num_features(c.p, D);
  auto shape = x.sizes().vec();
  shape.back() = F;
  at::Tensor phi = at::empty(shape, x.options());
  cuda::FastmaxFeatureParams p;
  p.x = xc.data_ptr();
  p.phi = phi.data_ptr();
  p.rows = xc.numel() / D;
  p.d = int(D);
  p.f = int(F);
  p.p = int(c.p);
  p.c0 = with_coef ? float(c.a0) : 1.f;
  p.c1 = with_coef ? float(c.a1) : 1.f;
  p.c2 = with_coef ? float(c.a2) : 1.f;
  p.offdiag = with_coef ? 2.f : 1.f;
  p.dtype = dt;
  const cudaError_t err = cuda::launch_fastmax_features(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fastmax: feature kernel launch failed: ", cudaGetErrorString(err));
  return phi;
#else
  TORCH_CHECK(false, "fastmax: this build has no CUDA kernels (nvcc was not found at configure time)");
#endif
}

at::Tensor fastmax_feature_grad_cuda(const at::Tensor& u, const at::Tensor& x, const FastmaxCoef& c) {
#ifdef FLASHCOS_WITH_CUDA
  cuda::FmDtype dt;
  const int64_t D = x.size(-1);
  const at::ScalarType ut = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (!kernel_dtype(x.scalar_type(), &dt) || u.scalar_type() != ut || D > cuda::kFastmaxMaxHeadDim)
    return fastmax_feature_grad(u, x, c);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor uc = u.contiguous(), xc = x.contiguous();
  const int64_t F = fastmax_num_features(c.p, D);
  TORCH_CHECK(uc.size(-1) == F, "fastmax: feature gradient expects ", F, " features, got ", uc.size(-1));
  at::Tensor gx = at::empty({uc.size(0), D}, u.options());
  cuda::FastmaxFeatureGradParams p;
  p.u = uc.data_ptr();
  p.x = xc.data_ptr();
  p.gx = gx.data_ptr();
  p.rows = uc.size(0);
  p.d = int(D);
  p.f = int(F);
  p.p = int(c.p);
  p.c1 = float(c.a1);
  p.c2 = float(c.a2);
  p.dtype = dt;
  const cudaError_t err = cuda::launch_fastmax_feature_grad(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fastmax: feature-gradient kernel launch failed: ", cudaGetErrorString(err));
  return gx;
#else
  TORCH_CHECK(false, "fastmax: this build has no CUDA kernels (nvcc was not found at configure time)");
#endif
}

}  // namespace detail
}  // namespace flashcos
