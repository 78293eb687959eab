// A self-attention layer built on the installed flashcos library: a torch::nn module whose
// attention is flashcos::cosine_sim_attention, run forward and backward on random input; its output
// and input gradient are checked against the same layer through plain_cosine_sim_attention.
//   x (B, T, C) -> qkv projection -> q, k, v (B, H, T, D) -> causal cosine-sim attention
//   -> (B, T, H D) -> output projection.
#include <flashcos/attention.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>

struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(int64_t dim, int64_t heads)
      : heads_(heads),
        to_qkv_(register_module("to_qkv", torch::nn::Linear(torch::nn::LinearOptions(dim, 3 * dim).bias(false)))),
        to_out_(register_module("to_out", torch::nn::Linear(dim, dim))) {}

  // reference: true runs the plain libtorch reference instead of the fused / tiled path.
  torch::Tensor forward(const torch::Tensor& x, bool reference = false) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / heads_;
    auto qkv = to_qkv_(x).view({B, T, 3, heads_, D}).permute({2, 0, 3, 1, 4});  // (3, B, H, T, D)
    const auto options = flashcos::AttentionOptions().causal(true).scale(10);
    auto o = reference ? flashcos::plain_cosine_sim_attention(qkv[0], qkv[1], qkv[2], options)
                       : flashcos::cosine_sim_attention(qkv[0], qkv[1], qkv[2], options);  // (B, H, T, D)
    return to_out_(o.transpose(1, 2).reshape({B, T, C}));
  }

  int64_t heads_;
  torch::nn::Linear to_qkv_, to_out_;
};
TORCH_MODULE(SelfAttention);

int main() {
  torch::manual_seed(0);
  const auto device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const auto dtype = device == torch::kCUDA ? torch::kFloat64 : torch::kFloat32;
  SelfAttention layer(64, 4);
  layer->to(device, dtype);

  auto x = torch::randn({2, 37, 64}, torch::dtype(dtype).device(device)).requires_grad_(true);
  auto y = layer(x);
  auto dx = torch::autograd::grad({y.pow(2).sum()}, {x})[0];
  auto y_ref = layer(x, /*reference=*/true);
  auto dx_ref = torch::autograd::grad({y_ref.pow(2).sum()}, {x})[0];

  const double out_err = (y - y_ref).abs().max().item<double>();
  const double grad_err = (dx - dx_ref).abs().max().item<double>();
  std::printf("attention_layer on %s: output %s, max |y - y_ref| = %.3g, max |dx - dx_ref| = %.3g\n",
              device == torch::kCUDA ? "cuda" : "cpu", y.sizes() == x.sizes() ? "(2, 37, 64)" : "WRONG SHAPE",
              out_err, grad_err);
  const bool ok = y.sizes() == x.sizes() && out_err < 1e-4 && grad_err < 1e-3 && std::isfinite(out_err);
  std::printf("%s\n", ok ? "OK" : "MISMATCH");
  return ok ? 0 : 1;
}
