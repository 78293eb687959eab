// Fastmax entry point: option and shape validation, per-token normalisation, the O(I J)
// reference, and the torch::autograd::Function around the factorised core (fastmax_chunked.cpp).
#include <flashcos/fastmax.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/fastmax/fastmax_impl.h"

namespace flashcos {
namespace {

using detail::FastmaxCoef;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kNormEps = 1e-12;

FastmaxCoef coef_of(const FastmaxOptions& o) { return FastmaxCoef{o.p(), o.a0(), o.a1(), o.p() == 2 ? o.a2() : 0.0}; }

// Canonical form: q (N, I, D), k (N, J, D), v (N, J, Dv) with N = B * H; `shape` is q's shape.
struct Canonical {
  at::Tensor q, k, v;
  std::vector<int64_t> out_shape;  // q's shape with Dv as the last dim
};

Canonical canonicalise(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "fastmax_attention: q, k and v must be defined tensors");
  TORCH_CHECK(at::isFloatingType(q.scalar_type()) && q.scalar_type() == k.scalar_type() &&
                  q.scalar_type() == v.scalar_type(),
              "fastmax_attention: q, k, v must share one floating dtype (float64/float32/bfloat16/float16); got ",
              q.scalar_type(), ", ", k.scalar_type(), ", ", v.scalar_type());
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(),
              "fastmax_attention: q, k, v must be on one device; got ", q.device(), ", ", k.device(), ", ",
              v.device());
  TORCH_CHECK(q.dim() == 3 || q.dim() == 4,
              "fastmax_attention: q must be (B, H, I, D) or merged (BH, I, D); got shape ", q.sizes());
  TORCH_CHECK(k.dim() == v.dim() && k.sizes().slice(0, k.dim() - 1) == v.sizes().slice(0, v.dim() - 1),
              "fastmax_attention: k and v must have the same shape apart from the last dim; got ", k.sizes(),
              " and ", v.sizes());
  const int64_t D = q.size(-1);
  TORCH_CHECK(D >= 1 && k.size(-1) == D, "fastmax_attention: q and k must have the same head dim; got q ",
              q.sizes(), ", k ", k.sizes());
  TORCH_CHECK(v.size(-1) >= 1, "fastmax_attention: v needs a non-empty last dim; got ", v.sizes());
  Canonical c;
  c.out_shape = q.sizes().vec();
  c.out_shape.back() = v.size(-1);
  if (q.dim() == 3) {
    TORCH_CHECK(k.dim() == 3 && k.size(0) == q.size(0),
                "fastmax_attention: merged q (BH, I, D) needs k, v (BH, J, D) with the same BH; got q ", q.sizes(),
                ", k ", k.sizes());
    c.q = q;
    c.k = k;
    c.v = v;
    return c;
  }
  const int64_t B = q.size(0), H = q.size(1), I = q.size(2);
  at::Tensor k4 = k, v4 = v;
  if (k.dim() == 3) {  // single-headed (B, J, D)
    k4 = k.unsqueeze(1);
    v4 = v.unsqueeze(1);
  }
  TORCH_CHECK(k4.dim() == 4 && k4.size(0) == B,
              "fastmax_attention: with q (B, H, I, D), k and v must be (B, Hkv, J, D) or (B, J, D) with the same B; "
              "got q ",
              q.sizes(), ", k ", k.sizes());
  const int64_t Hkv = k4.size(1), J = k4.size(2);
  TORCH_CHECK(Hkv >= 1 && H % Hkv == 0, "fastmax_attention: q heads (", H, ") must be a multiple of k/v heads (",
              Hkv, ")");
  const int64_t R = H / Hkv;
  // Query head h reads kv head h / R: expand (a copy; its gradient sums back through autograd).
  auto expand = [&](const at::Tensor& t) {
    if (R == 1) return t.reshape({B * H, J, t.size(-1)});
    return t.unsqueeze(2).expand({B, Hkv, R, J, t.size(-1)}).reshape({B * H, J, t.size(-1)});
  };
  c.q = q.reshape({B * H, I, D});
  c.k = expand(k4);
  c.v = expand(v4);
  return c;
}

// lim * x / max(|x|, eps) per token, times `extra` (1 / temperature for q); computed in >= float32.
at::Tensor normalise_tokens(const at::Tensor& x, double lim, double extra) {
  const at::ScalarType t = x.scalar_type();
  at::Tensor xf = t == at::kDouble ? x : x.to(at::kFloat);
  at::Tensor n = at::linalg_vector_norm(xf, 2, {-1}, /*keepdim=*/true).clamp_min(kNormEps);
  return (xf * (lim * extra) / n).to(t);
}

class FastmaxFunction : public torch::autograd::Function<FastmaxFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               int64_t p, double a0, double a1, double a2, bool causal, int64_t chunk, bool cuda) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const FastmaxCoef c{p, a0, a1, a2};
    detail::FastmaxCoreForward f = detail::fastmax_core_forward(q, k, v, c, causal, chunk, cuda);
    ctx->save_for_backward({q, k, v, f.o32, f.den});
    ctx->saved_data["p"] = p;
    ctx->saved_data["a0"] = a0;
    ctx->saved_data["a1"] = a1;
    ctx->saved_data["a2"] = a2;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["cuda"] = cuda;
    return {f.o};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto s = ctx->get_saved_variables();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const FastmaxCoef c{ctx->saved_data["p"].toInt(), ctx->saved_data["a0"].toDouble(),
                        ctx->saved_data["a1"].toDouble(), ctx->saved_data["a2"].toDouble()};
    at::Tensor dout = grad_outputs[0];
    if (!dout.defined()) dout = at::zeros_like(s[3]);
    detail::FastmaxCoreBackward g = detail::fastmax_core_backward(
        dout, s[0], s[1], s[2], s[3], s[4], c, ctx->saved_data["causal"].toBool(), ctx->saved_data["chunk"].toInt(),
        ctx->saved_data["cuda"].toBool());
    return {g.dq,        g.dk,        g.dv,        at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The definition on canonical tensors (q already normalised / divided by temperature).
at::Tensor reference_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FastmaxCoef& c,
                          bool causal) {
  const int64_t I = q.size(1), J = k.size(1);
  at::Tensor s = at::matmul(q, k.transpose(1, 2));  // (N, I, J)
  at::Tensor a = s * c.a1 + c.a0;
  if (c.p == 2) a = a + s * s * c.a2;
  if (causal) {
    at::Tensor i = at::arange(I, q.options().dtype(at::kLong)).view({I, 1});
    at::Tensor j = at::arange(J, q.options().dtype(at::kLong)).view({1, J});
    a = at::where(j <= i + (J - I), a, 0.0);
  }
  at::Tensor den = a.sum(-1, /*keepdim=*/true);
  at::Tensor safe = at::where(den > 0, den, 1.0);
  return at::matmul(a, v) / safe;
}

}  // namespace

std::string to_string(FastmaxBackend backend) {
  switch (backend) {
    case FastmaxBackend::kAuto: return "auto";
    case FastmaxBackend::kChunked: return "chunked";
    case FastmaxBackend::kCuda: return "cuda";
    case FastmaxBackend::kReference: return "reference";
  }
  return "?";
}

double fastmax_min_weight(const FastmaxOptions& o) {
  const double inf = std::numeric_limits<double>::infinity();
  const double R = o.normalize() ? o.lim() * o.lim() / o.temperature() : inf;  // |s| <= R
  const double a0 = o.a0(), a1 = o.a1(), a2 = o.p() == 2 ? o.a2() : 0.0;
  auto f = [&](double x) { return a0 + a1 * x + a2 * x * x; };
  if (std::isinf(R)) {
    if (a2 > 0) return a0 - a1 * a1 / (4 * a2);
    if (a2 == 0 && a1 == 0) return a0;
    return -inf;
  }
  double m = std::min(f(-R), f(R));
  if (a2 > 0) {
    const double vertex = -a1 / (2 * a2);
    if (std::abs(vertex) <= R) m = std::min(m, f(vertex));
  }
  return m;
}

void check_fastmax_options(const FastmaxOptions& o) {
  TORCH_CHECK(o.p() == 1 || o.p() == 2, "fastmax: p must be 1 (a0 + a1 x) or 2 (a0 + a1 x + a2 x^2); got ", o.p());
  TORCH_CHECK(o.temperature() > 0 && std::isfinite(o.temperature()),
              "fastmax: temperature must be a finite number > 0; got ", o.temperature());
  TORCH_CHECK(o.lim() > 0 && std::isfinite(o.lim()), "fastmax: lim must be a finite number > 0; got ", o.lim());
  TORCH_CHECK(o.chunk_size() >= 0, "fastmax: chunk_size must be >= 1, or 0 for automatic; got ", o.chunk_size());
  TORCH_CHECK(std::isfinite(o.a0()) && std::isfinite(o.a1()) && std::isfinite(o.a2()),
              "fastmax: a0, a1, a2 must be finite");
  const double m = fastmax_min_weight(o);
  if (m > 0) return;
  if (o.p() == 1 && !o.normalize()) {
    TORCH_CHECK(false, "fastmax: p = 1 (f = a0 + a1 x) without normalize lets q.k reach -a0/a1, where the "
                       "denominator sum_j f(s_ij) can be 0 or negative; set normalize(true) with "
                       "a0 > |a1| lim^2 / temperature, or use p = 2");
  }
  TORCH_CHECK(false, "fastmax: the kernel f(s) = ", o.a0(), " + ", o.a1(), " s",
              o.p() == 2 ? " + " + std::to_string(o.a2()) + " s^2" : std::string(),
              " reaches ", m, " <= 0 on the reachable range of s (",
              o.normalize() ? "|s| <= lim^2 / temperature = " + std::to_string(o.lim() * o.lim() / o.temperature())
                            : std::string("all reals, normalize is off"),
              "), so the denominator can vanish; use a2 > 0 with a1^2 < 4 a0 a2, or normalize(true) with a small "
              "enough lim");
}

at::Tensor fastmax_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const FastmaxOptions& options) {
  check_fastmax_options(options);
  Canonical c = canonicalise(q, k, v);
  FastmaxBackend backend = options.backend();
  if (backend == FastmaxBackend::kAuto)
    backend = q.is_cuda() && fastmax_cuda_compiled() ? FastmaxBackend::kCuda : FastmaxBackend::kChunked;
  if (backend == FastmaxBackend::kCuda) {
    TORCH_CHECK(fastmax_cuda_compiled(),
                "fastmax_attention: backend kCuda needs a build with the CUDA kernels (nvcc was not found at "
                "configure time); use FastmaxBackend::kChunked");
    TORCH_CHECK(q.is_cuda(), "fastmax_attention: backend kCuda needs CUDA tensors; got ", q.device(),
                "; use kAuto or kChunked for CPU tensors");
  }
  const double inv_t = 1.0 / options.temperature();
  at::Tensor qq = c.q, kk = c.k;
  if (options.normalize()) {
    qq = normalise_tokens(qq, options.lim(), inv_t);
    kk = normalise_tokens(kk, options.lim(), 1.0);
  } else if (inv_t != 1.0) {
    qq = qq * inv_t;
  }
  const FastmaxCoef coef = coef_of(options);
  at::Tensor o;
  if (backend == FastmaxBackend::kReference) {
    o = reference_core(qq, kk, c.v, coef, options.causal());
  } else {
    o = FastmaxFunction::apply(qq, kk, c.v, coef.p, coef.a0, coef.a1, coef.a2, options.causal(),
                               options.chunk_size(), backend == FastmaxBackend::kCuda)[0];
  }
  return o.reshape(c.out_shape);
}

at::Tensor fastmax_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const FastmaxOptions& options) {
  FastmaxOptions o = options;
  o.backend(FastmaxBackend::kReference);
  return fastmax_attention(q, k, v, o);
}

}  // namespace flashcos
