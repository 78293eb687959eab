// The torch side of the fused l2norm kernels (attention/l2norm/cuda/l2norm.h): tensors in, Params out,
// one launch on the current stream, every CUDA call checked.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <flashcos/rotary.h>
#include "attention/common/poison.h"
#include "attention/l2norm/l2norm_cuda.h"

#ifdef FLASHCOS_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>
#include <tuple>

#include "attention/l2norm/cuda/l2norm.h"
#endif

namespace flashcos::detail {

#ifdef FLASHCOS_WITH_CUDA
namespace {

namespace fc = flashcos::cuda;

bool norm_dtype(at::ScalarType t, fc::DType& out) {
  switch (t) {
    case at::kHalf: out = fc::DType::kHalf; return true;
    case at::kBFloat16: out = fc::DType::kBFloat16; return true;
    case at::kFloat: out = fc::DType::kFloat; return true;
    default: return false;
  }
}

// t as the kernels' 4-D view: (n0, n1, n2, D) with leading size-1 dims for fewer than 4 dims.
bool describe(const at::Tensor& t, fc::NormTensor& out) {
  if (t.dim() < 1 || t.dim() > 4 || !norm_dtype(t.scalar_type(), out.dtype)) return false;
  if (t.stride(-1) != 1 && t.size(-1) > 1) return false;
  int64_t s[3] = {0, 0, 0};
  for (int64_t d = 0; d + 1 < t.dim(); ++d) s[3 - (t.dim() - 1) + d] = t.size(d) == 1 ? 0 : t.stride(d);
  out.ptr = t.data_ptr();
  out.s0 = s[0], out.s1 = s[1], out.s2 = s[2];
  return true;
}

fc::L2NormParams shape_params(const at::Tensor& x, int64_t groups) {
  fc::L2NormParams p;
  int64_t n[3] = {1, 1, 1};
  for (int64_t d = 0; d + 1 < x.dim(); ++d) n[3 - (x.dim() - 1) + d] = x.size(d);
  p.n0 = n[0], p.n1 = n[1], p.n2 = n[2];
  p.D = int(x.size(-1));
  p.groups = int(groups);
  return p;
}

// The rotation tables of offset 0 (every training step's q and k, forward and backward), kept per
// device, length and rotation: filled once, by one launch and a wait for it (so that any stream may
// read them after), instead of a fill kernel before every l2norm launch (4 a layer). Not while
// the stream is being captured into a CUDA graph (no wait allowed there) and the table is not
// there yet: such launches fill their own table as before. Tables are kept for the life of the
// process (a captured graph may read them): n2 x gs / 2 x 8 bytes each, 1 MiB at n 8192, gs 64.
struct RotaryTableKey {
  int device;
  int64_t n2, gs;
  double base;
  bool operator<(const RotaryTableKey& o) const {
    return std::tie(device, n2, gs, base) < std::tie(o.device, o.n2, o.gs, o.base);
  }
};

at::Tensor cached_rotary_table(const fc::L2NormParams& p, const RotaryArgs& rotary, const at::Tensor& like) {
  static std::mutex mutex;
  // Never destroyed: at exit the CUDA allocator may be gone before a static map's destructor ran.
  static auto& tables = *new std::map<RotaryTableKey, at::Tensor>();
  const std::lock_guard<std::mutex> lock(mutex);
  const RotaryTableKey key{like.get_device(), p.n2, p.D / p.groups, rotary.base};
  const auto it = tables.find(key);
  if (it != tables.end()) return it->second;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return {};
  at::Tensor table = at::empty({p.n2 * (key.gs / 2) * 2}, like.options().dtype(at::kFloat));
  fc::L2NormParams fill = p;
  fill.rotary_table = reinterpret_cast<float2*>(table.data_ptr<float>());
  C10_CUDA_CHECK(fc::run_rotary_table(fill, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  tables.emplace(key, table);
  return table;
}

// Sets the rotation of p and its table (n2 x pairs float2; see L2NormParams::rotary_table): the
// cached one at offset 0, else a fresh one that the launch fills; returned so that it lives until
// the launches are queued.
at::Tensor set_rotary(fc::L2NormParams& p, const RotaryArgs* rotary, const at::Tensor& like) {
  if (rotary == nullptr) return {};
  const int64_t gs = p.D / p.groups;
  TORCH_CHECK(gs % 2 == 0 && gs / 2 <= fc::kMaxRotaryPairs, "flashcos l2norm rotary: group size ", gs,
              " must be even and at most ", 2 * fc::kMaxRotaryPairs);
  const auto inv = rotary_inv_freq(gs, rotary->base);
  p.rotary = true;
  p.pos_offset = rotary->offset;
  for (size_t m = 0; m < inv.size(); ++m) p.inv_freq[m] = inv[m];
  at::Tensor table = rotary->offset == 0 ? cached_rotary_table(p, *rotary, like) : at::Tensor();
  p.rotary_table_filled = table.defined();
  if (!table.defined()) table = at::empty({p.n2 * (gs / 2) * 2}, like.options().dtype(at::kFloat));
  p.rotary_table = reinterpret_cast<float2*>(table.data_ptr<float>());
  return table;
}

std::vector<int64_t> r_sizes(const at::Tensor& x, int64_t groups) {
  auto sizes = x.sizes().vec();
  sizes.back() = groups;
  return sizes;
}

}  // namespace

bool l2norm_cuda_supported(const at::Tensor& x, int64_t groups) {
  if (!x.is_cuda() || x.dim() < 1 || x.dim() > 4 || groups < 1 || x.size(-1) % groups != 0) return false;
  if (x.size(-1) > std::numeric_limits<int>::max()) return false;
  fc::L2NormParams p = shape_params(x, groups);
  return describe(x, p.x) && fc::l2norm_supported(p);
}

std::pair<at::Tensor, at::Tensor> l2norm_cuda_forward(const at::Tensor& x, int64_t groups, const at::Tensor& y_out,
                                                      const RotaryArgs* rotary) {
  TORCH_CHECK(l2norm_cuda_supported(x, groups), "flashcos l2norm_cuda_forward: unsupported input ", x.sizes(), " ",
              x.scalar_type(), " with ", groups, " groups");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = y_out.defined() ? y_out : at::empty(x.sizes(), x.options());
  TORCH_CHECK(y.sizes() == x.sizes() && y.scalar_type() == x.scalar_type() && y.device() == x.device(),
              "flashcos l2norm_cuda_forward: y must match x");
  at::Tensor r = at::empty(r_sizes(x, groups), x.options().dtype(at::kFloat));
  fc::L2NormParams p = shape_params(x, groups);
  describe(x, p.x);
  TORCH_CHECK(describe(y, p.y), "flashcos l2norm_cuda_forward: y needs a contiguous last dim");
  poison_if_requested(y);
  poison_if_requested(r);
  p.r = r.data_ptr<float>();
  const at::Tensor table = set_rotary(p, rotary, x);
  C10_CUDA_CHECK(fc::run_l2norm_fwd(p, c10::cuda::getCurrentCUDAStream()));
  return {y, r};
}

at::Tensor l2norm_cuda_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& r, int64_t groups,
                                const at::Tensor& dx_out, const RotaryArgs* rotary, double dy_scale) {
  TORCH_CHECK(l2norm_cuda_supported(x, groups), "flashcos l2norm_cuda_backward: unsupported input ", x.sizes(),
              " ", x.scalar_type(), " with ", groups, " groups");
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.device() == x.device(), "flashcos l2norm_cuda_backward: dy ",
              dy.sizes(), " must match x ", x.sizes());
  TORCH_CHECK(r.is_contiguous() && r.scalar_type() == at::kFloat && r.sizes() == at::IntArrayRef(r_sizes(x, groups)),
              "flashcos l2norm_cuda_backward: r must be the forward's contiguous float32 (..., groups) tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = dx_out.defined() ? dx_out : at::empty(x.sizes(), x.options());
  TORCH_CHECK(dx.sizes() == x.sizes() && dx.scalar_type() == x.scalar_type() && dx.device() == x.device(),
              "flashcos l2norm_cuda_backward: dx must match x");
  fc::L2NormParams p = shape_params(x, groups);
  describe(x, p.x);
  TORCH_CHECK(dy.scalar_type() == at::kHalf || dy.scalar_type() == at::kBFloat16 || dy.scalar_type() == at::kFloat,
              "flashcos l2norm_cuda_backward: dy must be float16, bfloat16 or float32, got ", dy.scalar_type());
  at::Tensor dy_k = dy;
  if (!describe(dy_k, p.dy) || !fc::l2norm_aligned(p.dy)) {
    dy_k = dy.clone(at::MemoryFormat::Contiguous);  // fresh, so 16-byte aligned
    describe(dy_k, p.dy);
  }
  TORCH_CHECK(describe(dx, p.dx), "flashcos l2norm_cuda_backward: dx needs a contiguous last dim");
  poison_if_requested(dx);
  p.r = const_cast<float*>(r.data_ptr<float>());
  p.dy_scale = float(dy_scale);
  const at::Tensor table = set_rotary(p, rotary, x);
  C10_CUDA_CHECK(fc::run_l2norm_bwd(p, c10::cuda::getCurrentCUDAStream()));
  return dx;
}

#else  // no CUDA in this build

bool l2norm_cuda_supported(const at::Tensor&, int64_t) { return false; }

std::pair<at::Tensor, at::Tensor> l2norm_cuda_forward(const at::Tensor&, int64_t, const at::Tensor&, const RotaryArgs*) {
  TORCH_CHECK(false, "flashcos: this build has no CUDA kernels");
}

at::Tensor l2norm_cuda_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&,
                                const RotaryArgs*, double) {
  TORCH_CHECK(false, "flashcos: this build has no CUDA kernels");
}

#endif

}  // namespace flashcos::detail
