// Tensor -> Params bridge for the Fastmax CUDA kernels (attention/fastmax/cuda/fastmax.cu). In a build
// without nvcc (no FLASHCOS_WITH_CUDA) the entry points raise a clear error instead.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <flashcos/fastmax.h>
#include "attention/fastmax/fastmax_impl.h"

#ifdef FLASHCOS_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "attention/fastmax/cuda/fastmax.cuh"
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

bool fastmax_fused_scan_available(const at::Tensor& x) {
#ifdef FLASHCOS_WITH_CUDA
  return x.is_cuda() && x.scalar_type() == at::kBFloat16 && x.dim() == 3 &&
         cuda::fastmax_scan_supported(int(x.size(2))) && x.size(0) <= 65535 && x.size(1) <= (int64_t{1} << 30);
#else
  return false;
#endif
}

FastmaxScanResult fastmax_fused_scan_cuda(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w,
                                          const at::Tensor& g, const FastmaxCoef& c, bool causal, bool want_out) {
#ifdef FLASHCOS_WITH_CUDA
  TORCH_CHECK(fastmax_fused_scan_available(x) && y.scalar_type() == at::kBFloat16 && y.size(2) == x.size(2),
              "fastmax: the fused scan needs bf16 x, y with head dim 16, 32 or 64; got ", x.scalar_type(), " ",
              x.sizes(), " and ", y.scalar_type(), " ", y.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t N = x.size(0), Lx = x.size(1), Ly = y.size(1), D = x.size(2), E = w.size(2);
  const int64_t Ep = (E + 15) / 16 * 16;
  // The kernel reads 16-column float32 slices (16-byte aligned rows): w, g, out padded to Ep columns.
  const at::TensorOptions f32 = x.options().dtype(at::kFloat);
  auto padded = [&](const at::Tensor& t) {
    at::Tensor r = at::zeros({N, t.size(1), Ep}, f32);
    r.narrow(-1, 0, E).copy_(t);
    return r;
  };
  at::Tensor xc = x.contiguous(), yc = y.contiguous();
  at::Tensor wp = padded(w);
  at::Tensor gp = g.defined() ? padded(g) : at::Tensor();
  at::Tensor out = want_out ? at::zeros({N, Lx, Ep}, f32) : at::Tensor();
  at::Tensor gx = g.defined() ? at::zeros({N, Lx, D}, f32) : at::Tensor();
  cuda::FastmaxScanParams p;
  p.x = xc.data_ptr();
  p.y = yc.data_ptr();
  p.w = wp.data_ptr<float>();
  p.g = gp.defined() ? gp.data_ptr<float>() : nullptr;
  p.out = out.defined() ? out.data_ptr<float>() : nullptr;
  p.gx = gx.defined() ? gx.data_ptr<float>() : nullptr;
  p.n = N;
  p.lx = int(Lx);
  p.ly = int(Ly);
  p.d = int(D);
  p.ep = int(Ep);
  p.p = int(c.p);
  p.a0 = float(c.a0);
  p.a1 = float(c.a1);
  p.a2 = float(c.a2);
  p.causal = causal;
  const cudaError_t err = cuda::launch_fastmax_scan(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fastmax: fused scan kernel launch failed: ", cudaGetErrorString(err));
  FastmaxScanResult r;
  if (want_out) r.out = out.narrow(-1, 0, E);
  r.gx = gx;
  return r;
#else
  TORCH_CHECK(false, "fastmax: this build has no CUDA kernels (nvcc was not found at configure time)");
#endif
}

}  // namespace detail
}  // namespace flashcos
