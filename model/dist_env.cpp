// Reading a data-parallel job's layout from the environment, the way torchrun and Slurm set it.
#include <cstdlib>
#include <stdexcept>

#include "model/distributed.h"

namespace flashcos::model {
namespace {

using Env = std::map<std::string, std::string>;

std::optional<std::string> lookup(const Env* env, const char* name) {
  if (env) {
    auto it = env->find(name);
    if (it == env->end()) return std::nullopt;
    return it->second;
  }
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& value, const char* name, int lo, int hi) {
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < lo || v > hi) {
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + value +
                                "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int>(v);
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at the first comma outside brackets; a bracketed range keeps its first
  // member: "gpu[003-005,010]" -> "gpu003".
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  const auto open = first.find('[');
  if (open == std::string::npos) return first;
  std::string inside = first.substr(open + 1, first.find(']') - open - 1);
  inside = inside.substr(0, inside.find_first_of(",-"));
  return first.substr(0, open) + inside;
}

std::optional<DistEnv> detect_dist_env(const Env* env) {
  DistEnv d;
  const auto rank = lookup(env, "RANK");
  const auto slurm_rank = lookup(env, "SLURM_PROCID");
  const auto slurm_tasks = lookup(env, "SLURM_NTASKS");
  if (rank) {
    const auto world = lookup(env, "WORLD_SIZE");
    if (!world) throw std::invalid_argument("RANK is set but WORLD_SIZE is not: set both (scripts/launch.sh does)");
    d.world_size = parse_int(*world, "WORLD_SIZE", 1, 1 << 20);
    d.rank = parse_int(*rank, "RANK", 0, d.world_size - 1);
    d.local_rank = parse_int(lookup(env, "LOCAL_RANK").value_or("0"), "LOCAL_RANK", 0, 1 << 20);
    d.master_addr = lookup(env, "MASTER_ADDR").value_or("127.0.0.1");
    d.source = "torchrun";
  } else if (slurm_rank && slurm_tasks) {
    d.world_size = parse_int(*slurm_tasks, "SLURM_NTASKS", 1, 1 << 20);
    if (d.world_size == 1) return std::nullopt;  // a one-task job (sbatch ./train): plain single process
    d.rank = parse_int(*slurm_rank, "SLURM_PROCID", 0, d.world_size - 1);
    d.local_rank = parse_int(lookup(env, "SLURM_LOCALID").value_or("0"), "SLURM_LOCALID", 0, 1 << 20);
    if (auto addr = lookup(env, "MASTER_ADDR")) {
      d.master_addr = *addr;
    } else {
      const auto nodes = lookup(env, "SLURM_JOB_NODELIST");
      if (!nodes || nodes->empty())
        throw std::invalid_argument("SLURM_PROCID is set but neither MASTER_ADDR nor SLURM_JOB_NODELIST is");
      d.master_addr = first_slurm_host(*nodes);
    }
    d.source = "slurm";
  } else {
    return std::nullopt;
  }
  d.master_port = parse_int(lookup(env, "MASTER_PORT").value_or("29500"), "MASTER_PORT", 1, 65535);
  if (d.master_addr.empty()) throw std::invalid_argument("MASTER_ADDR is empty");
  return d;
}

}  // namespace flashcos::model
