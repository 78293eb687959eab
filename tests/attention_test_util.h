// Shared helpers for the attention tests (CPU suite and CUDA suite).
//
// reference_attention() is a float64 loop implementation of DESIGN.md's attention, written from
// the math alone (explicit loops over b, h, i, j, d; no matmul, no libtorch attention ops), with
// its own analytic backward. It is the ground truth every backend and dtype is measured against.
//
// Canonical shapes: q (B, H, I, D); k, v (B, Hkv, J, D) with H % Hkv == 0 (query head h reads
// key/value head h / (H / Hkv)); mask (B, J) bool (true = attend) or undefined; bias (H, I, J),
// or (B, I, J) with bias_batch_dim, or undefined. The public API's 3-D forms map to these by
// canonical() below: multi-query k, v (B, J, D) -> (B, 1, J, D); merged q (BH, I, D) -> (BH, 1, I, D).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace flashcos::test {

// Runs a test single-threaded (intra-op) and restores the thread count afterwards: the attention
// suites run many tiny ops, where OpenMP threads only add synchronisation (~8x slower with 2
// threads on a busy 2-core machine). Tests derive from it.
class OneThread {
 protected:
  OneThread() : saved_(at::get_num_threads()) { at::set_num_threads(1); }
  ~OneThread() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

// f() must throw a c10::Error whose message contains every one of `needles`; `what` (when given)
// names the case in the failure output.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles,
                         const std::string& what = "") {
  SCOPED_TRACE(what);
  try {
    f();
    ADD_FAILURE() << "expected a c10::Error mentioning '" << needles.front() << "', nothing thrown";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "message lacks '" << n << "': " << msg;
  }
}

enum class MaskMode { kNone, kRandom };
enum class BiasMode { kNone, kHead, kBatch };

// One attention problem in the public API's terms (the CPU and CUDA suites' case tables).
struct Case {
  std::string name;
  int64_t B = 1, H = 1, Hkv = 1, I = 1, J = 1, D = 16;
  bool multi_query = false;  // k, v (B, J, D)
  bool merged = false;       // q (B, I, D), k, v (B, J, D): B is batch*heads, H must be 1
  bool causal = false;
  MaskMode mask = MaskMode::kNone;
  BiasMode bias = BiasMode::kNone;
  int64_t groups = 1;
  bool l2norm = true;
  bool exp_kind = false;
  double scale = 10.0;
  int64_t tile = 16;         // tiled backend only
  bool noncontig = false;  // q, k, v are transposed views (last dim still contiguous)
};

// Builder so the case table stays readable.
struct C {
  Case c;
  explicit C(std::string name, int64_t B, int64_t H, int64_t Hkv, int64_t I, int64_t J, int64_t D) {
    c.name = std::move(name);
    c.B = B; c.H = H; c.Hkv = Hkv; c.I = I; c.J = J; c.D = D;
  }
  C& mq() { c.multi_query = true; c.Hkv = 1; return *this; }
  C& merged() { c.merged = true; c.H = 1; c.Hkv = 1; return *this; }
  C& causal() { c.causal = true; return *this; }
  C& mask() { c.mask = MaskMode::kRandom; return *this; }
  C& bias_head() { c.bias = BiasMode::kHead; return *this; }
  C& bias_batch() { c.bias = BiasMode::kBatch; return *this; }
  C& groups(int64_t g) { c.groups = g; return *this; }
  C& no_l2norm() { c.l2norm = false; return *this; }
  C& exp_kind() { c.exp_kind = true; c.l2norm = false; return *this; }
  C& scale(double s) { c.scale = s; return *this; }
  C& tile(int64_t t) { c.tile = t; return *this; }
  C& noncontig() { c.noncontig = true; return *this; }
  operator Case() const { return c; }  // NOLINT
};

// Output and gradients of one run of the public API (in the dtype it ran in).
struct ApiRun {
  at::Tensor o, dq, dk, dv, dbias;
};

// Leaf copy in `dtype` keeping the strides of t (so non-contiguous inputs stay non-contiguous).
inline at::Tensor leaf(const at::Tensor& t, at::ScalarType dtype) {
  at::Tensor r = at::empty_strided(t.sizes(), t.strides(), t.options().dtype(dtype));
  r.copy_(t);
  return r.detach().requires_grad_(true);
}

struct RefProblem {
  at::Tensor q, k, v;  // canonical, any float dtype (converted to float64), BEFORE l2norm
  at::Tensor mask;     // (B, J) bool, or undefined
  at::Tensor bias;     // (H, I, J) / (B, I, J), or undefined
  bool bias_batch_dim = false;
  bool causal = false;
  bool exp_kind = false;  // o = sum_j exp(scale * q.k + bias) v_j, no l, no "- scale"
  bool l2norm = true;     // l2-normalise q and k in `groups` chunks of the feature dim first
  int64_t groups = 1;
  double scale = 10.0;
};

struct RefResult {
  at::Tensor o;          // (B, H, I, D) float64
  at::Tensor row_valid;  // (B, H, I) bool: the row attends to at least one key
  at::Tensor dq, dk, dv; // canonical shapes, float64 (gradients w.r.t. the inputs before l2norm)
  at::Tensor dbias;      // bias's shape, float64 (undefined without bias)
};

namespace detail_ref {

// y = x / |x| per group chunk of each row of length D; rows x: (N, D) contiguous float64.
inline void l2norm_rows(const double* x, double* y, double* inv_norm, int64_t n, int64_t d,
                        int64_t groups) {
  const int64_t dg = d / groups;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const double* xr = x + r * d + g * dg;
      double ss = 0;
      for (int64_t e = 0; e < dg; ++e) ss += xr[e] * xr[e];
      const double inv = 1.0 / std::max(std::sqrt(ss), 1e-12);
      inv_norm[r * groups + g] = inv;
      for (int64_t e = 0; e < dg; ++e) y[r * d + g * dg + e] = xr[e] * inv;
    }
  }
}

// dx = (dy - y (y . dy)) / |x| per group chunk (the backward of l2norm_rows).
inline void l2norm_rows_backward(const double* y, const double* inv_norm, double* dyx, int64_t n,
                                 int64_t d, int64_t groups) {
  const int64_t dg = d / groups;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const double* yr = y + r * d + g * dg;
      double* gr = dyx + r * d + g * dg;
      double dot = 0;
      for (int64_t e = 0; e < dg; ++e) dot += yr[e] * gr[e];
      const double inv = inv_norm[r * groups + g];
      for (int64_t e = 0; e < dg; ++e) gr[e] = (gr[e] - yr[e] * dot) * inv;
    }
  }
}

inline at::Tensor f64(const at::Tensor& t) {
  return t.detach().to(at::kDouble).contiguous().clone();
}

}  // namespace detail_ref

// Forward (and, when dout is defined, backward) of the attention by plain loops in float64.
inline RefResult reference_attention(const RefProblem& p, const at::Tensor& dout = {}) {
  using namespace detail_ref;
  TORCH_CHECK(p.q.dim() == 4 && p.k.dim() == 4 && p.v.dim() == 4, "reference: canonical 4-D inputs");
  const int64_t B = p.q.size(0), H = p.q.size(1), I = p.q.size(2), D = p.q.size(3);
  const int64_t Hkv = p.k.size(1), J = p.k.size(2);
  TORCH_CHECK(H % Hkv == 0 && D % p.groups == 0, "reference: bad problem");
  const int64_t per_kv = H / Hkv;

  at::Tensor q_in = f64(p.q), k_in = f64(p.k), v = f64(p.v);
  at::Tensor q = at::empty_like(q_in), k = at::empty_like(k_in);
  at::Tensor q_inv = at::empty({B * H * I * p.groups}, q_in.options());
  at::Tensor k_inv = at::empty({B * Hkv * J * p.groups}, q_in.options());
  if (p.l2norm) {
    l2norm_rows(q_in.data_ptr<double>(), q.data_ptr<double>(), q_inv.data_ptr<double>(),
                B * H * I, D, p.groups);
    l2norm_rows(k_in.data_ptr<double>(), k.data_ptr<double>(), k_inv.data_ptr<double>(),
                B * Hkv * J, D, p.groups);
  } else {
    q.copy_(q_in);
    k.copy_(k_in);
  }
  at::Tensor mask;
  if (p.mask.defined()) mask = p.mask.to(at::kBool).contiguous();
  at::Tensor bias;
  if (p.bias.defined()) bias = f64(p.bias);
  const bool backward = dout.defined();
  at::Tensor dO;
  if (backward) dO = f64(dout);

  RefResult r;
  r.o = at::zeros({B, H, I, D}, q.options());
  r.row_valid = at::zeros({B, H, I}, at::kBool);
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  at::Tensor dbias;
  if (bias.defined()) dbias = at::zeros_like(bias);

  const double* Q = q.data_ptr<double>();
  const double* K = k.data_ptr<double>();
  const double* V = v.data_ptr<double>();
  const bool* M = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  const double* Bs = bias.defined() ? bias.data_ptr<double>() : nullptr;
  double* O = r.o.data_ptr<double>();
  bool* RV = r.row_valid.data_ptr<bool>();
  const double* DO = backward ? dO.data_ptr<double>() : nullptr;
  double* DQ = dq.data_ptr<double>();
  double* DK = dk.data_ptr<double>();
  double* DV = dv.data_ptr<double>();
  double* DB = dbias.defined() ? dbias.data_ptr<double>() : nullptr;

  std::vector<double> P(static_cast<size_t>(J));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / per_kv;
      const int64_t bias_lead = p.bias_batch_dim ? b : h;
      for (int64_t i = 0; i < I; ++i) {
        const double* qi = Q + ((b * H + h) * I + i) * D;
        const int64_t last_key = p.causal ? i + J - I : J - 1;  // bottom-right aligned
        double l = 0;
        for (int64_t j = 0; j < J; ++j) {
          const bool allowed = j <= last_key && (M == nullptr || M[b * J + j]);
          if (!allowed) {
            P[j] = 0;
            continue;
          }
          const double* kj = K + ((b * Hkv + hk) * J + j) * D;
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += qi[e] * kj[e];
          double s = p.scale * dot - (p.exp_kind ? 0.0 : p.scale);
          if (Bs != nullptr) s += Bs[(bias_lead * I + i) * J + j];
          P[j] = std::exp(s);
          l += P[j];
        }
        const bool valid = last_key >= 0 && l > 0;
        RV[(b * H + h) * I + i] = valid;
        // Weights w_ij that multiply v_j: P / l (cosine) or P (exp); zero for an empty row.
        double* oi = O + ((b * H + h) * I + i) * D;
        for (int64_t j = 0; j < J; ++j) {
          const double w = p.exp_kind ? P[j] : (valid ? P[j] / l : 0.0);
          if (w == 0) continue;
          const double* vj = V + ((b * Hkv + hk) * J + j) * D;
          for (int64_t e = 0; e < D; ++e) oi[e] += w * vj[e];
        }
        if (!backward) continue;
        const double* doi = DO + ((b * H + h) * I + i) * D;
        double Di = 0;  // do_i . o_i (cosine kind only)
        if (!p.exp_kind)
          for (int64_t e = 0; e < D; ++e) Di += doi[e] * oi[e];
        double* dqi = DQ + ((b * H + h) * I + i) * D;
        for (int64_t j = 0; j < J; ++j) {
          const double w = p.exp_kind ? P[j] : (valid ? P[j] / l : 0.0);
          if (w == 0) continue;
          const double* kj = K + ((b * Hkv + hk) * J + j) * D;
          const double* vj = V + ((b * Hkv + hk) * J + j) * D;
          double* dkj = DK + ((b * Hkv + hk) * J + j) * D;
          double* dvj = DV + ((b * Hkv + hk) * J + j) * D;
          double dov = 0;
          for (int64_t e = 0; e < D; ++e) dov += doi[e] * vj[e];
          const double dS = w * (dov - Di);
          for (int64_t e = 0; e < D; ++e) {
            dvj[e] += w * doi[e];
            dqi[e] += p.scale * dS * kj[e];
            dkj[e] += p.scale * dS * qi[e];
          }
          if (DB != nullptr) DB[(bias_lead * I + i) * J + j] += dS;
        }
      }
    }
  }
  if (backward) {
    if (p.l2norm) {
      l2norm_rows_backward(Q, q_inv.data_ptr<double>(), DQ, B * H * I, D, p.groups);
      l2norm_rows_backward(K, k_inv.data_ptr<double>(), DK, B * Hkv * J, D, p.groups);
    }
    r.dq = dq;
    r.dk = dk;
    r.dv = dv;
    r.dbias = dbias;
  }
  return r;
}

// The API's 3-D forms as canonical 4-D views: (N, L, D) -> (N, 1, L, D).
inline at::Tensor canonical(const at::Tensor& t) { return t.dim() == 3 ? t.unsqueeze(1) : t; }

// Relative Frobenius error |a - ref| / |ref| in float64 (0 when both are zero; inf on NaN/inf).
inline double rel_err(const at::Tensor& a, const at::Tensor& ref) {
  const at::Tensor a64 = a.detach().to(at::kDouble), r64 = ref.detach().to(at::kDouble);
  if (!at::isfinite(a64).all().item<bool>()) return INFINITY;
  const double num = (a64 - r64).norm().item<double>();
  const double den = r64.norm().item<double>();
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return num / den;
}

inline double dtype_eps(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return 2.220446049250313e-16;
    case at::kFloat: return 1.1920928955078125e-07;
    case at::kHalf: return 9.765625e-04;
    case at::kBFloat16: return 7.8125e-03;
    default: return 1.0;
  }
}

inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "f64";
    case at::kFloat: return "f32";
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    default: return "other";
  }
}

// Stable 64-bit FNV-1a hash (seeds derived from test names, so every parameter gets its own).
inline uint64_t name_seed(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h & 0x7fffffffffffull;
}

}  // namespace flashcos::test
