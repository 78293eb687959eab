// The torch -> kernel bridge of the fused attention: validates what the kernels assume, fills the
// torch-free Params structs (attention/cosine/cuda/params.h) in exactly one function per direction,
// allocates outputs and scratch, launches on the current stream and checks every CUDA call.
//
// Strides: the 16-bit kernels copy rows with 16-byte cp.async, so q, k, v, dout need a contiguous
// last dim, 16-byte aligned data and row / head / batch strides that are multiples of 8 elements;
// a tensor that isn't like that is copied to a contiguous one first (the only copies made here,
// besides a bias of another dtype, converted once to float32: the kernels read the bias in fp32).
// The fp32 / fp64 kernels take any strides with a contiguous last dim.
//
// FLASHCOS_POISON=1 fills every output with NaN before the launch (the tests set it), so a kernel
// that leaves an element unwritten cannot pass.
#include "attention/cosine/core.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <utility>


#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "attention/common/cuda/env_switch.h"
#include "attention/cosine/cuda/params.h"
#endif
#include "attention/cosine/dq_grid.h"

namespace flashcos::detail {

#ifdef FLASHCOS_WITH_CUDA
namespace {

namespace fc = flashcos::cuda;

bool is_16bit(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

fc::DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return fc::DType::kHalf;
    case at::kBFloat16: return fc::DType::kBFloat16;
    case at::kFloat: return fc::DType::kFloat;
    case at::kDouble: return fc::DType::kDouble;
    default:
      TORCH_CHECK(false, "flashcos fused attention: dtype ", t,
                  " is not supported; expected float16, bfloat16, float32 or float64");
  }
}

// Accumulator / bias / l dtype of an input dtype.
at::ScalarType acc_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// A (.., L, D) operand as the kernels need it (see the header comment); copies only if needed.
at::Tensor kernel_operand(const at::Tensor& t) {
  if (t.stride(-1) != 1 && t.size(-1) > 1) return t.contiguous();
  if (!is_16bit(t.scalar_type())) return t;
  bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) ok = ok && (t.stride(d) % 8 == 0 || t.size(d) == 1);
  return ok ? t : t.clone(at::MemoryFormat::Contiguous);
}

// An output the caller passes in (o_out, dv_out): `like`'s shape, dtype and device, and strides the
// kernels can write through as they are.
void check_output(const char* where, const char* name, const at::Tensor& out, const at::Tensor& like) {
  TORCH_CHECK(out.sizes() == like.sizes() && out.scalar_type() == like.scalar_type() &&
                  out.device() == like.device() && out.stride(-1) == 1 && kernel_operand(out).is_same(out),
              where, ": ", name, " must be a ", like.sizes(), " ", like.scalar_type(),
              " tensor with the kernels' strides (contiguous last dim, 16-byte aligned), got ", out.sizes(), " ",
              out.scalar_type(), " strides ", out.strides());
}

void check_inputs(const char* where, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), where,
              ": q, k, v must be CUDA tensors; use Backend::kTiled for CPU tensors");
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(), where,
              ": q, k, v must be on one device, got ", q.device(), ", ", k.device(), ", ", v.device());
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, where,
              ": expected canonical 4-D q (B, H, I, D), k, v (B, Hkv, J, D)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), where,
              ": q, k, v must share one dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  to_dtype(q.scalar_type());
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  const int64_t Hkv = k.size(1), J = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == J &&
                  k.size(3) == D && v.size(3) == D,
              where, ": k, v must be (B, Hkv, J, D) matching q ", q.sizes(), ", got k ", k.sizes(),
              " and v ", v.sizes());
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, where, ": query heads ", H,
              " must be a multiple of the key/value heads ", Hkv);
  TORCH_CHECK(fused_supports_head_dim(D), where, ": head dim ", D,
              " is not supported by the fused kernels (16, 32, 64, 80, 96, 128); use Backend::kTiled");
  TORCH_CHECK(B <= 65535 && H <= 65535, where, ": B and H must be <= 65535 (grid limits)");
  TORCH_CHECK(q.size(2) < (int64_t(1) << 31) && J < (int64_t(1) << 31), where, ": lengths must fit int32");
  if (mask.defined()) {
    TORCH_CHECK(mask.device() == q.device() && mask.scalar_type() == at::kBool && mask.dim() == 2 &&
                    mask.size(0) == B && mask.size(1) == J,
                where, ": mask must be a (B, J) = (", B, ", ", J, ") bool tensor on ", q.device(),
                ", got ", mask.sizes(), " ", mask.scalar_type(), " on ", mask.device());
  }
  if (bias.defined()) {
    const int64_t lead = args.bias_batch_dim ? B : H;
    TORCH_CHECK(bias.device() == q.device() && bias.dim() == 3 && bias.size(0) == lead &&
                    bias.size(1) == q.size(2) && bias.size(2) == J && at::isFloatingType(bias.scalar_type()),
                where, ": bias must be a floating (", args.bias_batch_dim ? "B" : "H", ", I, J) = (", lead,
                ", ", q.size(2), ", ", J, ") tensor on ", q.device(), ", got ", bias.sizes(), " ",
                bias.scalar_type(), " on ", bias.device());
  }
  if (is_16bit(q.scalar_type())) {
    const auto* prop = at::cuda::getCurrentDeviceProperties();
    TORCH_CHECK(prop->major >= 8, where, ": fp16 / bf16 kernels need sm_80 or newer, this GPU is sm_",
                prop->major, prop->minor, "; use float32 inputs or Backend::kTiled");
  }
}

// Everything both directions share. `bias` is already in the accumulator dtype.
void fill_common(fc::CommonParams& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args) {
  p.dtype = to_dtype(q.scalar_type());
  p.B = int(q.size(0));
  p.H = int(q.size(1));
  p.I = int(q.size(2));
  p.D = int(q.size(3));
  p.Hkv = int(k.size(1));
  p.J = int(k.size(2));
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.q_b_stride = q.stride(0), p.q_h_stride = q.stride(1), p.q_i_stride = q.stride(2);
  p.k_b_stride = k.stride(0), p.k_h_stride = k.stride(1), p.k_j_stride = k.stride(2);
  p.v_b_stride = v.stride(0), p.v_h_stride = v.stride(1), p.v_j_stride = v.stride(2);
  if (mask.defined()) {
    p.mask = reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>());
    p.mask_b_stride = mask.stride(0), p.mask_j_stride = mask.stride(1);
  }
  if (bias.defined()) {
    p.bias = bias.data_ptr();
    p.bias_batch_dim = args.bias_batch_dim;
    p.bias_0_stride = bias.stride(0), p.bias_i_stride = bias.stride(1), p.bias_j_stride = bias.stride(2);
  }
  p.causal = args.causal;
  p.exp_kind = args.exp_kind;
  p.scale = float(args.scale);
  p.scale_d = args.scale;
  p.qk_max = static_cast<float>(args.qk_max);
}

fc::FwdParams make_fwd_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args,
                              const at::Tensor& o, const at::Tensor& l) {
  fc::FwdParams p;
  fill_common(p, q, k, v, mask, bias, args);
  p.o = o.data_ptr();
  p.o_b_stride = o.stride(0), p.o_h_stride = o.stride(1), p.o_i_stride = o.stride(2);
  p.l = l.defined() ? l.data_ptr() : nullptr;
  return p;
}

struct BwdBuffers {
  at::Tensor delta, row_offset, dq_accum, dq, dk, dv, dbias_accum;
  // dq in 16 bits from the launcher: (B, Hkv) int32 counters zeroed with dq_accum, in its storage
  // (dq_finish.cuh); undefined where the caller converts dq_accum itself.
  at::Tensor dq_done;
  // 16-bit kernels: one int32 zeroed with dq_accum, in its storage, from which the Hopper backward's
  // persistent grid hands out its items (BwdParams::item_counter).
  at::Tensor item_counter;
  at::Tensor dq_semaphore;  // deterministic mode, 16-bit kernels: (B, H, ceil(I / 16) + 1) int32 counters (dq_semaphore.cuh)
  at::Tensor dq_grid, dq_grid_kv;  // deterministic mode, cosine kind: (B, H, I) float, (B, Hkv, 2) int32 (dq_grid.h)
  int64_t dq_zero_floats = 0;  // > 0: dq_accum's storage comes unzeroed, for the launcher to zero (BwdParams)
};

fc::BwdParams make_bwd_params(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& o, const at::Tensor& l,
                              const at::Tensor& mask, const at::Tensor& bias, const CoreArgs& args,
                              const BwdBuffers& buf) {
  fc::BwdParams p;
  fill_common(p, q, k, v, mask, bias, args);
  p.o = o.data_ptr();
  p.o_b_stride = o.stride(0), p.o_h_stride = o.stride(1), p.o_i_stride = o.stride(2);
  p.dout = dout.data_ptr();
  p.do_b_stride = dout.stride(0), p.do_h_stride = dout.stride(1), p.do_i_stride = dout.stride(2);
  p.l = l.defined() ? l.data_ptr() : nullptr;
  p.delta = buf.delta.data_ptr();
  p.row_offset = buf.row_offset.defined() ? buf.row_offset.data_ptr() : nullptr;
  p.dq_accum = buf.dq_accum.defined() ? buf.dq_accum.data_ptr() : nullptr;
  p.dq = buf.dq_accum.defined() ? nullptr : buf.dq.data_ptr();
  p.dq_zero_floats = buf.dq_zero_floats;
  // 16-bit dq from dq_accum by the launcher's last kernel (with the counters where the kernel takes
  // them), unless the caller keeps dq_accum or converts it (FLASHCOS_DQ_FINISH=0).
  if (buf.dq_accum.defined() && buf.dq.defined() && buf.dq_done.defined()) {
    p.dq_out = buf.dq.data_ptr();
    p.dq_done = buf.dq_done.data_ptr<int>();
  }
  p.item_counter = buf.item_counter.defined() ? buf.item_counter.data_ptr<int>() : nullptr;
  p.dk = buf.dk.data_ptr();
  p.dv = buf.dv.data_ptr();
  p.dk_b_stride = buf.dk.stride(0), p.dk_h_stride = buf.dk.stride(1), p.dk_j_stride = buf.dk.stride(2);
  p.dv_b_stride = buf.dv.stride(0), p.dv_h_stride = buf.dv.stride(1), p.dv_j_stride = buf.dv.stride(2);
  p.dbias_accum = buf.dbias_accum.defined() ? buf.dbias_accum.data_ptr() : nullptr;
  p.dbias_per_head = args.deterministic && buf.dbias_accum.defined();
  p.dq_semaphore = buf.dq_semaphore.defined() ? buf.dq_semaphore.data_ptr<int>() : nullptr;
  p.dq_grid = buf.dq_grid.defined() ? buf.dq_grid.data_ptr<float>() : nullptr;
  p.dq_grid_kv = buf.dq_grid_kv.defined() ? reinterpret_cast<unsigned*>(buf.dq_grid_kv.data_ptr<int>()) : nullptr;
  return p;
}

// The Hopper kernels' split tail (hopper/split_tail.h), where the launcher plans one for p (fc::FwdParams
// or fc::BwdParams): `slots` slots of slot_floats floats and as many zeroed counters, set in p; the
// tensors returned keep them alive until the launch is queued.
template <typename Params>
std::pair<at::Tensor, at::Tensor> give_split_slots(Params& p, int64_t slots, int slot_floats, const at::Tensor& like) {
  if (slots <= 0) return {};
  at::Tensor scratch = at::empty({slots * slot_floats}, like.options().dtype(at::kFloat));
  at::Tensor count = at::zeros({slots}, like.options().dtype(at::kInt));
  p.split_scratch = scratch.data_ptr<float>();
  p.split_count = count.data_ptr<int>();
  p.split_slots = slots;
  return {scratch, count};
}

}  // namespace

ForwardResult fused_forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const at::Tensor& mask, const at::Tensor& bias_in, const CoreArgs& args,
                            const at::Tensor& o_out) {
  check_inputs("flashcos fused_forward", q_in, k_in, v_in, mask, bias_in, args);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = kernel_operand(q_in), k = kernel_operand(k_in), v = kernel_operand(v_in);
  const at::ScalarType acc = acc_dtype(q.scalar_type());
  const at::Tensor bias = bias_in.defined() ? bias_in.to(acc) : bias_in;

  const int64_t B = q.size(0), H = q.size(1), I = q.size(2), D = q.size(3);
  at::Tensor o = o_out.defined() ? o_out : at::empty({B, H, I, D}, q.options());  // (B, H, I, D)
  check_output("flashcos fused_forward", "o_out", o, q);
  at::Tensor l;
  if (!args.exp_kind) l = at::empty({B, H, I}, q.options().dtype(acc));  // (B, H, I)
  poison_if_requested(o);
  poison_if_requested(l);
  fc::FwdParams p = make_fwd_params(q, k, v, mask, bias, args, o, l);
  int slot_floats = 0;
  const int64_t slots = fc::run_fwd_split_slots(p, &slot_floats);
  const auto split = give_split_slots(p, slots, slot_floats, q);  // the split tail's slots, if planned
  C10_CUDA_CHECK(fc::run_fwd(p, c10::cuda::getCurrentCUDAStream()));
  return {o, l};
}

BackwardResult fused_backward(const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
                              const at::Tensor& v_in, const at::Tensor& o_in, const at::Tensor& l,
                              const at::Tensor& mask, const at::Tensor& bias_in, const CoreArgs& args,
                              bool dq_float, const at::Tensor& dv_out) {
  const char* where = "flashcos fused_backward";
  check_inputs(where, q_in, k_in, v_in, mask, bias_in, args);
  TORCH_CHECK(dout_in.sizes() == q_in.sizes() && o_in.sizes() == q_in.sizes(), where,
              ": dout and o must have q's shape ", q_in.sizes(), ", got ", dout_in.sizes(), " and ", o_in.sizes());
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = kernel_operand(q_in), k = kernel_operand(k_in), v = kernel_operand(v_in);
  const at::Tensor dout = kernel_operand(dout_in.to(q.scalar_type()));
  const at::Tensor o = kernel_operand(o_in);
  const at::ScalarType acc = acc_dtype(q.scalar_type());
  at::Tensor lc;
  if (!args.exp_kind) {
    TORCH_CHECK(l.defined() && l.sizes() == q.sizes().slice(0, 3), where,
                ": the cosine kind needs l (B, H, I) from the forward");
    lc = l.to(acc).contiguous();
  }
  const at::Tensor bias = bias_in.defined() ? bias_in.to(acc) : bias_in;

  const int64_t B = q.size(0), H = q.size(1), I = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), J = k.size(2);
  const auto acc_opts = q.options().dtype(acc);
  BwdBuffers buf;
  buf.delta = at::empty({B, H, I}, acc_opts);  // (B, H, I)
  const bool accum = is_16bit(q.scalar_type());
  if (!(accum && dq_float)) buf.dq = at::empty({B, H, I, D}, q.options());
  if (accum) {
    buf.row_offset = at::empty({B, H, I}, acc_opts);           // (B, H, I)
    // FLASHCOS_DQ_FINISH=0: dq by a copy here after the launch, as before dq_finish.cuh (read once).
    static const bool finish_on = fc::env_switch_on("FLASHCOS_DQ_FINISH");
    // FLASHCOS_DELTA_ZEROES=0: the storage below zeroed by a fill here, as before the delta kernel
    // zeroed it (read once).
    static const bool delta_zeroes = fc::env_switch_on("FLASHCOS_DELTA_ZEROES");
    // One allocation for dq_accum (B, H, I, D), the item counter and, with dq_finish, the heads'
    // counters, zeroed by the launcher's delta kernel as it reads O and dO (BwdParams::dq_zero_floats).
    const bool finish = buf.dq.defined() && finish_on;
    const int64_t n = B * H * I * D, counters = 1 + (finish ? B * Hkv : 0);
    const at::Tensor storage =
        delta_zeroes ? at::empty({n + counters}, acc_opts) : at::zeros({n + counters}, acc_opts);
    if (delta_zeroes) {
      buf.dq_zero_floats = n + counters;
      poison_if_requested(storage);  // the tests' NaN: any element left unzeroed breaks dq or a counter
    }
    buf.dq_accum = storage.narrow(0, 0, n).view({B, H, I, D});
    buf.item_counter = storage.narrow(0, n, 1).view(at::kInt);
    if (finish) buf.dq_done = storage.narrow(0, n + 1, B * Hkv).view(at::kInt);
    if (args.deterministic) buf.dq_semaphore = at::zeros({B, H, (I + 15) / 16 + 1}, q.options().dtype(at::kInt));
    // The Hopper backward rounds dq to each row's grid (its launcher computes the grid) and adds in
    // any order (dq_grid.h); the other kernels keep the ordered adds.
    // FLASHCOS_DQ_GRID=0: the ordered adds everywhere, for comparisons (read once).
    static const bool grid_on = fc::env_switch_on("FLASHCOS_DQ_GRID");
    if (args.deterministic && !args.exp_kind && grid_on) {
      buf.dq_grid = at::empty({B, H, I}, q.options().dtype(at::kFloat));
      buf.dq_grid_kv = at::zeros({B, Hkv, 2}, q.options().dtype(at::kInt));
    }
  }
  buf.dk = at::empty({B, Hkv, J, D}, q.options());
  buf.dv = dv_out.defined() ? dv_out : at::empty({B, Hkv, J, D}, q.options());
  check_output(where, "dv_out", buf.dv, v);
  // Deterministic: dbias per (b, h), each element written once, then summed over the broadcast dim.
  if (bias.defined()) {
    buf.dbias_accum = args.deterministic ? at::zeros({B, H, I, J}, acc_opts) : at::zeros({bias.size(0), I, J}, acc_opts);
  }
  poison_if_requested(buf.dq);
  poison_if_requested(buf.dk);
  poison_if_requested(buf.dv);

  BackwardResult r;
  fc::BwdParams p = make_bwd_params(dout, q, k, v, o, lc, mask, bias, args, buf);
  if (accum) p.dq_scale_left = &r.dq_factor;  // without dq_out: the scale the kernel may leave to us
  int slot_floats = 0;
  const int64_t slots = fc::run_bwd_split_slots(p, &slot_floats);
  const auto split = give_split_slots(p, slots, slot_floats, q);  // the split tail's dK / dV slots, if planned
  C10_CUDA_CHECK(fc::run_bwd(p, c10::cuda::getCurrentCUDAStream()));

  if (buf.dq_accum.defined() && buf.dq.defined() && !buf.dq_done.defined()) {  // FLASHCOS_DQ_FINISH=0
    if (r.dq_factor != 1.f) buf.dq_accum.mul_(r.dq_factor);
    buf.dq.copy_(buf.dq_accum);
    r.dq_factor = 1.f;
  }
  r.dq = buf.dq.defined() ? buf.dq : buf.dq_accum;
  r.dk = buf.dk;
  r.dv = buf.dv;
  if (bias_in.defined()) {
    r.dbias = at::empty(bias_in.sizes(), bias_in.options());
    poison_if_requested(r.dbias);
    r.dbias.copy_(args.deterministic ? buf.dbias_accum.sum(args.bias_batch_dim ? 1 : 0) : buf.dbias_accum);
  }
  return r;
}

bool fused_supports_head_dim(int64_t d) { return fc::supports_head_dim(int(d)); }

at::Tensor dq_grid_constants_cuda(const at::Tensor& dout, const at::Tensor& k, const at::Tensor& v, double scale) {
  const char* where = "flashcos dq_grid_constants_cuda";
  TORCH_CHECK(dout.is_cuda() && is_16bit(dout.scalar_type()) && k.scalar_type() == dout.scalar_type() &&
                  v.scalar_type() == dout.scalar_type() && dout.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() &&
                  k.size(1) > 0 && dout.size(1) % k.size(1) == 0 && k.size(3) == dout.size(3),
              where, ": dout (B, H, I, D) and k, v (B, Hkv, J, D), fp16 / bf16 CUDA tensors of one dtype, got ",
              dout.sizes(), " ", dout.scalar_type(), ", ", k.sizes(), ", ", v.sizes());
  const c10::cuda::CUDAGuard guard(dout.device());
  const at::Tensor d = dout.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  CoreArgs args;
  args.scale = scale;
  fc::BwdParams p;
  fill_common(p, d, kc, vc, at::Tensor(), at::Tensor(), args);
  p.dout = d.data_ptr();
  p.do_b_stride = d.stride(0), p.do_h_stride = d.stride(1), p.do_i_stride = d.stride(2);
  // The delta kernel computes the rows' constants; its own outputs (from o = dout, l = 1) are dropped.
  p.o = d.data_ptr();
  p.o_b_stride = d.stride(0), p.o_h_stride = d.stride(1), p.o_i_stride = d.stride(2);
  const auto f32 = d.options().dtype(at::kFloat);
  const at::Tensor l = at::ones({d.size(0), d.size(1), d.size(2)}, f32);
  const at::Tensor scratch = at::empty({2, d.size(0), d.size(1), d.size(2)}, f32);
  p.l = l.data_ptr();
  p.delta = scratch[0].data_ptr();
  p.row_offset = scratch[1].data_ptr();
  at::Tensor grid = at::empty({d.size(0), d.size(1), d.size(2)}, f32);
  const at::Tensor kv = at::zeros({k.size(0), k.size(1), 2}, d.options().dtype(at::kInt));
  p.dq_grid = grid.data_ptr<float>();
  p.dq_grid_kv = reinterpret_cast<unsigned*>(kv.data_ptr<int>());
  C10_CUDA_CHECK(fc::run_dq_grid(p, c10::cuda::getCurrentCUDAStream()));
  return grid;
}

#else  // no CUDA in this build

ForwardResult fused_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const CoreArgs&, const at::Tensor&) {
  TORCH_CHECK(false, "flashcos: this build has no CUDA kernels (nvcc was not found at configure "
                     "time); use Backend::kTiled or kPlain");
}

BackwardResult fused_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const CoreArgs&, bool, const at::Tensor&) {
  TORCH_CHECK(false, "flashcos: this build has no CUDA kernels; use Backend::kTiled or kPlain");
}

bool fused_supports_head_dim(int64_t d) {
  return d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128;
}

at::Tensor dq_grid_constants_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
  TORCH_CHECK(false, "flashcos: this build has no CUDA kernels");
}

#endif

}  // namespace flashcos::detail
