// grad_accumulates_here (grad_accumulate.h).
#include "model/fused/grad_accumulate.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>

namespace flashcos::model::fused {
namespace {
std::atomic<int> g_idle_post_hooks{0};  // open IdleAccumulatorPostHooks scopes
}  // namespace

IdleAccumulatorPostHooks::IdleAccumulatorPostHooks() { g_idle_post_hooks.fetch_add(1); }
IdleAccumulatorPostHooks::~IdleAccumulatorPostHooks() { g_idle_post_hooks.fetch_sub(1); }

bool grad_accumulates_here(const at::Tensor& param, bool allow_undefined) {
  if (!param.defined() || at::GradMode::is_enabled() || !param.requires_grad() || param.grad_fn()) return false;
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (exec_info != nullptr && !exec_info->empty()) return false;
  if (const auto acc = torch::autograd::impl::try_get_grad_accumulator(param)) {
    const bool post_hooks = !acc->post_hooks().empty() && g_idle_post_hooks.load() == 0;
    if (!acc->pre_hooks().empty() || !acc->tensor_pre_hooks().empty() || post_hooks ||
        !acc->retains_grad_hooks().empty()) {
      return false;
    }
  }
  const at::Tensor& g = param.grad();
  if (!g.defined()) return allow_undefined;
  return g.scalar_type() == param.scalar_type() && g.sizes() == param.sizes() && g.is_contiguous() &&
         g.device() == param.device() && !g.is_sparse();
}

}  // namespace flashcos::model::fused
