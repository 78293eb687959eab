// ./train bench: what to time (BenchConfig), its command line (--help) and the checks that turn a
// bad option into a UsageError naming it.
#pragma once

#include <flashcos/fastmax.h>

#include <c10/core/ScalarType.h>
#include <cxxopts.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashcos::app::bench {

enum class Pass { kFwd, kBwd, kFwdBwd };

const char* pass_name(Pass p);   // fwd | bwd | fwd+bwd (the JSON's "pass")
const char* pass_title(Pass p);  // forward | backward | forward + backward (the table titles)
// FLOPs of one pass relative to the forward's 4*B*H*I*J*D.
double pass_flop_factor(Pass p);

struct DtypeSpec {
  std::string name;       // fp32 | fp16 | bf16 (what --dtype and the JSON use)
  std::string long_name;  // float32 | float16 | bfloat16 (the seed's table header)
  at::ScalarType type;
};

// Every implementation name --impls, --kernel and --baseline accept, in the order they are timed.
const std::vector<std::string>& all_impl_names();

struct BenchConfig {
  bool causal = false;
  double mask_prob = 0.0;
  std::string bias = "none";  // none | head (H, N, N) | batch (B, N, N): an additive float32 attention bias
  std::vector<Pass> passes;
  std::vector<DtypeSpec> dtypes;
  int64_t batch = 4;
  int64_t heads = 8;
  std::vector<int64_t> dim_heads;
  std::vector<int64_t> seq_lens;
  std::string attention = "cosine";  // cosine | exp | fastmax
  FastmaxOptions fastmax;            // --attention fastmax: p, normalize, lim, temperature, chunk
  std::vector<std::string> impls;    // empty: every implementation available here
  std::string kernel = "auto";       // the seed table's "kernel" column
  std::string baseline = "plain";    // the seed table's "baseline" column
  int warmup = 5;
  double warmup_s = 1.0;  // on CUDA the warm-up also lasts this long (clocks settle under the power limit)
  int rounds = 1;  // the implementations take turns this many times; the fastest round is kept
  int iters = 30;
  double budget_s = 2.0;  // per implementation x pass x config: fewer iterations when slow
  int profile = 0;        // --profile: iterations run under libtorch's profiler after the timed ones (0: none)
  bool clocks = false;    // --clocks: the SM clock, power and power cap sampled over the timed iterations (gpu_clocks.h)
  bool cuda = false;
  double scale = 10.0;
  bool include_l2norm = false;
  bool deterministic = false;  // our implementations' deterministic backward (AttentionOptions)
  uint64_t seed = 0;
  std::string json_path;
  std::string command_line;
};

// A bad command line: the message names the option; run_bench prints it and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// s without leading and trailing blanks and tabs.
std::string trim(const std::string& s);
// The first line of an error message, trimmed; a CUDA out-of-memory message without the allocator
// advice that follows its size.
std::string first_line(const std::string& s);

// The options of ./train bench (what --help prints).
cxxopts::Options make_options();
// The checked configuration; a UsageError names the option that was wrong and what it expects.
BenchConfig parse_config(const cxxopts::ParseResult& r, const std::string& command_line);

}  // namespace flashcos::app::bench
