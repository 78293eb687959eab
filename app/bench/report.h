// ./train bench: the report: the seed's table row by row, the full table per pass, the run header's
// device and date, and the JSON records.
#pragma once

#include "app/bench/impls.h"
#include "app/bench/options.h"
#include "app/bench/timing.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flashcos::app::bench {

// One sequence length of a table: every implementation's measurement.
struct Row {
  int64_t seq_len;
  std::map<std::string, Measurement> by_impl;
};

// FLOPs of one pass: 4*B*H*N*N*D (halved for causal) times pass_flop_factor.
double pass_flops(const BenchConfig& cfg, int64_t dim_head, int64_t n, Pass pass);

// "NVIDIA H100 80GB HBM3 (sm_90)", or the CPU's model name and libtorch's thread count.
std::string device_name(const BenchConfig& cfg);
// The current CUDA device's PCI bus id, "dddddddd:bb:dd.0" (for gpu_clocks.h's ClockSampler); throws
// std::runtime_error where this build has no CUDA.
std::string cuda_pci_bus_id();
// The current time as ISO 8601 UTC (2026-01-31T12:00:00Z).
std::string utc_now();

// The seed's table line of one sequence length: kernel / baseline time ratio and both times.
void print_seed_row(const BenchConfig& cfg, const std::vector<Impl>& impls, const Row& row);
// Every implementation's ms, TFLOP/s, peak memory and ratio to the baseline, then the reasons of
// the n/a / oom / skip entries.
void print_full_table(const BenchConfig& cfg, const std::vector<Impl>& impls,
                      const std::vector<Row>& rows, int64_t dim_head, Pass pass);

// --profile: each implementation's report of its profiled iterations (Measurement::profile), by
// length, indented; nothing without --profile.
void print_profiles(const BenchConfig& cfg, const std::vector<Impl>& impls, const std::vector<Row>& rows, Pass pass);

// One JSON result record: the configuration, the measurement and its FLOP rate.
nlohmann::json record(const BenchConfig& cfg, const std::string& impl, const DtypeSpec& dtype,
                      int64_t dim_head, int64_t n, Pass pass, const Measurement& m);
// Writes doc to path through a temporary file and a rename (a reader never sees half a file).
void write_json(const std::string& path, const nlohmann::json& doc);

}  // namespace flashcos::app::bench
