// Tests of flashcos::l2norm: on the CPU against a float64 formula, and its fused CUDA kernels
// (flashcos::detail::l2norm_cuda_*, attention/l2norm/cuda/l2norm.cu), which flashcos::l2norm takes
// for CUDA tensors where they apply.
//
// CPU (run in CI):
//   L2NormCpu                     flashcos::l2norm vs a float64 formula (zero / tiny groups too).
// GPU (skipped without a CUDA device and the fused kernels; instantiated as Gpu/..., so
// --gtest_filter='Gpu/L2NormCuda*' selects them):
//   Gpu/L2NormCuda                the fused l2norm forward / backward vs float64, fp16 / bf16 / fp32,
//                                 strided views, zero and tiny (clamped) groups.
//   Gpu/L2NormCudaMisc            inputs the kernels do not take fall back correctly; the detail
//                                 API's strided outputs, float32 dy, misaligned / expanded dy.
// Errors are relative Frobenius errors against float64: f64 1e-12, f32 1e-5 (1e-6 on the CPU),
// fp16 / bf16 at most 2x the error of the same computation in plain libtorch ops in that dtype plus
// a floor of eps / 4. FLASHCOS_POISON=1 is set in the GPU suites: buffers the kernels should
// overwrite start as NaN, and no result may be NaN / inf.
#include <flashcos/attention.h>
#include "attention/l2norm/l2norm_cuda.h"
#include "tests/attention_test_util.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace flashcos::test;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool have_gpu() { return torch::cuda::is_available() && flashcos::fused_kernels_compiled(); }

std::string grad_fn_name(const at::Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : std::string("<none>"); }

// ---- l2norm references ------------------------------------------------------------------------

std::vector<int64_t> grouped_sizes(const at::Tensor& x, int64_t groups) {
  auto s = x.sizes().vec();
  s.back() = x.size(-1) / groups;
  s.insert(s.end() - 1, groups);
  return s;
}

struct NormRef {
  at::Tensor y, dx;  // float64, x's shape (contiguous)
  at::Tensor r;      // 1 / max(|x_g|, 1e-12): x.shape[:-1] + (groups,)
  at::Tensor dead;   // bool, x's shape: the element's group has |x_g| <= 1e-12 (clamped)
  at::Tensor zero;   // bool, x's shape: the element's group is all zero
};

// y = x / max(|x_g|, 1e-12) per group by plain float64 ops, dx by float64 autograd of sum(y * dy).
NormRef l2norm_reference(const at::Tensor& x, int64_t groups, const at::Tensor& dy) {
  const at::Tensor xd = x.detach().to(at::kDouble).contiguous().requires_grad_(true);
  const auto gs = grouped_sizes(xd, groups);
  const at::Tensor g = xd.reshape(gs);
  const at::Tensor sumsq = g.pow(2).sum(-1, /*keepdim=*/true);
  const at::Tensor norm = sumsq.clamp_min(1e-24).sqrt();  // = max(|x_g|, 1e-12), finite gradient at 0
  const at::Tensor y = (g / norm).reshape(xd.sizes());
  y.backward(dy.detach().to(at::kDouble).contiguous());
  NormRef r;
  r.y = y.detach();
  r.dx = xd.grad();
  r.r = (1.0 / norm.detach()).squeeze(-1);
  r.dead = (sumsq.detach() <= 1e-24).expand(gs).reshape(xd.sizes());
  r.zero = (sumsq.detach() == 0).expand(gs).reshape(xd.sizes());
  return r;
}

// The same with plain libtorch ops in x's dtype (the 16-bit error baseline): y, dx.
std::pair<at::Tensor, at::Tensor> l2norm_plain_ops(const at::Tensor& x, int64_t groups, const at::Tensor& dy) {
  const at::Tensor xl = x.detach().clone().requires_grad_(true);
  const at::Tensor g = xl.reshape(grouped_sizes(xl, groups));
  const std::vector<int64_t> last = {-1};
  const at::Tensor y = (g / at::linalg_vector_norm(g, 2, last, /*keepdim=*/true).clamp_min(1e-12)).reshape(xl.sizes());
  y.backward(dy.detach().to(x.scalar_type()));
  return {y.detach(), xl.grad()};
}

// rel_err over the elements where mask is true (0 when there are none).
double masked_err(const at::Tensor& a, const at::Tensor& ref, const at::Tensor& mask) {
  if (!mask.any().item<bool>()) return 0.0;
  const at::Tensor m = mask.to(a.device());
  return rel_err(a.detach().to(at::kDouble).contiguous().masked_select(m),
                 ref.detach().to(at::kDouble).to(a.device()).contiguous().masked_select(m));
}

// Largest elementwise relative difference |a - ref| / |ref| (ref nonzero).
double max_rel_diff(const at::Tensor& a, const at::Tensor& ref) {
  const at::Tensor r = ref.detach().to(at::kDouble).to(a.device());
  return ((a.detach().to(at::kDouble) - r).abs() / r.abs()).max().item<double>();
}

// Random float64 values of x's shape on x's device with some groups zeroed and one scaled below the
// clamp (|x_g| ~ 1e-13): the first row all zero, group 0 of the middle row zero (groups > 1), the
// last row tiny. Rows are the flattened leading dims.
at::Tensor norm_input_values(const at::Tensor& x, int64_t groups) {
  at::Tensor v = at::randn(x.sizes(), x.options().dtype(at::kDouble));
  const int64_t d = x.size(-1), gs = d / groups;
  at::Tensor flat = v.view({-1, d});
  const int64_t rows = flat.size(0);
  if (rows > 1) flat[0].zero_();
  if (groups > 1 && rows > 2) flat[rows / 2].narrow(0, 0, gs).zero_();
  if (rows > 3) flat[rows - 1].mul_(1e-14);
  return v;
}

// An upstream gradient for an l2norm test: random, scaled by 1e-12 in the clamped (dead) groups so
// that dx = dy / 1e-12 stays O(1) there (in fp16 it underflows to 0 and dx must be 0).
at::Tensor norm_upstream(const at::Tensor& x, const NormRef& pre, at::ScalarType dtype) {
  at::Tensor dy = at::randn(x.sizes(), x.options().dtype(at::kDouble));
  dy = at::where(pre.dead.to(dy.device()), dy * 1e-12, dy);
  return dy.to(dtype);
}

// ================================ CPU ==========================================================

// flashcos::l2norm on the CPU (float32 / float64): values and gradients against the float64
// formula, on a strided input with zero groups and a group below the clamp.
TEST(L2NormCpu, MatchesFloat64Reference) {
  at::manual_seed(53);
  for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
    for (int64_t groups : {1, 2, 4}) {
      SCOPED_TRACE(dtype_name(dt) + " groups " + std::to_string(groups));
      const at::Tensor x = at::empty({3, 9, 2, 64}, at::TensorOptions().dtype(dt)).transpose(1, 2);  // strided
      x.copy_(norm_input_values(x, groups));
      const NormRef pre = l2norm_reference(x, groups, at::zeros(x.sizes(), at::kDouble));
      const at::Tensor dy = norm_upstream(x, pre, dt);
      const NormRef ref = l2norm_reference(x, groups, dy);
      const at::Tensor xl = x.detach().requires_grad_(true);
      const at::Tensor y = flashcos::l2norm(xl, groups);
      ASSERT_EQ(y.sizes(), x.sizes());
      EXPECT_EQ(y.scalar_type(), dt);
      y.backward(dy);
      const double tol = dt == at::kDouble ? 1e-12 : 1e-6;
      EXPECT_LE(rel_err(y, ref.y), tol);
      EXPECT_LE(rel_err(xl.grad(), ref.dx), tol);
      EXPECT_LE(masked_err(xl.grad(), ref.dx, ref.dead), tol) << "clamped groups";
      EXPECT_EQ(y.masked_select(ref.zero).abs().max().item<double>(), 0.0) << "zero groups";
    }
  }
}

// ================================ GPU: l2norm kernels ==========================================

struct NormParam {
  at::ScalarType dtype;
  int64_t D, groups;
};

void PrintTo(const NormParam& p, std::ostream* os) { *os << dtype_name(p.dtype) << " d" << p.D << " g" << p.groups; }

class L2NormCuda : public ::testing::TestWithParam<NormParam> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
    setenv("FLASHCOS_POISON", "1", 1);
  }
};

enum class Layout { kContig, kTransposed, kNarrow };

std::string layout_name(Layout l) {
  switch (l) {
    case Layout::kContig: return "contiguous";
    case Layout::kTransposed: return "transposed";
    case Layout::kNarrow: return "narrow";
  }
  return "?";
}

// A tensor of about n rows of d: contiguous (n, d) ((d) for n = 1); a (2, n, 3, d) buffer
// transposed to (2, 3, n, d) (the (B, T, H, D) -> (B, H, T, D) view of a projection); or the
// columns 8 .. 8 + d of an (n, 2, d + 16) buffer filled with NaN (an out-of-row read shows).
at::Tensor make_layout(Layout l, int64_t n, int64_t d, const at::TensorOptions& o) {
  switch (l) {
    case Layout::kContig: return n == 1 ? at::empty({d}, o) : at::empty({n, d}, o);
    case Layout::kTransposed: return at::empty({2, n, 3, d}, o).transpose(1, 2);
    case Layout::kNarrow: return at::full({n, 2, d + 16}, kNaN, o).narrow(-1, 8, d);
  }
  return {};
}

TEST_P(L2NormCuda, ForwardBackwardVsFloat64) {
  const NormParam& prm = GetParam();
  const at::ScalarType dt = prm.dtype;
  const int64_t D = prm.D, G = prm.groups;
  const auto opts = at::TensorOptions().dtype(dt).device(at::kCUDA);
  for (int64_t n : {1, 63, 127, 1000}) {
    for (Layout layout : {Layout::kContig, Layout::kTransposed, Layout::kNarrow}) {
      const std::string name = "l2norm_" + dtype_name(dt) + "_d" + std::to_string(D) + "_g" + std::to_string(G) +
                               "_n" + std::to_string(n) + "_" + layout_name(layout);
      SCOPED_TRACE(name);
      at::manual_seed(int64_t(name_seed(name)));
      const at::Tensor x = make_layout(layout, n, D, opts);
      x.copy_(norm_input_values(x, G));
      ASSERT_TRUE(flashcos::detail::l2norm_cuda_supported(x, G)) << "the kernels should take " << x.sizes()
                                                                 << " strides " << x.strides();
      const NormRef pre = l2norm_reference(x, G, at::zeros(x.sizes(), x.options().dtype(at::kDouble)));
      const at::Tensor dy = norm_upstream(x, pre, dt);
      const NormRef ref = l2norm_reference(x, G, dy);

      // The public l2norm through autograd (the fused Function).
      const at::Tensor xl = x.detach().requires_grad_(true);  // same storage, strides and offset
      const at::Tensor y = flashcos::l2norm(xl, G);
      EXPECT_NE(grad_fn_name(y).find("L2NormCuda"), std::string::npos) << "grad_fn " << grad_fn_name(y);
      ASSERT_EQ(y.sizes(), x.sizes());
      EXPECT_EQ(y.scalar_type(), dt);
      y.backward(dy);
      const at::Tensor dx = xl.grad();
      ASSERT_TRUE(dx.defined());
      EXPECT_TRUE(at::isfinite(y).all().item<bool>()) << "NaN / inf in y";
      EXPECT_TRUE(at::isfinite(dx).all().item<bool>()) << "NaN / inf in dx";

      // The detail API: the same y, and r = 1 / max(|x_g|, 1e-12) as (..., groups) float32.
      const auto fr = flashcos::detail::l2norm_cuda_forward(x, G);
      EXPECT_TRUE(at::equal(fr.first, y.detach())) << "detail forward differs from l2norm()";
      auto r_sizes = x.sizes().vec();
      r_sizes.back() = G;
      EXPECT_EQ(fr.second.sizes(), at::IntArrayRef(r_sizes));
      EXPECT_EQ(fr.second.scalar_type(), at::kFloat);
      EXPECT_TRUE(fr.second.is_contiguous());
      EXPECT_LE(max_rel_diff(fr.second, ref.r.reshape(r_sizes)), 1e-5) << "r";

      // Groups with a norm above the clamp: 2x the plain-ops error in 16 bits, 1e-5 in fp32.
      const at::Tensor live = ref.dead.logical_not();
      const double ey = masked_err(y, ref.y, live), edx = masked_err(dx, ref.dx, live);
      double tol_y = 1e-5, tol_dx = 1e-5;
      if (dt != at::kFloat) {
        const auto base = l2norm_plain_ops(x, G, dy);
        const double by = masked_err(base.first, ref.y, live), bdx = masked_err(base.second, ref.dx, live);
        tol_y = 2 * by + dtype_eps(dt) / 4;
        tol_dx = 2 * bdx + dtype_eps(dt) / 4;
      }
      EXPECT_LE(ey, tol_y) << "y";
      EXPECT_LE(edx, tol_dx) << "dx";
      // Clamped groups: y = x / 1e-12 (exactly 0 for zero groups), dx = dy / 1e-12 (no projection).
      const double tol_dead = dt == at::kFloat ? 1e-5 : dtype_eps(dt);
      EXPECT_LE(masked_err(y, ref.y, ref.dead), tol_dead) << "y of clamped groups";
      EXPECT_LE(masked_err(dx, ref.dx, ref.dead), tol_dead) << "dx of clamped groups";
      if (ref.zero.any().item<bool>()) {
        EXPECT_EQ(y.to(at::kDouble).masked_select(ref.zero).abs().max().item<double>(), 0.0) << "y of zero groups";
      }
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "errors: y " << ey << " (tol " << tol_y << ") dx " << edx << " (tol " << tol_dx << ")";
        return;
      }
    }
  }
}

std::vector<NormParam> norm_params() {
  // Group sizes 8 .. 256: 1 .. 32 lanes per group.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{64, 1}, {64, 2}, {64, 4}, {64, 8}, {128, 1},
                                                           {128, 2}, {128, 4}, {32, 1}, {16, 1}, {8, 1},
                                                           {256, 1}};
  std::vector<NormParam> ps;
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat})
    for (const auto& s : shapes) ps.push_back({dt, s.first, s.second});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Gpu, L2NormCuda, ::testing::ValuesIn(norm_params()),
                         [](const ::testing::TestParamInfo<NormParam>& i) {
                           return dtype_name(i.param.dtype) + "_d" + std::to_string(i.param.D) + "_g" +
                                  std::to_string(i.param.groups);
                         });

class L2NormCudaMisc : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
    setenv("FLASHCOS_POISON", "1", 1);
  }
};

// Inputs the kernels do not take: l2norm_cuda_supported is false, flashcos::l2norm still gives the
// right values and gradients (libtorch fallback), the detail forward refuses with an error.
TEST_P(L2NormCudaMisc, UnsupportedInputsFallBack) {
  const at::ScalarType dt = GetParam();
  const auto o = at::TensorOptions().dtype(dt).device(at::kCUDA);
  at::manual_seed(61);
  struct U {
    std::string name;
    at::Tensor x;
    int64_t groups;
  };
  std::vector<U> cases = {
      {"d80_g1", at::randn({2, 63, 80}, o), 1},                          // group size 80: 10 lanes
      {"d96_g1", at::randn({2, 63, 96}, o), 1},                          // 12 lanes
      {"d72_g3", at::randn({127, 72}, o), 3},                            // group size 24: 3 lanes
      {"d512_g1", at::randn({63, 512}, o), 1},                           // 64 lanes > 32
      {"d12_g1", at::randn({63, 12}, o), 1},                             // not a multiple of 8
      {"d4_g1", at::randn({63, 4}, o), 1},                               // shorter than one vector
      {"misaligned_ptr", at::randn({127, 72}, o).narrow(-1, 2, 64), 1},  // data not 16-byte aligned
      {"row_stride_68", at::randn({127, 68}, o).narrow(-1, 0, 64), 2},   // row stride % 8 != 0
      {"five_dims", at::randn({2, 2, 3, 5, 64}, o), 2},
  };
  if (dt == at::kFloat) {
    cases.push_back({"cpu_tensor", at::randn({63, 64}, at::kFloat), 1});
    cases.push_back({"float64", at::randn({63, 64}, o.dtype(at::kDouble)), 2});
  }
  for (const U& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_FALSE(flashcos::detail::l2norm_cuda_supported(c.x, c.groups)) << c.x.sizes() << " " << c.x.strides();
    const at::Tensor dy = at::randn(c.x.sizes(), c.x.options());
    const NormRef ref = l2norm_reference(c.x, c.groups, dy);
    const at::Tensor xl = c.x.detach().requires_grad_(true);
    const at::Tensor y = flashcos::l2norm(xl, c.groups);
    EXPECT_EQ(grad_fn_name(y).find("L2NormCuda"), std::string::npos) << "grad_fn " << grad_fn_name(y);
    ASSERT_EQ(y.sizes(), c.x.sizes());
    EXPECT_EQ(y.scalar_type(), c.x.scalar_type());
    y.backward(dy);
    const at::ScalarType xt = c.x.scalar_type();
    double tol_y = xt == at::kDouble ? 1e-12 : 1e-5, tol_dx = tol_y;
    if (xt == at::kHalf || xt == at::kBFloat16) {
      const auto base = l2norm_plain_ops(c.x, c.groups, dy);
      tol_y = 2 * rel_err(base.first, ref.y) + dtype_eps(xt) / 4;
      tol_dx = 2 * rel_err(base.second, ref.dx) + dtype_eps(xt) / 4;
    }
    EXPECT_LE(rel_err(y, ref.y), tol_y) << "y";
    EXPECT_LE(rel_err(xl.grad(), ref.dx), tol_dx) << "dx";
    if (c.x.is_cuda() && c.x.scalar_type() != at::kDouble) {
      expect_error([&] { flashcos::detail::l2norm_cuda_forward(c.x, c.groups); }, {"unsupported"},
                   "detail forward on an unsupported input");
    }
  }
  // Group size 256 in two groups of a 512 dim: 32 lanes, the most the kernels take.
  EXPECT_TRUE(flashcos::detail::l2norm_cuda_supported(at::randn({63, 512}, o), 2));
}

// The detail API as the packed path uses it: y written into a strided slice of a bigger buffer,
// dx likewise from a float32 dy (the attention's dq accumulator), nothing outside the slices
// touched; dy misaligned (copied first) or expanded (stride 0) gives the same dx.
TEST_P(L2NormCudaMisc, DetailApiStridedOutputs) {
  const at::ScalarType dt = GetParam();
  const auto o = at::TensorOptions().dtype(dt).device(at::kCUDA);
  at::manual_seed(62);
  const int64_t B = 2, T = 127, H = 3, D = 64, G = 2;
  const at::Tensor packed = at::randn({B, T, 3, H, D}, o);
  const at::Tensor x = packed.select(2, 1).permute({0, 2, 1, 3});  // (B, H, T, D), the k of a projection
  const double sentinel = 7.0;
  const at::Tensor ybuf = at::full({B, T, 3, H, D}, sentinel, o);
  const at::Tensor y_out = ybuf.select(2, 0).permute({0, 2, 1, 3});
  const auto fr = flashcos::detail::l2norm_cuda_forward(x, G, y_out);
  EXPECT_EQ(fr.first.data_ptr(), y_out.data_ptr()) << "y not written into y_out";
  EXPECT_EQ(fr.first.strides(), y_out.strides());
  EXPECT_TRUE((ybuf.select(2, 1) == sentinel).all().item<bool>()) << "forward wrote outside y_out";
  EXPECT_TRUE((ybuf.select(2, 2) == sentinel).all().item<bool>()) << "forward wrote outside y_out";

  const at::Tensor dyf = at::randn({B, T, H, D}, o.dtype(at::kFloat)).permute({0, 2, 1, 3});  // float32, strided
  const NormRef ref = l2norm_reference(x, G, dyf);
  const double tol = dt == at::kFloat ? 1e-5 : dtype_eps(dt);  // one rounding of a float32 result
  EXPECT_LE(rel_err(fr.first, ref.y), tol) << "y";

  const at::Tensor dxbuf = at::full({B, T, 3, H, D}, sentinel, o);
  const at::Tensor dx_out = dxbuf.select(2, 1).permute({0, 2, 1, 3});
  const at::Tensor dx = flashcos::detail::l2norm_cuda_backward(dyf, x, fr.second, G, dx_out);
  EXPECT_EQ(dx.data_ptr(), dx_out.data_ptr()) << "dx not written into dx_out";
  EXPECT_TRUE((dxbuf.select(2, 0) == sentinel).all().item<bool>()) << "backward wrote outside dx_out";
  EXPECT_TRUE((dxbuf.select(2, 2) == sentinel).all().item<bool>()) << "backward wrote outside dx_out";
  EXPECT_LE(rel_err(dx, ref.dx), tol) << "dx from a float32 dy";
  // dy_scale (the attention's dq accumulator without its softmax scale): dx of dy times the scale,
  // written over the same slice (poisoned first), nothing outside it touched.
  {
    const double s = 13.7;
    const NormRef ref_s = l2norm_reference(x, G, dyf * s);
    dx_out.fill_(std::numeric_limits<double>::quiet_NaN());
    const at::Tensor dx_s = flashcos::detail::l2norm_cuda_backward(dyf, x, fr.second, G, dx_out, nullptr, s);
    EXPECT_EQ(dx_s.data_ptr(), dx_out.data_ptr()) << "dx not written into dx_out";
    EXPECT_LE(rel_err(dx_s, ref_s.dx), tol) << "dx from a float32 dy with dy_scale " << s;
    EXPECT_GT(rel_err(dx_s, ref.dx), 0.5) << "dy_scale ignored";
    EXPECT_TRUE((dxbuf.select(2, 0) == sentinel).all().item<bool>()) << "backward wrote outside dx_out";
    EXPECT_TRUE((dxbuf.select(2, 2) == sentinel).all().item<bool>()) << "backward wrote outside dx_out";
  }

  // A contiguous float32 dy 8 bytes past an aligned address: not 16-byte aligned, so the backward
  // must realign it (the contract: dy of any strides).
  const int64_t numel = B * H * T * D;
  const at::Tensor mis = at::empty({numel + 2}, o.dtype(at::kFloat)).narrow(0, 2, numel).view({B, H, T, D});
  mis.copy_(dyf);
  try {
    const at::Tensor dx_mis = flashcos::detail::l2norm_cuda_backward(mis, x, fr.second, G);
    EXPECT_LE(rel_err(dx_mis, ref.dx), tol) << "dx from a misaligned float32 dy";
  } catch (const c10::Error& e) {
    ADD_FAILURE() << "l2norm_cuda_backward threw on a misaligned contiguous dy: " << e.what_without_backtrace();
  }
  // The same through autograd, dy in x's dtype 2 elements past an aligned address.
  {
    const at::Tensor xl = x.detach().requires_grad_(true);
    const at::Tensor y = flashcos::l2norm(xl, G);
    const at::Tensor dy = at::empty({numel + 2}, o).narrow(0, 2, numel).view({B, H, T, D});
    dy.copy_(dyf);
    const NormRef ref_d = l2norm_reference(x, G, dy);
    try {
      y.backward(dy);
      EXPECT_LE(rel_err(xl.grad(), ref_d.dx), tol) << "dx from a misaligned dy through autograd";
    } catch (const c10::Error& e) {
      ADD_FAILURE() << "l2norm backward threw on a misaligned contiguous dy: " << e.what_without_backtrace();
    }
  }

  // Expanded dy (stride 0, as sum() gives) through autograd.
  const at::Tensor xl = x.detach().requires_grad_(true);
  flashcos::l2norm(xl, G).sum().backward();
  const NormRef ref1 = l2norm_reference(x, G, at::ones(x.sizes(), o.dtype(at::kDouble)));
  EXPECT_LE(rel_err(xl.grad(), ref1.dx), tol) << "dx from an expanded dy";
  EXPECT_TRUE(at::isfinite(xl.grad()).all().item<bool>());
}

INSTANTIATE_TEST_SUITE_P(Gpu, L2NormCudaMisc, ::testing::Values(at::kBFloat16, at::kHalf, at::kFloat),
                         [](const ::testing::TestParamInfo<at::ScalarType>& i) { return dtype_name(i.param); });

}  // namespace
