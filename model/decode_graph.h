// The static decode step (decode_step.h) replayed from one CUDA graph: the first step runs eagerly
// on a side stream (the warm-up, its logits are the first step's), then the step is captured there
// once into a graph-private memory pool; every later byte writes its token into the static input
// and replays the graph (one launch instead of ~250 eager ops). If the capture throws, the decoder
// logs one info line and goes on with the eager step (same results, slower).
#pragma once

#include <ATen/core/ScalarType.h>

#include <memory>

#include "model/decode_step.h"

namespace flashcos::model {

// Whether this build can capture CUDA graphs (built with the CUDA kernels / headers).
bool decode_graph_compiled();

// A StaticDecoder whose steps replay a CUDA graph; the model must be on a CUDA device and the build
// must have decode_graph_compiled() (else std::invalid_argument).
std::unique_ptr<StaticDecoder> make_graph_decoder(GPT& model, const KVCache& prefilled, at::ScalarType compute_dtype);
// The same with empty rings (StaticDecoder's second constructor): the first step is position 0.
std::unique_ptr<StaticDecoder> make_graph_decoder(GPT& model, at::ScalarType compute_dtype);

}  // namespace flashcos::model
