// The fused decode attention on libtorch tensors (decode_attention.h): checks and the launch.
#include "model/decode/decode_attention.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "model/decode/cuda/decode_attention.h"
#include "model/device.h"
#include "model/kernel_tensors.h"
#endif

namespace flashcos::model {

#ifdef FLASHCOS_WITH_CUDA
namespace {

namespace fc = flashcos::cuda;

fc::DType dtype_of(const at::Tensor& t) { return kernel_dtype(t.scalar_type(), "fused_decode_attention"); }

}  // namespace

bool fused_decode_attention_available(const ModelConfig& cfg, const at::Device& device) {
  const char* env = std::getenv("FLASHCOS_DECODE_KERNEL");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  if (!device.is_cuda() || (cfg.attention != "cosine" && cfg.attention != "exp")) return false;
  if (cfg.pos != "rope" && cfg.pos != "none") return false;
  if (cfg.dim_head > 256 || cfg.l2norm_groups > 256 ||
      !fc::decode_attention_supported(static_cast<int>(cfg.dim_head), static_cast<int>(cfg.l2norm_groups))) {
    return false;
  }
  // |logit| <= scale G: exp(scale q.k - shift) stays a normal float32 (cosine: >= exp(-2 scale G)).
  return cfg.attn_scale > 0 && cfg.attn_scale * static_cast<double>(cfg.l2norm_groups) <= 40.0 &&
         cfg.max_seq_len < (int64_t(1) << 30);
}

DecodeAttentionScratch make_decode_attention_scratch(const ModelConfig& cfg, const at::Device& device) {
  const c10::cuda::CUDAGuard guard(device);
  DecodeAttentionScratch s;
  s.splits = fc::decode_attention_splits(static_cast<int>(cfg.heads), static_cast<int>(cfg.max_seq_len),
                                         current_sm_count());
  const auto opts = at::TensorOptions().device(device);
  s.partials = at::zeros({cfg.heads, s.splits, cfg.dim_head + 1}, opts.dtype(at::kFloat));
  s.counters = at::zeros({cfg.heads}, opts.dtype(at::kInt));
  return s;
}

void fused_decode_attention(const ModelConfig& cfg, const at::Tensor& qkv, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& pos, const at::Tensor& inv_freq,
                            DecodeAttentionScratch& scratch) {
  const int64_t NH = cfg.heads, HS = cfg.dim_head, L = cfg.max_seq_len;
  TORCH_CHECK(qkv.is_cuda() && qkv.is_contiguous() && qkv.numel() == 3 * NH * HS, "fused_decode_attention: qkv ",
              qkv.sizes(), " must be a contiguous CUDA (1, ", 3 * NH * HS, ")");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous() && k.numel() == NH * L * HS && v.numel() == NH * L * HS &&
                  k.scalar_type() == qkv.scalar_type() && v.scalar_type() == qkv.scalar_type(),
              "fused_decode_attention: the rings must be contiguous (1, ", NH, ", ", L, ", ", HS, ") in qkv's dtype");
  TORCH_CHECK(out.is_contiguous() && out.numel() == NH * HS && out.scalar_type() == qkv.scalar_type(),
              "fused_decode_attention: out must be a contiguous (1, ", NH * HS, ") in qkv's dtype");
  TORCH_CHECK(pos.scalar_type() == at::kLong && pos.numel() == 1 && pos.is_cuda(),
              "fused_decode_attention: pos must be one int64 on the device");
  TORCH_CHECK(!inv_freq.defined() || (inv_freq.scalar_type() == at::kFloat && inv_freq.is_contiguous() &&
                                      inv_freq.numel() == HS / cfg.l2norm_groups / 2),
              "fused_decode_attention: inv_freq must be (HS / G / 2) float32");
  fc::DecodeAttentionParams p;
  p.qkv = qkv.data_ptr();
  p.k_cache = k.data_ptr(), p.v_cache = v.data_ptr(), p.out = out.data_ptr();
  p.dtype = dtype_of(qkv);
  p.pos = pos.data_ptr<int64_t>();
  p.inv_freq = inv_freq.defined() ? inv_freq.data_ptr<float>() : nullptr;
  p.partials = scratch.partials.data_ptr<float>();
  p.counters = reinterpret_cast<unsigned int*>(scratch.counters.data_ptr<int>());
  p.heads = static_cast<int>(NH), p.head_dim = static_cast<int>(HS), p.groups = static_cast<int>(cfg.l2norm_groups);
  p.max_len = static_cast<int>(L), p.splits = static_cast<int>(scratch.splits);
  p.scale = static_cast<float>(cfg.attn_scale);
  p.normalize = cfg.attention == "cosine";
  p.shift = p.normalize ? static_cast<float>(cfg.attn_scale * static_cast<double>(cfg.l2norm_groups)) : 0.f;
  const c10::cuda::CUDAGuard guard(qkv.device());
  C10_CUDA_CHECK(fc::run_decode_attention(p, at::cuda::getCurrentCUDAStream()));
}

#else

bool fused_decode_attention_available(const ModelConfig&, const at::Device&) { return false; }

DecodeAttentionScratch make_decode_attention_scratch(const ModelConfig&, const at::Device&) {
  throw std::invalid_argument("make_decode_attention_scratch: this build has no CUDA");
}

void fused_decode_attention(const ModelConfig&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, const at::Tensor&, DecodeAttentionScratch&) {
  throw std::invalid_argument("fused_decode_attention: this build has no CUDA");
}

#endif

}  // namespace flashcos::model
