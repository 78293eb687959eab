// Data-parallel engine: libtorch's c10d (TCPStore rendezvous, ProcessGroupNCCL / ProcessGroupGloo,
// c10d::Reducer). No transport of our own.
//
// Gradient averaging: c10d::Reducer is used directly from C++. It registers a post hook on every
// parameter's gradient accumulator; once prepare_for_backward() has armed it, each hook marks its
// parameter ready, a full bucket is all-reduced (sum / world size) at once while the backward goes
// on, and an autograd-engine callback waits for the last bucket and writes the averages back into
// .grad. Without prepare_for_backward() the hooks return at once, so the earlier micro-batches of
// a gradient-accumulation step only accumulate locally (DDP's no_sync).
//
// Gloo's headers: ProcessGroupGloo.hpp includes <gloo/...>, which the libtorch wheels do not ship;
// the symbols are in libtorch_cpu. The build takes the headers of the system gloo package
// (libgloo-dev) when present (FLASHCOS_WITH_GLOO); only type declarations are used from them.
#include "model/distributed.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#if defined(FLASHCOS_WITH_GLOO) && defined(USE_C10D_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define FLASHCOS_HAVE_GLOO 1
#endif
#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define FLASHCOS_HAVE_NCCL 1
#endif

#include <algorithm>
#include <map>
#include <stdexcept>
#include <unistd.h>  // environ

#include "common/log.h"

namespace flashcos::model {

struct DataParallel::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::unique_ptr<c10d::Reducer> reducer;
};

bool gloo_backend_built() {
#ifdef FLASHCOS_HAVE_GLOO
  return true;
#else
  return false;
#endif
}

c10::Device device_for_rank(const c10::Device& device, const DistEnv& env) {
  if (!device.is_cuda()) return device;
  const auto guard = c10::impl::getDeviceGuardImpl(c10::kCUDA);
  const int count = guard->deviceCount();
  if (env.local_rank >= count) {
    throw std::invalid_argument(strf("rank %d has LOCAL_RANK %d but this node has %d CUDA device(s): start at most "
                                     "one process per GPU",
                                     env.rank, env.local_rank, count));
  }
  const c10::Device mine(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  guard->setDevice(mine);
  return mine;
}

std::unique_ptr<DataParallel> DataParallel::create(const DistEnv& env, const std::string& backend, c10::Device device,
                                                   std::chrono::milliseconds timeout) {
  std::string name = backend == "auto" ? (device.is_cuda() ? "nccl" : "gloo") : backend;
  if (name != "nccl" && name != "gloo")
    throw std::invalid_argument("--dist-backend must be nccl, gloo or auto, got '" + backend + "'");
  if (name == "nccl" && !device.is_cuda())
    throw std::invalid_argument("--dist-backend nccl needs CUDA tensors: use --device cuda, or --dist-backend gloo");
  if (name == "gloo" && device.is_cuda())
    throw std::invalid_argument("--dist-backend gloo is for CPU training here: use nccl (or auto) with --device cuda");

  std::unique_ptr<DataParallel> dp(new DataParallel());
  dp->env_ = env;
  dp->backend_ = name;
  dp->device_ = device;
  dp->timeout_ = timeout;
  dp->impl_ = std::make_unique<Impl>();
  auto& impl = *dp->impl_;

  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.master_port);
  so.isServer = env.rank == 0;
  so.numWorkers = static_cast<size_t>(env.world_size);
  so.waitWorkers = true;
  so.timeout = timeout;
  try {
    impl.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    throw std::runtime_error(dp->rank_error(strf("rendezvous at %s:%d failed: %s", env.master_addr.c_str(),
                                                 env.master_port, e.what())));
  }
  impl.pg = c10::make_intrusive<c10d::ProcessGroup>(impl.store, env.rank, env.world_size);
  if (name == "gloo") {
#ifdef FLASHCOS_HAVE_GLOO
    auto opts = c10d::ProcessGroupGloo::Options::create_default(timeout);
    auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(impl.store, env.rank, env.world_size, opts);
    impl.pg->setBackend(c10::kCPU, c10d::ProcessGroup::GLOO, gloo);
    impl.pg->setDefaultBackend(c10d::ProcessGroup::GLOO);
#else
    throw std::invalid_argument(
        "this build has no Gloo backend (the gloo headers were not found at configure time: install libgloo-dev "
        "and re-run cmake)");
#endif
  } else {
#ifdef FLASHCOS_HAVE_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl.store, env.rank, env.world_size, opts);
    impl.pg->setBackend(c10::kCUDA, c10d::ProcessGroup::NCCL, nccl);
    impl.pg->setDefaultBackend(c10d::ProcessGroup::NCCL);
#else
    throw std::invalid_argument("this build has no NCCL backend (it needs a CUDA libtorch and nccl.h)");
#endif
  }
  return dp;
}

DataParallel::~DataParallel() {
  if (!impl_) return;
  impl_->reducer.reset();
}

std::string DataParallel::describe() const {
  return strf("rank %d of %d (local %d), %s, rendezvous %s:%d (%s)", env_.rank, env_.world_size, env_.local_rank,
              backend_.c_str(), env_.master_addr.c_str(), env_.master_port, env_.source.c_str());
}

std::string DataParallel::backend_settings() const {
  std::string out = "Gloo";
#ifdef FLASHCOS_HAVE_NCCL
  if (backend_ == "nccl") out = "NCCL " + c10d::getNcclVersion();
#endif
  // Every NCCL_* variable and the multicast switches of PyTorch / NVSHMEM, sorted by name.
  std::vector<std::string> set;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("NCCL_", 0) == 0 || kv.rfind("TORCH_NCCL_", 0) == 0 || kv.rfind("TORCH_SYMM_MEM_", 0) == 0 ||
        kv.rfind("NVSHMEM_DISABLE_NVLS", 0) == 0 || kv.rfind("GLOO_", 0) == 0)
      set.push_back(kv);
  }
  std::sort(set.begin(), set.end());
  out += ";";
  if (set.empty()) out += " no NCCL_* / GLOO_* variables set";
  for (const auto& kv : set) out += " " + kv;
  return out;
}

std::string DataParallel::rank_error(const std::string& what) const {
  std::string msg = what;
  const auto nl = msg.find("\nException raised from");
  if (nl != std::string::npos) msg = msg.substr(0, nl);
  return strf("rank %d of %d: %s", env_.rank, env_.world_size, msg.c_str());
}

namespace {

std::string collective_failure(const DataParallel& dp, const std::string& what) {
  return what + strf(" (a collective failed or timed out, limit %llds: another rank probably died, hangs or was "
                     "stopped; see its own error)",
                     static_cast<long long>(dp.timeout().count() / 1000));
}

// Runs a collective and waits for it; errors name the rank.
void run_and_wait(const DataParallel& dp, const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw std::runtime_error(dp.rank_error(collective_failure(dp, e.what())));
  }
}

}  // namespace

void DataParallel::broadcast_from_main(const std::vector<at::Tensor>& tensors) {
  // One flat buffer per dtype: a handful of broadcasts instead of one per tensor.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors)
    if (t.defined() && t.numel() > 0) by_dtype[t.scalar_type()].push_back(t);
  at::NoGradGuard no_grad;
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : group) flat_parts.push_back(t.detach().reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(flat_parts).to(device_)};
    c10d::BroadcastOptions opts;
    opts.rootRank = 0;
    run_and_wait(*this, impl_->pg->broadcast(flat, opts));
    int64_t offset = 0;
    for (auto& t : group) {
      t.detach().copy_(flat[0].slice(0, offset, offset + t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

void DataParallel::all_reduce_sum(at::Tensor& t) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  run_and_wait(*this, impl_->pg->allreduce(v, opts));
}

void DataParallel::all_reduce_max(at::Tensor& t) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  run_and_wait(*this, impl_->pg->allreduce(v, opts));
}

void DataParallel::attach_reducer(const std::vector<at::Tensor>& params, int64_t bucket_mb) {
  // As DistributedDataParallel does: a small first bucket (the last layers' gradients, ready
  // first) so communication starts early, then buckets of bucket_mb, in reverse parameter order.
  const std::vector<bool> sparse(params.size(), false);
  const size_t cap = static_cast<size_t>(bucket_mb) * 1024 * 1024;
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
      params, {static_cast<size_t>(c10d::kDefaultFirstBucketBytes), cap}, sparse);
  std::reverse(buckets.begin(), buckets.end());
  impl_->reducer = std::make_unique<c10d::Reducer>(
      params, std::move(buckets), impl_->pg, sparse, static_cast<int64_t>(cap), /*find_unused_parameters=*/false,
      /*gradient_as_bucket_view=*/false, std::unordered_map<size_t, std::string>{},
      static_cast<int64_t>(c10d::kDefaultFirstBucketBytes), /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, std::vector<int64_t>{});
}

void DataParallel::prepare_for_forward() {
  if (impl_->reducer) impl_->reducer->prepare_for_forward();
}

void DataParallel::prepare_for_backward(const at::Tensor& loss) {
  if (impl_->reducer) impl_->reducer->prepare_for_backward({loss});
}

bool DataParallel::any(bool local_flag) {
  at::Tensor flag = at::full({1}, local_flag ? 1.0f : 0.0f, at::TensorOptions().device(device_));
  all_reduce_max(flag);
  return flag.item<float>() > 0;
}

}  // namespace flashcos::model
