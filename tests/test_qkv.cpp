// Tests of the packed-QKV entry point (flashcos::cosine_sim_attention_qkv, attention/cosine/qkv.cpp)
// on the CPU (run in CI); its CUDA fast path is tested in tests/test_qkv_cuda.cpp.
//
//   Cpu/QkvAttentionCpu        the packed API equals cosine_sim_attention on the three
//                                 (B, H, T, D) views of qkv with the heads merged afterwards
//                                 (forward and the qkv gradient), tiled and plain backends, f32 /
//                                 f64; both also equal the float64 loops of attention_test_util.h.
//   QkvAttentionCpuOptions     every option reaches the general path (mask, bias, kinds, ...).
//   QkvAttentionValidation     bad qkv / heads give a c10::Error naming them.
// Errors are relative Frobenius errors against float64 on the dtype-rounded inputs: f64 1e-10,
// f32 1e-5.
#include <flashcos/attention.h>
#include "tests/attention_test_util.h"
#include "tests/qkv_test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

namespace {

using flashcos::AttentionKind;
using flashcos::AttentionOptions;
using flashcos::Backend;
using namespace flashcos::test;

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

}  // namespace
