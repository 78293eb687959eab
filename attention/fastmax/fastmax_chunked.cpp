// Fastmax factorised path: feature maps, the chunked scan and the core forward / backward
// (math in attention/fastmax/fastmax_impl.h). Pure libtorch ops, any device; on CUDA the feature maps
// may come from attention/fastmax/cuda/fastmax.cu and the matmuls are cuBLAS (tensor cores for bf16/fp16).
//
// Precision: moments and outputs accumulate in float32 (float64 for double inputs). For bf16 /
// fp16 the tensor-core GEMMs take half operands; a float32 operand (moments, row gradients, the
// in-chunk weights) is scaled by its max and split into hi + lo halves, so a b = a_hi b_hi +
// a_hi b_lo + a_lo b_hi keeps ~16 significant bits instead of 8 and nothing overflows fp16.
#include "attention/fastmax/fastmax_impl.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

namespace flashcos::detail {
namespace {

// Elements of the largest per-step work tensor (features of a token block): bounds the
// workspace independently of the sequence length.
constexpr int64_t kWorkspaceElems = int64_t{1} << 27;
// Chunk of the fused CUDA scan (attention/fastmax/cuda/fastmax_scan.cu).
constexpr int64_t kFusedChunk = 64;

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// a (B, M, K) @ b (B, K, Nn) -> (B, M, Nn) in `acc`; cd is the compute dtype of the inputs.
// Half path: a float32 operand becomes scale * (hi + lo); a lone split operand is stacked along
// the free dim (rows of a / columns of b) so the other operand is never copied, and two split
// operands use a_hi b_hi + a_hi b_lo + a_lo b_hi stacked along K.
std::atomic<int> g_half_gemm_native{-1};  // bmm(out_dtype = float32) works: -1 unknown, 0 no, 1 yes

at::Tensor bmm_f32(const at::Tensor& a, const at::Tensor& b) {
  if (g_half_gemm_native.load() != 0) {
    try {
      at::Tensor out = at::bmm(a, b, at::kFloat);  // cuBLAS half GEMM with a float32 output
      g_half_gemm_native.store(1);
      return out;
    } catch (const c10::Error&) {
      g_half_gemm_native.store(0);  // a libtorch without bmm(out_dtype): never try again
    }
  }
  return at::bmm(a.to(at::kFloat), b.to(at::kFloat));
}

at::Tensor gemm_acc(const at::Tensor& a, const at::Tensor& b, at::ScalarType cd, at::ScalarType acc) {
  if (!is_half(cd)) return at::bmm(a.to(acc), b.to(acc));
  struct Split {
    at::Tensor hi, lo, scale;  // lo / scale undefined when the operand is already in cd
  };
  auto split = [&](const at::Tensor& t) {
    Split s;
    if (t.scalar_type() == cd) {
      s.hi = t;
      return s;
    }
    at::Tensor tf = t.to(at::kFloat);
    s.scale = tf.abs().amax({-2, -1}, /*keepdim=*/true).clamp_min(1e-30);
    at::Tensor ts = tf / s.scale;
    s.hi = ts.to(cd);
    s.lo = (ts - s.hi.to(at::kFloat)).to(cd);
    return s;
  };
  Split sa = split(a), sb = split(b);
  const int64_t M = a.size(-2), Nn = b.size(-1);
  at::Tensor out;
  if (!sa.lo.defined() && !sb.lo.defined()) {
    out = bmm_f32(sa.hi, sb.hi);
  } else if (!sa.lo.defined()) {
    at::Tensor o2 = bmm_f32(sa.hi, at::cat({sb.hi, sb.lo}, -1));
    out = o2.narrow(-1, 0, Nn) + o2.narrow(-1, Nn, Nn);
  } else if (!sb.lo.defined()) {
    at::Tensor o2 = bmm_f32(at::cat({sa.hi, sa.lo}, -2), sb.hi);
    out = o2.narrow(-2, 0, M) + o2.narrow(-2, M, M);
  } else {
    out = bmm_f32(at::cat({sa.hi, sa.hi, sa.lo}, -1), at::cat({sb.hi, sb.lo, sb.hi}, -2));
  }
  if (sa.scale.defined()) out.mul_(sa.scale);
  if (sb.scale.defined()) out.mul_(sb.scale);
  return out;
}

at::Tensor kernel_f(const at::Tensor& s, const FastmaxCoef& c) {
  at::Tensor f = s * c.a1 + c.a0;
  if (c.p == 2) f.add_(s * s * c.a2);
  return f;
}

at::Tensor kernel_fprime(const at::Tensor& s, const FastmaxCoef& c) {
  if (c.p == 1) return at::full_like(s, c.a1);
  return s * (2.0 * c.a2) + c.a1;
}

at::Tensor features(const at::Tensor& x, const FastmaxCoef& c, bool with_coef, bool cuda) {
  if (cuda && x.is_cuda()) return fastmax_features_cuda(x, c, with_coef);
  return fastmax_features(x, c, with_coef);
}

at::Tensor feature_grad(const at::Tensor& u, const at::Tensor& x, const FastmaxCoef& c, bool cuda) {
  if (cuda && x.is_cuda()) return fastmax_feature_grad_cuda(u, x, c);
  return fastmax_feature_grad(u, x, c);
}

// Non-causal: one moment matrix per head over all columns, applied to every row.
FastmaxScanResult scan_full(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w, const at::Tensor& g,
                            const FastmaxCoef& c, bool want_out, bool cuda) {
  if (cuda && fastmax_fused_scan_available(x))
    return fastmax_fused_scan_cuda(x, y, w, g, c, false, want_out);
  const int64_t N = x.size(0), Lx = x.size(1), Ly = y.size(1), D = x.size(2), E = w.size(2);
  const int64_t F = fastmax_num_features(c.p, D);
  const at::ScalarType cd = x.scalar_type(), acc = acc_type(cd);
  const int64_t block = std::max<int64_t>(1, kWorkspaceElems / (N * F));
  at::Tensor S = at::zeros({N, F, E}, x.options().dtype(acc));
  for (int64_t t0 = 0; t0 < Ly; t0 += block) {
    const int64_t n = std::min(block, Ly - t0);
    at::Tensor phy = features(y.narrow(1, t0, n), c, false, cuda);  // (N, n, F)
    S.add_(gemm_acc(phy.transpose(1, 2), w.narrow(1, t0, n), cd, acc));
  }
  FastmaxScanResult r;
  if (want_out) r.out = at::empty({N, Lx, E}, S.options());
  if (g.defined()) r.gx = at::empty({N, Lx, D}, S.options());
  const at::Tensor St = S.transpose(1, 2);
  for (int64_t t0 = 0; t0 < Lx; t0 += block) {
    const int64_t n = std::min(block, Lx - t0);
    at::Tensor xb = x.narrow(1, t0, n);
    if (want_out) r.out.narrow(1, t0, n).copy_(gemm_acc(features(xb, c, true, cuda), S, cd, acc));
    if (g.defined()) {
      at::Tensor u = gemm_acc(g.narrow(1, t0, n), St, cd, acc);  // (N, n, F)
      r.gx.narrow(1, t0, n).copy_(
          feature_grad(u.reshape({N * n, F}), xb.reshape({N * n, D}), c, cuda).view({N, n, D}));
    }
  }
  return r;
}

// Causal, aligned: x, y, w, g all (N, L, .), L a multiple of C, row r sees columns c <= r.
FastmaxScanResult scan_causal_aligned(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w,
                                      const at::Tensor& g, const FastmaxCoef& c, int64_t C, bool want_out,
                                      bool cuda) {
  const int64_t N = x.size(0), L = x.size(1), D = x.size(2), E = w.size(2);
  const int64_t F = fastmax_num_features(c.p, D);
  const at::ScalarType cd = x.scalar_type(), acc = acc_type(cd);
  // The fused kernel does the whole scan: moments on chip, in-chunk part in the kernel.
  if (cuda && C == kFusedChunk && fastmax_fused_scan_available(x))
    return fastmax_fused_scan_cuda(x, y, w, g, c, true, want_out);
  const int64_t chunks_per_group = std::max<int64_t>(1, kWorkspaceElems / (N * C * std::max(F, C)));
  const at::TensorOptions ao = x.options().dtype(acc);
  const at::Tensor mask = at::ones({C, C}, x.options().dtype(at::kBool)).tril();
  at::Tensor S0 = at::zeros({N, 1, F, E}, ao);  // moments of every column before the group
  FastmaxScanResult r;
  if (want_out) r.out = at::empty({N, L, E}, ao);
  if (g.defined()) r.gx = at::empty({N, L, D}, ao);
  for (int64_t t0 = 0; t0 < L; t0 += chunks_per_group * C) {
    const int64_t G = std::min(chunks_per_group, (L - t0) / C), n = G * C;
    at::Tensor xg = x.narrow(1, t0, n).reshape({N * G, C, D});
    at::Tensor yg = y.narrow(1, t0, n).reshape({N * G, C, D});
    at::Tensor wg = w.narrow(1, t0, n).reshape({N * G, C, E});
    at::Tensor gg = g.defined() ? g.narrow(1, t0, n).reshape({N * G, C, E}) : at::Tensor();
    // Inside each chunk: the exact weights f(x y^T) under the causal mask.
    at::Tensor s = gemm_acc(xg, yg.transpose(1, 2), cd, acc);  // (N G, C, C)
    at::Tensor out_g, gx_g;
    if (want_out) out_g = gemm_acc(at::where(mask, kernel_f(s, c), 0.0), wg, cd, acc);
    if (g.defined()) {
      at::Tensor dA = gemm_acc(gg, wg.transpose(1, 2), cd, acc);
      gx_g = gemm_acc(at::where(mask, kernel_fprime(s, c) * dA, 0.0), yg, cd, acc);
    }
    s = at::Tensor();
    // Across chunks: exclusive prefix sums of the per-chunk moments.
    at::Tensor dS = gemm_acc(features(yg, c, false, cuda).transpose(1, 2), wg, cd, acc).view({N, G, F, E});
    at::Tensor Sincl = dS.cumsum(1).add_(S0);
    dS = at::Tensor();
    at::Tensor Sexcl = at::cat({S0, Sincl.narrow(1, 0, G - 1)}, 1).view({N * G, F, E});
    S0 = Sincl.narrow(1, G - 1, 1).clone();
    Sincl = at::Tensor();
    if (want_out) {
      out_g.add_(gemm_acc(features(xg, c, true, cuda), Sexcl, cd, acc));
      r.out.narrow(1, t0, n).copy_(out_g.view({N, n, E}));
    }
    if (g.defined()) {
      at::Tensor u = gemm_acc(gg, Sexcl.transpose(1, 2), cd, acc);  // (N G, C, F)
      gx_g.add_(feature_grad(u.reshape({N * n, F}), xg.reshape({N * n, D}), c, cuda).view({N * G, C, D}));
      r.gx.narrow(1, t0, n).copy_(gx_g.view({N, n, D}));
    }
  }
  return r;
}

// Chunk of the causal scan when chunk_size is 0: balances the per-token cost of the in-chunk
// (C, C) weights (~C) against that of the per-chunk (F, E) moments (~F E / C).
int64_t auto_chunk(int64_t F, int64_t E) {
  const double c = std::sqrt(0.67 * double(F) * double(E));
  int64_t p2 = 32;
  while (p2 * 2 <= c && p2 < 512) p2 *= 2;
  return p2;
}

at::Tensor pad_rows(const at::Tensor& t, int64_t front, int64_t total) {
  if (!t.defined()) return t;
  const int64_t back = total - front - t.size(1);
  if (front == 0 && back == 0) return t;
  std::vector<at::Tensor> parts;
  if (front > 0) parts.push_back(at::zeros({t.size(0), front, t.size(2)}, t.options()));
  parts.push_back(t);
  if (back > 0) parts.push_back(at::zeros({t.size(0), back, t.size(2)}, t.options()));
  return at::cat(parts, 1);
}

// The dtype the core computes in. float32 inputs run in float64: the factorised sums cancel
// (sum_f phi_f S_f is much smaller than its terms), and in float32 their error was 5-10x that of
// the plain definition on an H100 (d 32..128); H100 float64 GEMMs run at the float32 SIMT rate.
// bf16 / fp16 stay half on CUDA (tensor cores, float32 accumulation) and become float32 on the CPU.
at::ScalarType compute_type(const at::Tensor& q) {
  const at::ScalarType t = q.scalar_type();
  if (t == at::kDouble || t == at::kFloat) return at::kDouble;
  if (is_half(t) && !q.is_cuda()) return at::kFloat;
  return t;
}

}  // namespace

int fastmax_half_gemm_state() { return g_half_gemm_native.load(); }

at::Tensor fastmax_features(const at::Tensor& x, const FastmaxCoef& c, bool with_coef) {
  const int64_t D = x.size(-1);
  auto lead = x.sizes().vec();
  lead.back() = 1;
  std::vector<at::Tensor> parts{at::full(lead, with_coef ? c.a0 : 1.0, x.options()),
                                with_coef ? x * c.a1 : x};
  if (c.p == 2) {
    at::Tensor idx = at::triu_indices(D, D, 0, x.options().dtype(at::kLong));
    at::Tensor quad = x.index_select(-1, idx[0]) * x.index_select(-1, idx[1]);
    if (with_coef) {
      at::Tensor wgt = at::where(idx[0] == idx[1], c.a2, 2.0 * c.a2).to(x.scalar_type());
      quad.mul_(wgt);
    }
    parts.push_back(quad);
  }
  return at::cat(parts, -1);
}

at::Tensor fastmax_feature_grad(const at::Tensor& u, const at::Tensor& x, const FastmaxCoef& c) {
  const int64_t D = x.size(-1), R = u.size(0);
  at::Tensor xf = x.to(u.scalar_type());
  at::Tensor gx = u.narrow(-1, 1, D) * c.a1;
  if (c.p == 2) {
    // Utilde (D, D) symmetric from the packed upper triangle: index 1 + D + packed(min, max).
    at::Tensor m = at::arange(D, x.options().dtype(at::kLong)).view({D, 1}).expand({D, D});
    at::Tensor r = m.t();
    at::Tensor lo = at::minimum(m, r), hi = at::maximum(m, r);
    at::Tensor map = (1 + D + lo * D - (lo * (lo - 1)).div(2, "floor") + (hi - lo)).reshape({D * D});
    at::Tensor U = u.index_select(-1, map).view({R, D, D});
    gx.add_(at::bmm(U, xf.unsqueeze(-1)).squeeze(-1), 2.0 * c.a2);
  }
  return gx;
}

FastmaxScanResult fastmax_scan(const at::Tensor& x, const at::Tensor& y, const at::Tensor& w, const at::Tensor& g,
                               const FastmaxCoef& c, bool causal, int64_t off, bool reverse, int64_t chunk,
                               bool want_out, bool cuda) {
  if (!causal) return scan_full(x, y, w, g, c, want_out, cuda);
  const int64_t N = x.size(0), Lx = x.size(1), Ly = y.size(1);
  if (reverse) {
    // Row r sees c >= r - off  <=>  flipped row r' sees c' <= r' + off + Ly - Lx.
    FastmaxScanResult r = fastmax_scan(x.flip(1), y.flip(1), w.flip(1), g.defined() ? g.flip(1) : g, c, true,
                                       off + Ly - Lx, false, chunk, want_out, cuda);
    if (r.out.defined()) r.out = r.out.flip(1);
    if (r.gx.defined()) r.gx = r.gx.flip(1);
    return r;
  }
  // Align positions: row r sits at position r + off and sees columns c <= its position.
  const at::ScalarType acc = acc_type(x.scalar_type());
  const int64_t drop = off < 0 ? std::min(Lx, -off) : 0;  // rows that see no column at all
  const int64_t front = std::max<int64_t>(off, 0);
  const int64_t Lx2 = front + Lx - drop;
  FastmaxScanResult r;
  if (Lx2 == front || Ly == 0) {
    if (want_out) r.out = at::zeros({N, Lx, w.size(2)}, x.options().dtype(acc));
    if (g.defined()) r.gx = at::zeros({N, Lx, x.size(2)}, x.options().dtype(acc));
    return r;
  }
  const int64_t len = std::max(Lx2, Ly);
  if (chunk <= 0)
    chunk = cuda && fastmax_fused_scan_available(x) ? kFusedChunk
                                                    : auto_chunk(fastmax_num_features(c.p, x.size(2)), w.size(2));
  const int64_t C = std::min(chunk, len);
  const int64_t L = (len + C - 1) / C * C;
  at::Tensor xs = drop > 0 ? x.narrow(1, drop, Lx - drop) : x;
  at::Tensor gs = g.defined() && drop > 0 ? g.narrow(1, drop, Lx - drop) : g;
  FastmaxScanResult a = scan_causal_aligned(pad_rows(xs, front, L), pad_rows(y, 0, L), pad_rows(w, 0, L),
                                            pad_rows(gs, front, L), c, C, want_out, cuda);
  auto unalign = [&](const at::Tensor& t) {
    at::Tensor body = t.narrow(1, front, Lx - drop);
    if (drop == 0) return body.contiguous();
    return at::cat({at::zeros({N, drop, t.size(2)}, t.options()), body}, 1);
  };
  if (want_out) r.out = unalign(a.out);
  if (g.defined()) r.gx = unalign(a.gx);
  return r;
}

FastmaxCoreForward fastmax_core_forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                        const FastmaxCoef& c, bool causal, int64_t chunk, bool cuda) {
  const at::ScalarType cd = compute_type(q_in);
  at::Tensor q = q_in.to(cd), k = k_in.to(cd), v = v_in.to(cd);
  const int64_t N = q.size(0), I = q.size(1), J = k.size(1), Dv = v.size(2);
  at::Tensor w = at::cat({v, at::ones({N, J, 1}, v.options())}, -1);  // [v, 1]
  FastmaxScanResult r = fastmax_scan(q, k, w, at::Tensor(), c, causal, J - I, false, chunk, true, cuda);
  FastmaxCoreForward f;
  f.den = r.out.select(-1, Dv).contiguous();
  at::Tensor den_safe = at::where(f.den > 0, f.den, 1.0);
  f.o32 = r.out.narrow(-1, 0, Dv) / den_safe.unsqueeze(-1);
  f.o = f.o32.to(q_in.scalar_type());
  return f;
}

FastmaxCoreBackward fastmax_core_backward(const at::Tensor& dout, const at::Tensor& q_in, const at::Tensor& k_in,
                                          const at::Tensor& v_in, const at::Tensor& o32, const at::Tensor& den,
                                          const FastmaxCoef& c, bool causal, int64_t chunk, bool cuda) {
  const at::ScalarType cd = compute_type(q_in);
  at::Tensor q = q_in.to(cd), k = k_in.to(cd), v = v_in.to(cd);
  const int64_t N = q.size(0), I = q.size(1), J = k.size(1), Dv = v.size(2);
  at::Tensor w = at::cat({v, at::ones({N, J, 1}, v.options())}, -1);
  // G = [g / den, -(g / den) . o]: dL/dA_ij = G_i . [v_j, 1].
  at::Tensor inv = at::where(den > 0, den.reciprocal(), 0.0).unsqueeze(-1);
  at::Tensor gh = dout.to(o32.scalar_type()) * inv;
  at::Tensor G = at::cat({gh, -(gh * o32).sum(-1, /*keepdim=*/true)}, -1);
  FastmaxScanResult fq = fastmax_scan(q, k, w, G, c, causal, J - I, false, chunk, false, cuda);
  FastmaxScanResult fk = fastmax_scan(k, q, G, w, c, causal, J - I, true, chunk, true, cuda);
  FastmaxCoreBackward b;
  b.dq = fq.gx.to(q_in.scalar_type());
  b.dk = fk.gx.to(k_in.scalar_type());
  b.dv = fk.out.narrow(-1, 0, Dv).to(v_in.scalar_type());
  return b;
}

}  // namespace flashcos::detail
