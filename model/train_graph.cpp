// The captured training micro-step (train_graph.h).
#include "model/train_graph.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <utility>

#include "model/optim.h"

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace flashcos::model {

#ifdef FLASHCOS_WITH_CUDA
struct TrainStepGraph::Impl {
  std::function<at::Tensor(const at::Tensor&)> micro_step;
  at::cuda::CUDAGraph graph;
  at::Tensor batch;  // the static input every replay reads
  at::Tensor loss;   // the static output every replay writes
  bool captured = false;
};

TrainStepGraph::TrainStepGraph(std::function<at::Tensor(const at::Tensor&)> micro_step)
    : impl_(std::make_unique<Impl>()) {
  impl_->micro_step = std::move(micro_step);
}

TrainStepGraph::~TrainStepGraph() = default;

at::Tensor TrainStepGraph::run(const at::Tensor& batch) {
  Impl& s = *impl_;
  if (s.captured) {
    if (batch.sizes() != s.batch.sizes()) {
      throw std::invalid_argument("TrainStepGraph: batch of shape " + c10::str(batch.sizes()) +
                                  " but the graph was captured for " + c10::str(s.batch.sizes()));
    }
    s.batch.copy_(batch, /*non_blocking=*/true);
    s.graph.replay();
    return s.loss;
  }
  const c10::Device device = batch.is_cuda() ? batch.device() : c10::Device(c10::kCUDA, c10::cuda::current_device());
  const c10::cuda::CUDAGuard guard(device);
  if (c10::cuda::getCurrentCUDAStream() == c10::cuda::getDefaultCUDAStream()) {
    throw std::logic_error("TrainStepGraph: capture needs a non-default current stream");
  }
  s.batch = at::empty(batch.sizes(), batch.options().device(device).pinned_memory(false));
  s.batch.copy_(batch, /*non_blocking=*/true);
  s.graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);  // {0, 0}: a private pool
  try {
    s.loss = s.micro_step(s.batch);  // recorded, not executed
  } catch (...) {
    try {
      s.graph.capture_end();
    } catch (...) {
    }
    (void)cudaGetLastError();  // a failed capture's error is not sticky: clear it
    throw;
  }
  s.graph.capture_end();
  s.captured = true;
  // The eager steps' cached blocks are not needed again (the graph has its own pool).
  c10::cuda::CUDACachingAllocator::emptyCache();
  s.graph.replay();
  return s.loss;
}

struct GraphStreamScope::Impl {
  c10::cuda::CUDAStream previous;
  c10::cuda::CUDAStream side;
};

GraphStreamScope::GraphStreamScope(const c10::Device& device) {
  const c10::cuda::CUDAGuard guard(device);
  const auto previous = c10::cuda::getCurrentCUDAStream();
  const auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  impl_ = std::make_unique<Impl>(Impl{previous, side});
  c10::cuda::CUDAEvent ready;
  ready.record(previous);
  ready.block(side);
  c10::cuda::setCurrentCUDAStream(side);
}

GraphStreamScope::~GraphStreamScope() {
  c10::cuda::CUDAEvent done;
  done.record(impl_->side);
  done.block(impl_->previous);
  c10::cuda::setCurrentCUDAStream(impl_->previous);
}

bool train_graph_compiled() { return true; }
#else
struct GraphStreamScope::Impl {};
GraphStreamScope::GraphStreamScope(const c10::Device&) {}
GraphStreamScope::~GraphStreamScope() = default;
struct TrainStepGraph::Impl {};
TrainStepGraph::TrainStepGraph(std::function<at::Tensor(const at::Tensor&)>) {
  throw std::invalid_argument("TrainStepGraph: this build has no CUDA");
}
TrainStepGraph::~TrainStepGraph() = default;
at::Tensor TrainStepGraph::run(const at::Tensor&) { throw std::invalid_argument("TrainStepGraph: this build has no CUDA"); }
bool train_graph_compiled() { return false; }
#endif

std::string train_graph_off_reason(const std::string& setting, const c10::Device& device,
                                   bool every_micro_step_reduces, bool loss_scaling) {
  if (setting == "off") return "--cuda-graph off";
  if (!device.is_cuda()) return "not a CUDA device";
  if (!train_graph_compiled()) return "this build has no CUDA";
  if (every_micro_step_reduces) {
    return "data parallel with --grad-accum 1 (every micro-step all-reduces gradients in backward hooks, which a "
           "replay does not run)";
  }
  if (loss_scaling) return "fp16's dynamic loss scale changes between steps";
  return "";
}

void drop_grads(const std::vector<at::Tensor>& params) {
  for (const auto& p : params)
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

void zero_grads_in_place(const std::vector<at::Tensor>& params) {
  const auto grads = defined_grads(params);
  if (!grads.empty()) at::_foreach_zero_(grads);
}

}  // namespace flashcos::model
