// WeightsReader (checkpoint_weights.h): the checkpoint's pickle through torch::jit::Unpickler with
// generic objects, and lazily read tensor records.
#include "model/checkpoint_weights.h"

#include <ATen/core/class_type.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/core/grad_mode.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace flashcos::model {

WeightsReader::WeightsReader(const std::string& path) {
  reader_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  auto [pickle, pickle_size] = reader_->getRecord("data.pkl");
  size_t pos = 0;
  const char* bytes = static_cast<const char*>(pickle.get());
  auto read = [&](char* buf, size_t len) -> size_t {
    len = std::min(len, pickle_size - pos);
    std::memcpy(buf, bytes + pos, len);
    pos += len;
    return len;
  };
  // Every class in the pickle becomes a generic object with one attribute per entry of its state
  // (a TorchScript module pickles as its attribute dict); nothing is compiled.
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  auto resolve = [cu](const c10::QualifiedName& name) {
    return c10::StrongTypePtr(cu, c10::ClassType::create(name, cu));
  };
  auto make_object = [cu](const c10::StrongTypePtr& type, c10::IValue state) {
    const auto dict = state.toGenericDict();  // throws for objects with __setstate__: not a checkpoint of ours
    auto cls = c10::ClassType::create(type.type_->expectRef<c10::ClassType>().name(), cu);
    for (const auto& kv : dict) cls->addAttribute(kv.key().toStringRef(), c10::AnyType::get());
    auto obj = c10::ivalue::Object::create(c10::StrongTypePtr(cu, cls), dict.size());
    size_t slot = 0;
    for (const auto& kv : dict) obj->setSlot(slot++, kv.value());
    return obj;
  };
  // Storages are allocated (untouched pages cost nothing) but not read: load_into reads the model's.
  auto record = [this](const std::string& key) {
    const std::string name = "data/" + key;
    at::DataPtr ptr = c10::GetCPUAllocator()->allocate(reader_->getRecordSize(name));
    records_[ptr.get()] = {name, false};
    return ptr;
  };
  torch::jit::Unpickler unpickler(read, resolve, make_object, record, c10::Device(c10::kCPU));
  unpickler.set_version(reader_->version());
  const c10::IValue root = unpickler.parse_ivalue();
  const auto obj = root.toObject();
  meta_ = obj->getAttr("meta").toStringRef();
  model_ = obj->getAttr("model");
  (void)model_.toObject();
}

WeightsReader::~WeightsReader() = default;

void WeightsReader::fill(const at::Tensor& t) const {
  const auto& storage = t.storage();
  auto it = records_.find(storage.data());
  if (it == records_.end()) {
    if (storage.nbytes() == 0) return;  // an empty tensor has no record
    throw std::runtime_error("a tensor of the model has no record in the file");
  }
  if (it->second.second) return;  // shared with a tensor read before
  const size_t n = reader_->getRecordSize(it->second.first);
  if (n < storage.nbytes()) throw std::runtime_error("record " + it->second.first + " is shorter than its tensor");
  reader_->getRecord(it->second.first, storage.mutable_data(), n);
  it->second.second = true;
  bytes_read_ += n;
}

at::Tensor WeightsReader::tensor_at(const std::string& dotted) const {
  c10::IValue v = model_;
  size_t start = 0;
  for (;;) {
    const size_t dot = dotted.find('.', start);
    const std::string part = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const auto obj = v.toObject();
    if (!obj->type()->hasAttribute(part)) throw std::runtime_error("the file has no '" + dotted + "'");
    v = obj->getAttr(part);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!v.isTensor()) throw std::runtime_error("'" + dotted + "' in the file is not a tensor");
  at::Tensor t = v.toTensor();
  fill(t);
  return t;
}

void WeightsReader::load_into(GPT& model) {
  at::NoGradGuard no_grad;
  auto load = [&](const std::string& name, at::Tensor& target) {
    const at::Tensor t = tensor_at(name);
    if (!t.sizes().equals(target.sizes())) {
      throw std::runtime_error("parameter '" + name + "' has shape " + c10::str(t.sizes()) +
                               " in the file, the model expects " + c10::str(target.sizes()));
    }
    target.set_(t);  // as torch::serialize::InputArchive::read does: the model's tensor becomes the file's
  };
  for (auto& p : model->named_parameters()) load(p.key(), p.value());
  for (auto& b : model->named_buffers()) load(b.key(), b.value());
}

}  // namespace flashcos::model
