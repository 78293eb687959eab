// The Hopper family's TMA tensor maps (attention/cosine/cuda/hopper/tma_map.h): a tile loaded by TMA
// with the 128-byte swizzle must be byte for byte the SW128 tile load_tile_sw128 writes with
// cp.async (the layout the wgmma descriptors read), with rows past the tensor's end zero, for
// contiguous (B, H, rows, D) tensors and for the strided q / k / v views of a packed QKV
// projection; the fp32 map of the backward's dQ accumulator refuses what TMA cannot address; and
// both maps are made on a host thread that has no current context yet.
// Every test needs a compute capability 9.0 device (the tensor-map encoder is the
// driver's); they skip elsewhere.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#ifdef FLASHCOS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "attention/cosine/cuda/hopper/tma_map.h"
#endif

#include <string>
#include <thread>
#include <utility>

namespace {

#ifdef FLASHCOS_WITH_CUDA
using flashcos::cuda::DType;
using flashcos::cuda::Sw128TileTensor;

Sw128TileTensor describe(const at::Tensor& t) {  // t (B, H, rows, D), last dim contiguous
  Sw128TileTensor d;
  d.base = t.data_ptr();
  d.dtype = t.scalar_type() == at::kHalf ? DType::kHalf : DType::kBFloat16;
  d.B = t.size(0), d.H = t.size(1), d.rows = t.size(2), d.D = t.size(3);
  d.b_stride = t.stride(0), d.h_stride = t.stride(1), d.row_stride = t.stride(2);
  return d;
}

bool hopper_device() {
  if (!torch::cuda::is_available()) return false;
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  return prop->major == 9 && prop->minor == 0;
}

// A valid (B, H, rows, D) tensor gets a map; each thing the TMA unit cannot address, changed alone,
// is refused.
TEST(HopperTma, TileMapRefusesWhatTheTmaUnitCannotAddress) {
  if (!hopper_device()) GTEST_SKIP() << "needs a compute capability 9.0 GPU (and its driver's tensor-map encoder)";
  const at::Tensor x = at::randn({1, 1, 64, 64 * 5}, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
  Sw128TileTensor good = describe(x.narrow(3, 0, 64));
  CUtensorMap map;
  ASSERT_EQ(flashcos::cuda::make_sw128_tile_map(&map, good, 64), cudaSuccess);
  auto refused = [&](Sw128TileTensor t, int box_rows) {
    return flashcos::cuda::make_sw128_tile_map(&map, t, box_rows) == cudaErrorInvalidValue;
  };
  Sw128TileTensor t = good;
  t.base = static_cast<const char*>(good.base) + 2;  // off 16-byte alignment
  EXPECT_TRUE(refused(t, 64));
  t = good, t.D = 100;  // 200-byte rows: not a whole number of 16-byte chunks
  EXPECT_TRUE(refused(t, 64));
  t = good, t.D = 96;  // a partial last 64-column block is fine (its columns past D load as zeros)
  EXPECT_FALSE(refused(t, 64));
  t = good, t.row_stride = 68;  // 136 bytes: not a multiple of 16
  EXPECT_TRUE(refused(t, 64));
  t = good, t.dtype = DType::kFloat;
  EXPECT_TRUE(refused(t, 64));
  EXPECT_TRUE(refused(good, 0));
  EXPECT_TRUE(refused(good, 257));
  EXPECT_EQ(flashcos::cuda::make_sw128_tile_map(nullptr, good, 64), cudaErrorInvalidValue);
}

// The fp32 map of the backward's dQ accumulator (the TMA reductions' target): a contiguous
// (B, H, rows, D) float tensor gets a map; what the unit cannot address is refused.
TEST(HopperTma, Fp32MapRefusesWhatTheTmaUnitCannotAddress) {
  if (!hopper_device()) GTEST_SKIP() << "needs a compute capability 9.0 GPU (and its driver's tensor-map encoder)";
  const at::Tensor x = at::zeros({2, 3, 100, 128}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  CUtensorMap map;
  void* base = x.data_ptr();
  ASSERT_EQ(flashcos::cuda::make_f32_sw128_map(&map, base, 2, 3, 100, 128, 64), cudaSuccess);
  ASSERT_EQ(flashcos::cuda::make_f32_sw128_map(&map, base, 2, 3, 100, 64, 64), cudaSuccess);
  auto refused = [&](void* b, int64_t rows, int64_t D, int box_rows) {
    return flashcos::cuda::make_f32_sw128_map(&map, b, 2, 3, rows, D, box_rows) == cudaErrorInvalidValue;
  };
  EXPECT_TRUE(refused(static_cast<char*>(base) + 4, 100, 128, 64));  // off 16-byte alignment
  EXPECT_TRUE(refused(base, 100, 50, 64));                           // 200-byte rows: not 16-byte chunks
  EXPECT_FALSE(refused(base, 100, 48, 64));                          // a partial last 32-column box is fine
  EXPECT_TRUE(refused(base, 0, 128, 64));
  EXPECT_TRUE(refused(base, 100, 128, 0));
  EXPECT_TRUE(refused(base, 100, 128, 257));
  EXPECT_TRUE(refused(nullptr, 100, 128, 64));
  EXPECT_EQ(flashcos::cuda::make_f32_sw128_map(nullptr, base, 2, 3, 100, 128, 64), cudaErrorInvalidValue);
}

// The maps as the first CUDA work of a new host thread (as on the autograd engine's backward thread,
// where the encoder once failed without a current context and the sm_80 kernels ran instead): both
// maps are made there, and again after that thread switched device to the same one.
TEST(HopperTma, MapsAreMadeOnAThreadWithoutACurrentContext) {
  if (!hopper_device()) GTEST_SKIP() << "needs a compute capability 9.0 GPU (and its driver's tensor-map encoder)";
  const int device = at::cuda::current_device();
  const at::Tensor x = at::randn({2, 3, 100, 64}, at::TensorOptions().dtype(at::kHalf).device(at::kCUDA));
  const at::Tensor acc = at::zeros({2, 3, 100, 64}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  cudaError_t tile = cudaErrorUnknown, f32 = cudaErrorUnknown, again = cudaErrorUnknown, set = cudaErrorUnknown;
  std::thread fresh([&] {
    CUtensorMap map;
    tile = flashcos::cuda::make_sw128_tile_map(&map, describe(x), 64);  // this thread's first CUDA call
    f32 = flashcos::cuda::make_f32_sw128_map(&map, acc.data_ptr(), 2, 3, 100, 64, 32);
    set = cudaSetDevice(device);
    again = flashcos::cuda::make_sw128_tile_map(&map, describe(x), 32);
  });
  fresh.join();
  EXPECT_EQ(tile, cudaSuccess) << cudaGetErrorString(tile);
  EXPECT_EQ(f32, cudaSuccess) << cudaGetErrorString(f32);
  ASSERT_EQ(set, cudaSuccess) << cudaGetErrorString(set);
  EXPECT_EQ(again, cudaSuccess) << cudaGetErrorString(again);
}

TEST(HopperTma, TmaTileIsTheCpAsyncSw128Tile) {
  if (!hopper_device()) GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  const int64_t B = 2, H = 3, rows = 1000;
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    for (const int64_t D : {64, 128}) {
      const auto opts = at::TensorOptions().dtype(dtype).device(at::kCUDA);
      // Contiguous (B, H, rows, D), and the k part of a packed (B, rows, 3, H, D) projection seen as
      // (B, H, rows, D): rows 3 H D elements apart.
      const at::Tensor contiguous = at::randn({B, H, rows, D}, opts);
      const at::Tensor packed = at::randn({B, rows, 3, H, D}, opts);
      const at::Tensor k_view = packed.select(2, 1).permute({0, 2, 1, 3});
      for (const auto& [name, tensor] : {std::pair<std::string, at::Tensor>{"contiguous", contiguous},
                                         std::pair<std::string, at::Tensor>{"packed k", k_view}}) {
        // Whole tiles, a tile that runs 47 rows past the end, the last row alone.
        for (const int row0 : {0, 192, int(rows) - 17, int(rows) - 1}) {
          const int b = row0 % 2, h = (row0 / 64) % 3;
          int64_t mismatches = -1, past_end = -1;
          const cudaError_t err =
              flashcos::cuda::hopper_tma_tile_selftest(describe(tensor), b, h, row0, &mismatches, &past_end);
          const std::string where = std::string(c10::toString(dtype)) + " d" + std::to_string(D) + " " + name +
                                    " row0 " + std::to_string(row0);
          ASSERT_EQ(err, cudaSuccess) << where << ": " << cudaGetErrorString(err);
          EXPECT_EQ(mismatches, 0) << where << ": bytes where the TMA tile and the cp.async tile differ";
          EXPECT_EQ(past_end, 0) << where << ": nonzero bytes in the TMA tile's rows past the end";
        }
      }
    }
  }
}
#endif

}  // namespace
