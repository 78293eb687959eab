// Data-parallel training over libtorch's c10d: one process per GPU (or per CPU worker), a process
// group over a TCPStore rendezvous (NCCL on CUDA, Gloo on CPU), rank 0's weights broadcast at the
// start, and gradients averaged by c10d::Reducer (bucketed all-reduce launched from autograd hooks
// while the backward still runs).
//
//   auto env = detect_dist_env();                 // nullopt: single process, nothing below is used
//   auto dp = DataParallel::create(*env, "auto", device, std::chrono::seconds(300));
//   dp->broadcast_from_main(tensors);             // same weights everywhere
//   dp->attach_reducer(params);
//   ... per optimiser step, before the forward of the LAST micro-batch only:
//   dp->prepare_for_backward(loss);               // this backward reduces; earlier ones accumulate
//
// The header stays free of c10d / Gloo / NCCL headers; model/distributed.cpp holds them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flashcos::model {

// Where this process sits in the job, read from the environment.
struct DistEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  std::string master_addr;
  int master_port = 29500;
  std::string source;  // "torchrun" (RANK/WORLD_SIZE/...) or "slurm" (SLURM_PROCID/...)
};

// torchrun form: RANK, WORLD_SIZE, LOCAL_RANK (default 0), MASTER_ADDR (default 127.0.0.1),
// MASTER_PORT (default 29500). Slurm form (RANK unset, SLURM_PROCID and SLURM_NTASKS > 1 set):
// SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, the first host of SLURM_JOB_NODELIST (MASTER_ADDR /
// MASTER_PORT override). Returns nullopt when neither is there (or a Slurm job has one task).
// Bad values throw std::invalid_argument naming the variable. `env` replaces the process
// environment (for tests); by default getenv is read.
std::optional<DistEnv> detect_dist_env(const std::map<std::string, std::string>* env = nullptr);

// First host of a Slurm node list: "gpu[003-005,010],cpu7" -> "gpu003", "a,b" -> "a".
std::string first_slurm_host(const std::string& nodelist);

class DataParallel {
 public:
  // backend: "nccl" | "gloo" | "auto" (nccl on CUDA, gloo on CPU). On CUDA `device` should be
  // cuda:LOCAL_RANK (see device_for_rank). Collectives that do not finish within `timeout` fail
  // with an error naming this rank.
  static std::unique_ptr<DataParallel> create(const DistEnv& env, const std::string& backend, c10::Device device,
                                              std::chrono::milliseconds timeout);
  ~DataParallel();

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  bool is_main() const { return env_.rank == 0; }
  const std::string& backend_name() const { return backend_; }
  const c10::Device& device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string describe() const;  // "rank 1 of 4 (local 1), nccl, master host:port (torchrun)"
  // The communication library's version and the settings it reads from the environment, as set in
  // this process: "NCCL 2.27.7; NCCL_NVLS_ENABLE=0 ..." (or "none set"); "Gloo" for Gloo.
  std::string backend_settings() const;

  // Copies rank 0's values into every rank's tensors (in place; one coalesced broadcast per dtype).
  void broadcast_from_main(const std::vector<at::Tensor>& tensors);
  // In-place sum / max over ranks (blocking).
  void all_reduce_sum(at::Tensor& t);
  void all_reduce_max(at::Tensor& t);

  // Gradient averaging: builds a c10d::Reducer over `params` (buckets of `bucket_mb`).
  void attach_reducer(const std::vector<at::Tensor>& params, int64_t bucket_mb = 25);
  // Call before the forward whose backward should average gradients over ranks (the last
  // micro-batch of an optimiser step); micro-batches without it only accumulate locally.
  void prepare_for_forward();
  void prepare_for_backward(const at::Tensor& loss);

  // True on every rank when any rank passes true (blocking; the trainer asks at its logging steps,
  // where it synchronises anyway, so that all ranks stop after the same step).
  bool any(bool local_flag);

  // Prefixes an error with this rank ("rank 1 of 2: ...").
  std::string rank_error(const std::string& what) const;

 private:
  DataParallel() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  DistEnv env_;
  std::string backend_;
  c10::Device device_{c10::kCPU};
  std::chrono::milliseconds timeout_{0};
};

// Whether this build has the Gloo (CPU) backend (it needs gloo's headers at configure time).
bool gloo_backend_built();

// cuda:LOCAL_RANK when `device` is CUDA (and makes it the current device), else `device`.
c10::Device device_for_rank(const c10::Device& device, const DistEnv& env);

}  // namespace flashcos::model
