// Tests of the packed-QKV entry point (flashcos::cosine_sim_attention_qkv, attention/cosine/qkv.cpp)
// and of the fused l2norm CUDA kernels (flashcos::detail::l2norm_cuda_*, attention/l2norm/cuda/l2norm.cu),
// which flashcos::l2norm takes for CUDA tensors where they apply.
//
// CPU (run in CI):
//   Cpu/QkvAttentionCpu        the packed API equals cosine_sim_attention on the three
//                                 (B, H, T, D) views of qkv with the heads merged afterwards
//                                 (forward and the qkv gradient), tiled and plain backends, f32 /
//                                 f64; both also equal the float64 loops of attention_test_util.h.
//   QkvAttentionCpuOptions     every option reaches the general path (mask, bias, kinds, ...).
//   QkvAttentionValidation     bad qkv / heads give a c10::Error naming them.
//   L2NormCpu                     flashcos::l2norm vs a float64 formula (zero / tiny groups too).
// GPU (skipped without a CUDA device and the fused kernels; every suite is instantiated as Gpu/...,
// so --gtest_filter='Gpu/QkvAttentionCuda*:Gpu/L2NormCuda*' selects them, 'Gpu/*' too):
//   Gpu/L2NormCuda                the fused l2norm forward / backward vs float64, fp16 / bf16 / fp32,
//                                 strided views, zero and tiny (clamped) groups.
//   Gpu/L2NormCudaMisc            inputs the kernels do not take fall back correctly; the detail
//                                 API's strided outputs, float32 dy, misaligned / expanded dy.
//   Gpu/QkvAttentionCuda       the fast path (Backend::kFused, fp16 / bf16, l2norm on, no mask /
//                                 bias) vs float64, T 1 .. 2049, d 32 / 64 / 128, groups 1 / 2.
//   Gpu/QkvAttentionCudaMisc   determinism, which cases take the fast path and which the
//                                 general one (and that both are right), upstream-gradient layouts,
//                                 k == q with groups > 1 (logits above 0), an in-place op on o.
// Errors are relative Frobenius errors against float64 on the dtype-rounded inputs: f64 1e-10,
// f32 1e-5, fp16 / bf16 at most 2x the error of the same computation in plain libtorch ops in that
// dtype plus a floor of eps / 4 (as tests/test_attention_cuda.cpp). FLASHCOS_POISON=1 is set in the
// GPU suites: buffers the kernels should overwrite start as NaN, and no result may be NaN / inf.
#include <flashcos/attention.h>
#include "attention/cosine/core.h"
#include "attention/l2norm/l2norm_cuda.h"
#include "tests/attention_test_util.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/cuda.h>

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace {

using flashcos::AttentionKind;
using flashcos::AttentionOptions;
using flashcos::Backend;
using namespace flashcos::test;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();


bool have_gpu() { return torch::cuda::is_available() && flashcos::fused_kernels_compiled(); }

// The build has the Hopper family, the device is compute capability 9.0 and FLASHCOS_HOPPER is not 0.
bool hopper_family_expected() {
#if defined(FLASHCOS_HAS_HOPPER) && defined(FLASHCOS_WITH_CUDA)
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  const char* env = std::getenv("FLASHCOS_HOPPER");
  return prop->major == 9 && prop->minor == 0 && (env == nullptr || env[0] != '0');
#else
  return false;
#endif
}

std::string bool_name(bool b, const char* yes, const char* no) { return b ? yes : no; }

// ---- packed layout helpers (written from the API contract, not from packed.cpp) -------------

// Part `which` (0 q, 1 k, 2 v) of a (B, T, 3 H D) tensor as its (B, H, T, D) view.
at::Tensor qkv_part(const at::Tensor& qkv, int64_t heads, int64_t which) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (3 * heads);
  return qkv.view({B, T, 3, heads, D}).select(2, which).permute({0, 2, 1, 3});
}

// (B, H, T, D) -> (B, T, H D): the heads merged.
at::Tensor merge_heads(const at::Tensor& o) {
  return o.transpose(1, 2).reshape({o.size(0), o.size(2), o.size(1) * o.size(3)});
}

// (B, T, H D) -> (B, H, T, D).
at::Tensor split_heads(const at::Tensor& o, int64_t heads) {
  return o.reshape({o.size(0), o.size(1), heads, o.size(2) / heads}).permute({0, 2, 1, 3});
}

// Three (B, H, T, D) gradients packed as one (B, T, 3 H D) tensor.
at::Tensor pack(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  return at::stack({q, k, v}, 1).permute({0, 3, 1, 2, 4}).reshape({B, T, 3 * H * D});
}

// t rounded to `dtype` and back to float64, strides kept.
at::Tensor rounded_to(const at::Tensor& t, at::ScalarType dtype) {
  at::Tensor r = at::empty_strided(t.sizes(), t.strides(), t.options());
  r.copy_(t.to(dtype).to(at::kDouble));
  return r;
}

std::string grad_fn_name(const at::Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : std::string("<none>"); }

bool fast_path_ran(const std::string& fn) { return fn.find("QkvAttention") != std::string::npos; }

enum class Via { kQkv, kViewsApi, kViewsPlain };

struct RunResult {
  at::Tensor o, dqkv;  // (B, T, H D), (B, T, 3 H D)
  std::string fn;      // o's grad_fn
};

// One way of computing the packed attention, in `dtype`, from a leaf copy of qkv64 (float64 values,
// strides kept) and the backward of `dout` (undefined: of o.sum(), an expanded upstream gradient).
// offset > 0: qkv sits `offset` elements into each row of a wider leaf (pointer and row stride then
// not 16-byte aligned for 16-bit dtypes); its gradient is the matching slice of the leaf's.
// A bias in opts is converted to `dtype`.
RunResult run_qkv(Via via, const at::Tensor& qkv64, int64_t heads, AttentionOptions opts, const at::Tensor& dout,
            at::ScalarType dtype, int64_t offset = 0) {
  at::Tensor leaf_t, qkv;
  if (offset == 0) {
    leaf_t = leaf(qkv64, dtype);
    qkv = leaf_t;
  } else {
    auto sizes = qkv64.sizes().vec();
    sizes.back() += offset;
    at::Tensor base = at::zeros(sizes, qkv64.options().dtype(dtype));
    base.narrow(-1, offset, qkv64.size(-1)).copy_(qkv64);
    leaf_t = base.requires_grad_(true);
    qkv = leaf_t.narrow(-1, offset, qkv64.size(-1));
  }
  if (opts.attn_bias().defined()) opts.attn_bias(opts.attn_bias().to(dtype));
  at::Tensor o;
  if (via == Via::kQkv) {
    o = flashcos::cosine_sim_attention_qkv(qkv, heads, opts);
  } else {
    const at::Tensor q = qkv_part(qkv, heads, 0), k = qkv_part(qkv, heads, 1), v = qkv_part(qkv, heads, 2);
    o = merge_heads(via == Via::kViewsApi ? flashcos::cosine_sim_attention(q, k, v, opts)
                                          : flashcos::plain_cosine_sim_attention(q, k, v, opts));
  }
  RunResult r;
  r.fn = grad_fn_name(o);
  const int64_t D = qkv64.size(2) / (3 * heads);
  EXPECT_EQ(o.scalar_type(), dtype);
  const std::vector<int64_t> o_sizes = {qkv64.size(0), qkv64.size(1), heads * D};
  EXPECT_EQ(o.sizes(), at::IntArrayRef(o_sizes));
  if (dout.defined()) {
    o.backward(dout.to(dtype));
  } else {
    o.sum().backward();
  }
  r.o = o.detach();
  const at::Tensor g = leaf_t.grad();
  r.dqkv = (offset == 0 || !g.defined()) ? g : g.narrow(-1, offset, qkv64.size(-1));
  return r;
}

// Relative error of a gradient whose true value can vanish (one visible key: dq = dk = 0 exactly,
// so |ref| is rounding noise): the denominator is floored (as tests/test_attention_cuda.cpp).
double grad_err(const at::Tensor& a, const at::Tensor& ref, double floor) {
  const double num = (a.detach().to(at::kDouble) - ref.detach().to(at::kDouble)).norm().item<double>();
  if (!std::isfinite(num)) return INFINITY;
  const double den = std::max(ref.detach().to(at::kDouble).norm().item<double>(), floor);
  return den == 0 ? (num == 0 ? 0.0 : INFINITY) : num / den;
}

struct PartErr {
  double o = 0, dq = 0, dk = 0, dv = 0;
};

// o and the q / k / v thirds of the qkv gradient, each against the reference's.
PartErr errors_vs(const RunResult& run, const RunResult& ref, int64_t heads, double scale) {
  PartErr e;
  e.o = rel_err(run.o, ref.o);
  if (!run.dqkv.defined()) {
    e.dq = e.dk = e.dv = INFINITY;
    return e;
  }
  const at::Tensor g = run.dqkv.contiguous(), rg = ref.dqkv.contiguous();
  const double floor = 1e-3 * scale * qkv_part(rg, heads, 2).to(at::kDouble).norm().item<double>();
  e.dq = grad_err(qkv_part(g, heads, 0), qkv_part(rg, heads, 0), floor);
  e.dk = grad_err(qkv_part(g, heads, 1), qkv_part(rg, heads, 1), floor);
  e.dv = rel_err(qkv_part(g, heads, 2), qkv_part(rg, heads, 2));
  return e;
}

// With one key (T = 1) dq and dk vanish exactly and both runs hold rounding noise only; grad_err
// measures it against its floor 1e-3 scale |dv|. Accept noise up to 16 eps scale |dv|: a wrong
// gradient is O(scale |dv| / sqrt(D)), orders of magnitude above.
double vanishing_grad_tol(at::ScalarType dtype) { return 16e3 * dtype_eps(dtype); }

std::ostream& operator<<(std::ostream& os, const PartErr& e) {
  return os << "o " << e.o << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv;
}


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

struct CpuParam {
  Backend backend;
  at::ScalarType dtype;
  int64_t D;
};

void PrintTo(const CpuParam& p, std::ostream* os) {
  *os << flashcos::to_string(p.backend) << " " << dtype_name(p.dtype) << " d" << p.D;
}

class QkvAttentionCpu : public ::testing::TestWithParam<CpuParam>, OneThread {};

// Packed vs the three views through the public API (the same backend): equal to tight tolerance,
// forward and the qkv gradient. Both vs the float64 loops of attention_test_util.h.
TEST_P(QkvAttentionCpu, MatchesViewsAndLoops) {
  const CpuParam& prm = GetParam();
  const int64_t B = 2, D = prm.D;
  const bool f64 = prm.dtype == at::kDouble;
  const double same_tol = f64 ? 1e-13 : 1e-6;  // the same libtorch ops on the same values
  const double ref_tol = f64 ? 1e-10 : 1e-5;
  for (bool causal : {false, true}) {
    for (int64_t groups : {1, 2}) {
      for (int64_t heads : {1, 3}) {
        for (int64_t T : {1, 63, 127}) {
          const std::string name = "packed_cpu_" + flashcos::to_string(prm.backend) + "_" + dtype_name(prm.dtype) +
                                   "_d" + std::to_string(D) + bool_name(causal, "_causal", "_full") + "_g" +
                                   std::to_string(groups) + "_h" + std::to_string(heads) + "_t" + std::to_string(T);
          SCOPED_TRACE(name);
          at::manual_seed(int64_t(name_seed(name)));
          // T 63: qkv is a (T, B, 3 H D) tensor transposed to (B, T, 3 H D) (only the last dim contiguous).
          at::Tensor qkv64 = T == 63 ? at::randn({T, B, 3 * heads * D}, at::kDouble).transpose(0, 1)
                                     : at::randn({B, T, 3 * heads * D}, at::kDouble);
          qkv64 = rounded_to(qkv64, prm.dtype);
          const at::Tensor dout64 = rounded_to(at::randn({B, T, heads * D}, at::kDouble), prm.dtype);
          const auto opts = AttentionOptions().causal(causal).groups(groups).backend(prm.backend).tile_size(16);

          const RunResult packed = run_qkv(Via::kQkv, qkv64, heads, opts, dout64, prm.dtype);
          const RunResult views = run_qkv(Via::kViewsApi, qkv64, heads, opts, dout64, prm.dtype);
          ASSERT_TRUE(packed.dqkv.defined()) << "no gradient reached qkv";
          EXPECT_EQ(packed.dqkv.sizes(), qkv64.sizes());
          EXPECT_EQ(packed.dqkv.scalar_type(), prm.dtype);
          const PartErr same = errors_vs(packed, views, heads, 10.0);
          EXPECT_LE(same.o, same_tol) << "packed vs views: " << same;
          EXPECT_LE(same.dq, same_tol) << "packed vs views: " << same;
          EXPECT_LE(same.dk, same_tol) << "packed vs views: " << same;
          EXPECT_LE(same.dv, same_tol) << "packed vs views: " << same;

          RefProblem p;
          p.q = qkv_part(qkv64, heads, 0);
          p.k = qkv_part(qkv64, heads, 1);
          p.v = qkv_part(qkv64, heads, 2);
          p.causal = causal;
          p.groups = groups;
          const RefResult ref = reference_attention(p, split_heads(dout64, heads));
          const RunResult loops{merge_heads(ref.o), pack(ref.dq, ref.dk, ref.dv), ""};
          const PartErr e = errors_vs(packed, loops, heads, 10.0);
          const double qk_tol = T == 1 ? vanishing_grad_tol(prm.dtype) : ref_tol;
          EXPECT_LE(e.o, ref_tol) << "packed vs float64 loops: " << e;
          EXPECT_LE(e.dq, qk_tol) << "packed vs float64 loops: " << e;
          EXPECT_LE(e.dk, qk_tol) << "packed vs float64 loops: " << e;
          EXPECT_LE(e.dv, ref_tol) << "packed vs float64 loops: " << e;
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

std::vector<CpuParam> cpu_params() {
  std::vector<CpuParam> ps;
  for (Backend be : {Backend::kTiled, Backend::kPlain})
    for (at::ScalarType dt : {at::kFloat, at::kDouble})
      for (int64_t d : {16, 32, 64}) ps.push_back({be, dt, d});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Cpu, QkvAttentionCpu, ::testing::ValuesIn(cpu_params()),
                         [](const ::testing::TestParamInfo<CpuParam>& i) {
                           return flashcos::to_string(i.param.backend) + "_" + dtype_name(i.param.dtype) + "_d" +
                                  std::to_string(i.param.D);
                         });

class QkvAttentionCpuOptions : public ::testing::Test, OneThread {};

// Every option reaches the general path: packed == views through the public API for the default
// options (Backend::kAuto), scale, the exp kind, l2norm off, groups 4, a key mask and a bias.
TEST_F(QkvAttentionCpuOptions, OptionsReachTheGeneralPath) {
  at::manual_seed(51);
  const int64_t B = 2, T = 37, H = 2, D = 32;
  at::Tensor qkv64 = at::randn({B, T, 3 * H * D}, at::kDouble);
  const at::Tensor dout64 = at::randn({B, T, H * D}, at::kDouble);
  at::Tensor mask = at::rand({B, T}, at::kDouble) < 0.7;
  mask.index_put_({0, 0}, false);
  const at::Tensor bias = at::randn({H, T, T}, at::kDouble) * 0.5;
  const at::Tensor bias_b = at::randn({B, T, T}, at::kDouble) * 0.5;
  // With l2norm off, |q.k| ~ 1 keeps exp() in range.
  at::Tensor qkv_small = qkv64.clone();
  qkv_small.narrow(-1, 0, 2 * H * D).mul_(1.0 / std::sqrt(double(D)));
  struct Opt {
    std::string name;
    AttentionOptions o;
    bool small;
  };
  const std::vector<Opt> cases = {
      {"defaults", AttentionOptions(), false},
      {"scale_3_7_causal", AttentionOptions().scale(3.7).causal(true), false},
      {"groups_4", AttentionOptions().groups(4).causal(true), false},
      {"exp_kind", AttentionOptions().kind(AttentionKind::kExp).scale(0.5).l2norm_qk(false), true},
      {"no_l2norm", AttentionOptions().l2norm_qk(false).scale(2.0), true},
      {"mask_bias_causal", AttentionOptions().mask(mask).attn_bias(bias).causal(true), false},
      {"bias_batch_dim", AttentionOptions().attn_bias(bias_b).attn_bias_batch_dim(true), false},
      {"plain_mask", AttentionOptions().mask(mask).backend(Backend::kPlain), false},
  };
  for (const Opt& c : cases) {
    SCOPED_TRACE(c.name);
    const at::Tensor& in = c.small ? qkv_small : qkv64;
    const RunResult packed = run_qkv(Via::kQkv, in, H, c.o, dout64, at::kDouble);
    const RunResult views = run_qkv(Via::kViewsApi, in, H, c.o, dout64, at::kDouble);
    const PartErr e = errors_vs(packed, views, H, c.o.scale());
    EXPECT_LE(e.o, 1e-13) << e;
    EXPECT_LE(e.dq, 1e-13) << e;
    EXPECT_LE(e.dk, 1e-13) << e;
    EXPECT_LE(e.dv, 1e-13) << e;
  }
  // Without autograd (qkv not requiring grad): the same values.
  const at::Tensor o = flashcos::cosine_sim_attention_qkv(qkv64, H);
  EXPECT_FALSE(o.requires_grad());
  EXPECT_LE(rel_err(o, run_qkv(Via::kViewsApi, qkv64, H, {}, dout64, at::kDouble).o), 1e-13);
}

// Bad qkv / heads: a c10::Error that names them, not a crash or a silent reshape.
TEST(QkvAttentionValidation, BadShapesNameQkvAndHeads) {
  at::manual_seed(52);
  const at::Tensor qkv = at::randn({2, 5, 3 * 2 * 16});  // heads 2, D 16
  auto call = [](const at::Tensor& t, int64_t heads, AttentionOptions o = {}) {
    return [t, heads, o] { flashcos::cosine_sim_attention_qkv(t, heads, o); };
  };
  expect_error(call(qkv.flatten(0, 1), 2), {"qkv"}, "2-D qkv");
  expect_error(call(qkv.view({2, 5, 6, 16}), 2), {"qkv"}, "4-D qkv");
  expect_error(call(qkv.unsqueeze(0), 2), {"qkv"}, "4-D qkv (leading 1)");
  expect_error(call(at::Tensor(), 2), {"qkv"}, "undefined qkv");
  expect_error(call(at::randn({2, 5, 3 * 2 * 16 + 3}), 2), {"qkv", "heads"}, "last dim not 3 * heads * D");
  expect_error(call(at::randn({2, 5, 3 * 2 * 16 + 2}), 2), {"qkv", "heads"}, "last dim divisible by 2, not 6");
  expect_error(call(qkv, 5), {"qkv", "heads"}, "96 not divisible by 3 * 5");
  expect_error(call(qkv, 0), {"heads"}, "heads 0");
  expect_error(call(qkv, -2), {"heads"}, "negative heads");
  expect_error(call(at::randn({2, 5, 0}), 1), {"qkv"}, "empty last dim");
  expect_error(call(at::randn({2, 96, 5}).transpose(1, 2), 2), {"qkv", "contiguous"}, "strided last dim");
  // Options are validated as cosine_sim_attention validates them.
  expect_error(call(qkv, 2, AttentionOptions().groups(3)), {"groups"}, "groups not dividing D");
  expect_error(call(qkv, 2, AttentionOptions().backend(Backend::kFused)), {"fused"}, "fused backend on the CPU");
  expect_error(call(qkv, 2, AttentionOptions().mask(at::ones({2, 4}, at::kBool))), {"mask"}, "mask of the wrong T");
}

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

// ================================ GPU: packed fast path ========================================

struct PackedParam {
  at::ScalarType dtype;
  int64_t D;
  bool causal;
  int64_t groups;
  bool long_seq;  // also T = 2049
};

void PrintTo(const PackedParam& p, std::ostream* os) {
  *os << dtype_name(p.dtype) << " d" << p.D << (p.causal ? " causal" : " full") << " g" << p.groups
      << (p.long_seq ? " +T2049" : "");
}

class QkvAttentionCuda : public ::testing::TestWithParam<PackedParam> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
    setenv("FLASHCOS_POISON", "1", 1);
  }
};

// Backend::kFused, fp16 / bf16, l2norm on, no mask / bias: the fast path runs (its autograd Function
// is o's grad_fn; the Hopper family on compute capability 9.0 for d 64 / 128), and o and the qkv
// gradient are within 2x the error of plain libtorch ops in the same dtype, against float64.
TEST_P(QkvAttentionCuda, FastPathMatchesFloat64Reference) {
  const PackedParam& prm = GetParam();
  const at::ScalarType dt = prm.dtype;
  const int64_t B = 2, H = 2, D = prm.D;
  std::vector<int64_t> lens = {1, 63, 127, 1000};
  if (prm.long_seq) lens.push_back(2049);
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  const double floor = dtype_eps(dt) / 4;
  for (int64_t T : lens) {
    const std::string name = "packed_" + dtype_name(dt) + "_d" + std::to_string(D) +
                             bool_name(prm.causal, "_causal", "_full") + "_g" + std::to_string(prm.groups) + "_t" +
                             std::to_string(T);
    SCOPED_TRACE(name);
    at::manual_seed(int64_t(name_seed(name)));
    const at::Tensor qkv64 = at::randn({B, T, 3 * H * D}, o64).to(dt).to(at::kDouble);
    const at::Tensor dout64 = at::randn({B, T, H * D}, o64).to(dt).to(at::kDouble);
    const auto opts = AttentionOptions().causal(prm.causal).groups(prm.groups);
    const auto plain = AttentionOptions(opts).backend(Backend::kPlain);
    const RunResult ref = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, at::kDouble);
    const RunResult base = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, dt);
    const int64_t hopper_before = flashcos::hopper_kernel_launches();
    const RunResult fast = run_qkv(Via::kQkv, qkv64, H, AttentionOptions(opts).backend(Backend::kFused), dout64, dt);
    const int64_t hopper_runs = flashcos::hopper_kernel_launches() - hopper_before;

    EXPECT_TRUE(fast_path_ran(fast.fn)) << "the fast path did not run (o's grad_fn: " << fast.fn << ")";
    ASSERT_TRUE(fast.dqkv.defined()) << "no gradient reached qkv";
    EXPECT_EQ(fast.dqkv.sizes(), qkv64.sizes());
    EXPECT_EQ(fast.dqkv.scalar_type(), dt);
    if ((D == 64 || D == 128) && hopper_family_expected()) {
      EXPECT_GE(hopper_runs, 1) << "the Hopper kernels did not run";
    } else {
      EXPECT_EQ(hopper_runs, 0) << "the Hopper kernels ran where they do not apply";
    }
    // FLASHCOS_POISON=1: o and every part of dqkv start as NaN; all of it must be written.
    EXPECT_TRUE(at::isfinite(fast.o).all().item<bool>()) << "NaN / inf in o";
    EXPECT_TRUE(at::isfinite(fast.dqkv).all().item<bool>()) << "NaN / inf in dqkv";

    const PartErr e = errors_vs(fast, ref, H, 10.0), be = errors_vs(base, ref, H, 10.0);
    const double vanish = T == 1 ? vanishing_grad_tol(dt) : 0.0;
    EXPECT_LE(e.o, 2 * be.o + floor) << "o";
    EXPECT_LE(e.dq, std::max(2 * be.dq + floor, vanish)) << "dq";
    EXPECT_LE(e.dk, std::max(2 * be.dk + floor, vanish)) << "dk";
    EXPECT_LE(e.dv, 2 * be.dv + floor) << "dv";
    std::printf("[ errors   ] %-34s packed %.2e %.2e %.2e %.2e | plain %.2e %.2e %.2e %.2e (o dq dk dv)\n",
                name.c_str(), e.o, e.dq, e.dk, e.dv, be.o, be.dq, be.dk, be.dv);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "packed " << e << " | plain " << be;
      return;
    }
  }
}

std::vector<PackedParam> packed_params() {
  std::vector<PackedParam> ps;
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf})
    for (int64_t d : {32, 64, 128})
      for (bool causal : {false, true})
        for (int64_t g : {1, 2}) ps.push_back({dt, d, causal, g, dt == at::kBFloat16 && d == 128 && causal && g == 1});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Gpu, QkvAttentionCuda, ::testing::ValuesIn(packed_params()),
                         [](const ::testing::TestParamInfo<PackedParam>& i) {
                           return dtype_name(i.param.dtype) + "_d" + std::to_string(i.param.D) +
                                  bool_name(i.param.causal, "_causal", "_full") + "_g" +
                                  std::to_string(i.param.groups) + bool_name(i.param.long_seq, "_t2049", "");
                         });

class QkvAttentionCudaMisc : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "needs a CUDA device and the fused kernels";
    setenv("FLASHCOS_POISON", "1", 1);
  }
};

// Same input twice: a bit-identical forward, with and without autograd.
TEST_P(QkvAttentionCudaMisc, ForwardIsDeterministic) {
  const at::ScalarType dt = GetParam();
  at::manual_seed(71);
  for (int64_t D : {32, 64, 128}) {
    SCOPED_TRACE("d" + std::to_string(D));
    const auto opts = AttentionOptions().causal(true).backend(Backend::kFused);
    const at::Tensor qkv = at::randn({2, 1000, 3 * 2 * D}, at::TensorOptions().dtype(dt).device(at::kCUDA));
    const at::Tensor qkv_g = qkv.detach().clone().requires_grad_(true);
    const at::Tensor a = flashcos::cosine_sim_attention_qkv(qkv_g, 2, opts);
    const at::Tensor b = flashcos::cosine_sim_attention_qkv(qkv_g, 2, opts);
    EXPECT_TRUE(fast_path_ran(grad_fn_name(a))) << grad_fn_name(a);
    const at::Tensor c = flashcos::cosine_sim_attention_qkv(qkv, 2, opts);  // no grad needed
    at::Tensor d;
    {
      at::NoGradGuard no_grad;
      d = flashcos::cosine_sim_attention_qkv(qkv_g, 2, opts);
    }
    EXPECT_TRUE(at::equal(a, b)) << "two runs differ";
    EXPECT_TRUE(at::equal(a, c)) << "qkv without requires_grad differs";
    EXPECT_TRUE(at::equal(a, d)) << "under NoGradGuard differs";
    EXPECT_TRUE(at::isfinite(a).all().item<bool>());
  }
}

// Which cases take the fast path and which the general one, and every one of them right: the
// packed result vs float64 (plain ops on the views) within 2x the plain-ops error in the dtype.
TEST_P(QkvAttentionCudaMisc, FastAndGeneralPathCases) {
  const at::ScalarType dt = GetParam();
  const int64_t B = 2, T = 127, H = 2;
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  struct PathCase {
    std::string name;
    int64_t D;
    AttentionOptions opts;
    bool fast;                  // expected to take the fast path
    int64_t offset = 0;         // qkv this many elements into a wider buffer
    bool transposed = false;    // qkv a (T, B, 3 H D) tensor transposed
    bool small_qk = false;      // q, k scaled by 1 / sqrt(D) (no l2norm)
    bool f32 = false;           // run in float32 instead of the 16-bit dtype
  };
  at::manual_seed(72);
  at::Tensor mask = at::rand({B, T}, o64) < 0.8;
  mask.index_put_({0, at::indexing::Slice(0, 3)}, false);  // causal rows 0..2 of batch 0 see nothing
  const at::Tensor bias = at::randn({H, T, T}, o64) * 0.5;
  const auto fused = AttentionOptions().backend(Backend::kFused);
  std::vector<PathCase> cases = {
      {"mask_causal", 64, AttentionOptions(fused).mask(mask).causal(true), false},
      {"bias_head", 64, AttentionOptions(fused).attn_bias(bias), false},
      {"mask_bias_d32", 32, AttentionOptions(fused).mask(mask).attn_bias(bias), false},
      {"mask_d128_groups2", 128, AttentionOptions(fused).mask(mask).groups(2), false},
      {"no_l2norm", 64, AttentionOptions(fused).l2norm_qk(false).scale(2.0), false, 0, false, true},
      {"exp_kind", 64, AttentionOptions(fused).kind(AttentionKind::kExp).scale(1.0), false, 0, false, true},
      {"d96_groups1_l2norm_unsupported", 96, fused, false},
      {"d80_groups1_l2norm_unsupported", 80, AttentionOptions(fused).causal(true), false},
      {"misaligned_qkv", 64, AttentionOptions(fused).causal(true), false, 4},
      {"tiled_backend_f32", 64, AttentionOptions().backend(Backend::kTiled).tile_size(32), false, 0, false, false, true},
      {"float32_fused", 64, AttentionOptions(fused).causal(true), false, 0, false, false, true},
      {"d96_groups3", 96, AttentionOptions(fused).groups(3), true},
      {"d80_groups5", 80, AttentionOptions(fused).groups(5).causal(true), true},
      {"d16", 16, AttentionOptions(fused).causal(true), true},
      {"d64_groups4", 64, AttentionOptions(fused).groups(4), true},
      {"d64_groups8", 64, AttentionOptions(fused).groups(8).causal(true), true},
      {"d128_scale_25_causal", 128, AttentionOptions(fused).scale(25.0).causal(true), true},
      {"auto_backend", 64, AttentionOptions().causal(true), true},
      {"transposed_qkv", 64, AttentionOptions(fused).causal(true), true, 0, true},
  };
  const ::testing::TestResult* result = ::testing::UnitTest::GetInstance()->current_test_info()->result();
  for (const PathCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int failures_before = result->total_part_count();
    const at::ScalarType run_dt = c.f32 ? at::kFloat : dt;
    at::Tensor qkv64 = c.transposed ? at::randn({T, B, 3 * H * c.D}, o64).transpose(0, 1)
                                    : at::randn({B, T, 3 * H * c.D}, o64);
    if (c.small_qk) qkv64.narrow(-1, 0, 2 * H * c.D).mul_(1.0 / std::sqrt(double(c.D)));
    qkv64 = rounded_to(qkv64, run_dt);
    const at::Tensor dout64 = at::randn({B, T, H * c.D}, o64).to(run_dt).to(at::kDouble);
    const auto plain = AttentionOptions(c.opts).backend(Backend::kPlain);
    const RunResult ref = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, at::kDouble);
    const RunResult run = run_qkv(Via::kQkv, qkv64, H, c.opts, dout64, run_dt, c.offset);
    EXPECT_EQ(fast_path_ran(run.fn), c.fast) << "o's grad_fn: " << run.fn;
    ASSERT_TRUE(run.dqkv.defined()) << "no gradient reached qkv";
    EXPECT_TRUE(at::isfinite(run.o).all().item<bool>()) << "NaN / inf in o";
    EXPECT_TRUE(at::isfinite(run.dqkv).all().item<bool>()) << "NaN / inf in dqkv";
    const PartErr e = errors_vs(run, ref, H, c.opts.scale());
    PartErr tol{1e-5, 1e-5, 1e-5, 1e-5};
    PartErr be;
    if (!c.f32) {
      be = errors_vs(run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, run_dt), ref, H, c.opts.scale());
      const double floor = dtype_eps(run_dt) / 4;
      tol = {2 * be.o + floor, 2 * be.dq + floor, 2 * be.dk + floor, 2 * be.dv + floor};
    }
    EXPECT_LE(e.o, tol.o) << "o";
    EXPECT_LE(e.dq, tol.dq) << "dq";
    EXPECT_LE(e.dk, tol.dk) << "dk";
    EXPECT_LE(e.dv, tol.dv) << "dv";
    if (result->total_part_count() != failures_before) ADD_FAILURE() << c.name << ": packed " << e << " | plain " << be;
  }
}

// The upstream gradient as autograd may hand it over: expanded (o.sum()) or with a strided last
// dim; the fast path's qkv gradient still matches float64.
TEST_P(QkvAttentionCudaMisc, UpstreamGradientLayouts) {
  const at::ScalarType dt = GetParam();
  const int64_t B = 2, T = 127, H = 2, D = 64;
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  at::manual_seed(73);
  const at::Tensor qkv64 = at::randn({B, T, 3 * H * D}, o64).to(dt).to(at::kDouble);
  const auto opts = AttentionOptions().causal(true).backend(Backend::kFused);
  const auto plain = AttentionOptions(opts).backend(Backend::kPlain);
  const at::Tensor strided = at::randn({B, H * D, T}, o64).to(dt).to(at::kDouble).transpose(1, 2);
  for (const at::Tensor& dout : {at::Tensor(), strided}) {
    SCOPED_TRACE(dout.defined() ? "dout with a strided last dim" : "o.sum()");
    const RunResult ref = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout, at::kDouble);
    const RunResult base = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout, dt);
    const RunResult fast = run_qkv(Via::kQkv, qkv64, H, opts, dout, dt);
    EXPECT_TRUE(fast_path_ran(fast.fn)) << fast.fn;
    ASSERT_TRUE(fast.dqkv.defined());
    const PartErr e = errors_vs(fast, ref, H, 10.0), be = errors_vs(base, ref, H, 10.0);
    const double floor = dtype_eps(dt) / 4;
    EXPECT_LE(e.dq, 2 * be.dq + floor) << e << " | plain " << be;
    EXPECT_LE(e.dk, 2 * be.dk + floor) << e << " | plain " << be;
    EXPECT_LE(e.dv, 2 * be.dv + floor) << e << " | plain " << be;
    EXPECT_TRUE(at::isfinite(fast.dqkv).all().item<bool>());
  }
}

// k equal to q: every per-group cosine on the diagonal is 1, so q.k = groups there and the logit
// scale (q.k - 1) reaches scale (groups - 1) > 0 (with one group the logits stay <= 0). The fast
// path and the general path through the fused kernels must stay finite and right.
TEST_P(QkvAttentionCudaMisc, KeysEqualToQueriesWithGroups) {
  const at::ScalarType dt = GetParam();
  const int64_t B = 2, T = 63, H = 2, D = 64;
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  const double floor = dtype_eps(dt) / 4;
  for (int64_t groups : {1, 2, 4}) {
    SCOPED_TRACE("groups " + std::to_string(groups));
    at::manual_seed(74 + groups);
    at::Tensor qkv64 = at::randn({B, T, 3 * H * D}, o64).to(dt).to(at::kDouble);
    qkv64.view({B, T, 3, H, D}).select(2, 1).copy_(qkv64.view({B, T, 3, H, D}).select(2, 0));
    const at::Tensor dout64 = at::randn({B, T, H * D}, o64).to(dt).to(at::kDouble);
    const auto opts = AttentionOptions().causal(true).groups(groups);
    const auto plain = AttentionOptions(opts).backend(Backend::kPlain);
    const auto fused = AttentionOptions(opts).backend(Backend::kFused);
    const RunResult ref = run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, at::kDouble);
    const PartErr be = errors_vs(run_qkv(Via::kViewsPlain, qkv64, H, plain, dout64, dt), ref, H, 10.0);
    for (Via via : {Via::kQkv, Via::kViewsApi}) {
      SCOPED_TRACE(via == Via::kQkv ? "packed (fast path)" : "views through cosine_sim_attention (fused)");
      const RunResult run = run_qkv(via, qkv64, H, fused, dout64, dt);
      EXPECT_EQ(fast_path_ran(run.fn), via == Via::kQkv) << run.fn;
      EXPECT_TRUE(at::isfinite(run.o).all().item<bool>()) << "NaN / inf in o";
      ASSERT_TRUE(run.dqkv.defined());
      EXPECT_TRUE(at::isfinite(run.dqkv).all().item<bool>()) << "NaN / inf in dqkv";
      const PartErr e = errors_vs(run, ref, H, 10.0);
      EXPECT_LE(e.o, 2 * be.o + floor) << e << " | plain " << be;
      EXPECT_LE(e.dq, 2 * be.dq + floor) << e << " | plain " << be;
      EXPECT_LE(e.dk, 2 * be.dk + floor) << e << " | plain " << be;
      EXPECT_LE(e.dv, 2 * be.dv + floor) << e << " | plain " << be;
    }
  }
}

// The result behaves as the general path's (a plain tensor): an in-place op on it before the
// backward is allowed and the qkv gradient accounts for it.
TEST_P(QkvAttentionCudaMisc, InPlaceOpOnTheOutput) {
  // The fast path saves its output for the backward (as libtorch ops that save their result do):
  // an in-place op on it is allowed, and a backward through the modified result is refused with
  // libtorch's version-counter error; without grad, in-place ops just work.
  const at::ScalarType dt = GetParam();
  const int64_t B = 2, T = 127, H = 2, D = 64;
  const auto o64 = at::TensorOptions().dtype(at::kDouble).device(at::kCUDA);
  at::manual_seed(75);
  const at::Tensor qkv64 = at::randn({B, T, 3 * H * D}, o64).to(dt).to(at::kDouble);
  const at::Tensor qkv = leaf(qkv64, dt);
  const at::Tensor o = flashcos::cosine_sim_attention_qkv(qkv, H, AttentionOptions().backend(Backend::kFused));
  EXPECT_TRUE(fast_path_ran(grad_fn_name(o))) << grad_fn_name(o);
  const at::Tensor o_before = o.detach().clone();
  o.mul_(2.0);
  EXPECT_TRUE(at::equal(o.detach(), o_before * 2));
  try {
    o.sum().backward();
    ADD_FAILURE() << "a backward through the in-place modified output did not throw";
  } catch (const c10::Error& err) {
    EXPECT_NE(std::string(err.what_without_backtrace()).find("inplace operation"), std::string::npos)
        << err.what_without_backtrace();
  }
  {
    at::NoGradGuard no_grad;
    const at::Tensor o2 = flashcos::cosine_sim_attention_qkv(qkv, H, AttentionOptions().backend(Backend::kFused));
    o2.mul_(2.0);
    EXPECT_TRUE(at::equal(o2, o_before * 2));
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, QkvAttentionCudaMisc, ::testing::Values(at::kBFloat16, at::kHalf),
                         [](const ::testing::TestParamInfo<at::ScalarType>& i) { return dtype_name(i.param); });

}  // namespace
