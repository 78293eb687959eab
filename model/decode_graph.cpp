// CUDA-graph replay of the static decode step (decode_graph.h).
//   step 1:  side stream <- waits for the current stream; token -> eager run_step() (the warm-up:
//            cuBLAS handles and workspaces exist for the side stream afterwards); capture
//            run_step() on the side stream into a private pool (nothing executes); the current
//            stream waits for the side stream.
//   step n:  token_ <- token (a fill) and graph.replay() on the current stream.
// The captured step reads token_ and pos_ and writes logits_ and the rings, all allocated before the
// capture; its temporaries live in the graph's private pool.
#include "model/decode_graph.h"

#include <stdexcept>
#include <string>

#include "common/log.h"

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace flashcos::model {

#ifdef FLASHCOS_WITH_CUDA
namespace {

class GraphDecoder : public StaticDecoder {
 public:
  GraphDecoder(GPT& model, const KVCache* prefilled, at::ScalarType compute_dtype)
      : StaticDecoder(model, prefilled, compute_dtype) {
    if (!token_.is_cuda()) {
      throw std::invalid_argument("make_graph_decoder: the model is on " + token_.device().str() +
                                  ", a CUDA graph needs a CUDA device");
    }
  }

  at::Tensor step(int64_t token) override {
    if (state_ == State::kEager) return StaticDecoder::step(token);
    if (state_ == State::kCaptured) {
      if (next_pos_ >= (int64_t(1) << 24)) return StaticDecoder::step(token);  // throws the same error
      c10::cuda::CUDAGuard device(token_.device());
      set_input(token);
      graph_.replay();
      ++next_pos_;
      return logits_;
    }
    // First step: eager on a side stream, then the capture of the next ones.
    c10::cuda::CUDAGuard device(token_.device());
    const auto main = c10::cuda::getCurrentCUDAStream();
    const auto side = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAEvent ready;
    ready.record(main);
    ready.block(side);
    at::Tensor out;
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      out = StaticDecoder::step(token);  // the warm-up is a real step: token at pos, pos += 1
      try {
        graph_.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);  // {0, 0}: a private pool
        try {
          run_step();  // recorded, not executed: pos_ and the rings stay as the warm-up left them
        } catch (...) {
          try {
            graph_.capture_end();
          } catch (...) {
          }
          throw;
        }
        graph_.capture_end();
        state_ = State::kCaptured;
      } catch (const std::exception& e) {
        (void)cudaGetLastError();  // a failed capture's error is not sticky: clear it
        state_ = State::kEager;
        log::info(std::string("  decode      CUDA graph capture failed, decoding without it: ") + e.what());
      }
    }
    c10::cuda::CUDAEvent done;
    done.record(side);
    done.block(main);
    return out;
  }

  std::string name() const override { return state_ == State::kCaptured ? "cuda graph" : "static (no graph)"; }

 private:
  enum class State { kFirst, kCaptured, kEager };
  State state_ = State::kFirst;
  at::cuda::CUDAGraph graph_;
};

}  // namespace

bool decode_graph_compiled() { return true; }

std::unique_ptr<StaticDecoder> make_graph_decoder(GPT& model, const KVCache& prefilled, at::ScalarType compute_dtype) {
  return std::make_unique<GraphDecoder>(model, &prefilled, compute_dtype);
}

std::unique_ptr<StaticDecoder> make_graph_decoder(GPT& model, at::ScalarType compute_dtype) {
  return std::make_unique<GraphDecoder>(model, nullptr, compute_dtype);
}

#else

bool decode_graph_compiled() { return false; }

std::unique_ptr<StaticDecoder> make_graph_decoder(GPT&, const KVCache&, at::ScalarType) {
  throw std::invalid_argument("make_graph_decoder: this build has no CUDA (configure with the CUDA toolkit)");
}

std::unique_ptr<StaticDecoder> make_graph_decoder(GPT& model, at::ScalarType compute_dtype) {
  return make_graph_decoder(model, KVCache(), compute_dtype);
}

#endif

}  // namespace flashcos::model
