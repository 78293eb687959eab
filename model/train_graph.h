// One training micro-step (forward, loss, backward into the parameters' .grad) captured once as a
// CUDA graph and replayed with each new batch: one launch instead of ~550 eager kernels and their
// launch gaps (--cuda-graph, on by default where it applies; model/trainer.cpp says where not).
//
// Contract: the caller runs the whole training loop on one non-default CUDA stream (capture needs
// one), every parameter that gets a gradient already has a defined .grad when the graph is
// captured (so the captured backward adds into it in place: AccumulateGrad's in-place path, grad
// mode being off in the backward) and grads are zeroed in place, never set to None, while the
// graph lives. The batch shape is fixed at capture; another shape throws.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flashcos::model {

class TrainStepGraph {
 public:
  // micro_step(batch on the device) -> its loss (detached); run once inside the capture.
  explicit TrainStepGraph(std::function<at::Tensor(const at::Tensor&)> micro_step);
  ~TrainStepGraph();
  TrainStepGraph(const TrainStepGraph&) = delete;
  TrainStepGraph& operator=(const TrainStepGraph&) = delete;

  // The first call captures the micro-step on `batch` (copied to a static device tensor) and
  // replays it; later calls copy their batch in and replay. Returns the micro-step's loss, valid
  // until the next call. Throws if the capture fails (the caller then goes on eagerly).
  at::Tensor run(const at::Tensor& batch);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Makes a pool stream of `device` current until destroyed (a graph is captured on a non-default
// stream; replays, copies and the optimiser then share that stream): the new stream first waits
// for the work queued so far, and on destruction the previous stream waits for it.
class GraphStreamScope {
 public:
  explicit GraphStreamScope(const c10::Device& device);
  ~GraphStreamScope();
  GraphStreamScope(const GraphStreamScope&) = delete;
  GraphStreamScope& operator=(const GraphStreamScope&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether this build can capture CUDA graphs.
bool train_graph_compiled();

// Why the trainer's micro-steps are not captured ("" when they are): --cuda-graph off, no CUDA
// device or build, data parallel with every micro-step reducing (`every_micro_step_reduces`:
// --grad-accum 1; the all-reduce runs in backward hooks, which a replay does not run; with more
// micro-steps only those before the last are replayed), or fp16's dynamic loss scale (it changes
// between steps).
std::string train_graph_off_reason(const std::string& setting, const c10::Device& device,
                                   bool every_micro_step_reduces, bool loss_scaling);

// Sets every parameter's .grad to undefined (autograd then takes the next gradient as it comes).
// libtorch's Optimizer::zero_grad calls detach_() on each .grad first, which throws for a .grad
// that is a view (fused::linear_from_copy makes q / k / v's gradients row blocks of one buffer).
void drop_grads(const std::vector<at::Tensor>& params);

// Zeroes the defined gradients of `params` in place, by one multi-tensor kernel (a fill per
// parameter cost ~100 launches a step).
void zero_grads_in_place(const std::vector<at::Tensor>& params);

}  // namespace flashcos::model
