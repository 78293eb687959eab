// The element types the torch-free kernels take, shared by every operator's Params struct.
#pragma once

namespace flashcos::cuda {

enum class DType { kHalf, kBFloat16, kFloat, kDouble };

}  // namespace flashcos::cuda
