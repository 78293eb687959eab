// Small device helpers that hide CUDA-only libtorch headers from the rest of the code.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace flashcos::model {

// "auto" -> cuda when available, else cpu; "cuda" without a GPU is an error.
c10::Device resolve_device(const std::string& name);
std::string device_description(const c10::Device& device);
void synchronize(const c10::Device& device);
// The device's one-time start-up costs paid up front: on CUDA the context, the cuBLAS / cuBLASLt
// handles and workspace (one small bf16 GEMM), then a synchronize. Safe to run on a second thread
// while the first reads a checkpoint (sample does); a no-op on the CPU.
void warm_up(const c10::Device& device);
// Peak bytes allocated through the CUDA caching allocator since the last reset (0 on CPU).
double peak_memory_gib(const c10::Device& device);
// The device's whole memory in bytes (a CUDA device's, or the host's physical memory for the CPU).
double total_memory_bytes(const c10::Device& device);
void reset_peak_memory(const c10::Device& device);
// Streaming multiprocessors of the current CUDA device (what the fused kernels size their grids by);
// 0 in a build without CUDA.
int current_sm_count();
// Why the fused CUDA attention kernels cannot run on `device` in this build ("" when they can).
std::string fused_attention_unavailable(const c10::Device& device);

}  // namespace flashcos::model
