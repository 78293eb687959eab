// Inference reads of a checkpoint (sample, eval): the metadata and the model's weights, without the
// optimiser state that makes up two thirds of the file (Adam's two moments per parameter).
//
// A checkpoint is a TorchScript archive (zip): data.pkl pickles the object tree (root: meta,
// model, optimizer) and every tensor's bytes are a record of their own (data/<n>). The pickle is
// read here with generic objects (no TorchScript class compilation), every storage it names is
// allocated but not read, and only the storages of the model's own parameters and buffers are
// then read from their records. Anything unexpected throws; checkpoint.cpp then falls back to
// libtorch's full read (torch::serialize::InputArchive), which gives the canonical error messages.
//
//   WeightsReader w(path);  auto meta = parse(w.meta_json());  GPT m(cfg, false);  w.load_into(m);
#pragma once

#include <c10/core/Allocator.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "model/gpt.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}  // namespace caffe2::serialize

namespace flashcos::model {

class WeightsReader {
 public:
  // Opens the archive and reads its pickle (small); throws on anything that is not a
  // TorchScript archive holding a "meta" string and a "model" object.
  explicit WeightsReader(const std::string& path);
  ~WeightsReader();
  WeightsReader(const WeightsReader&) = delete;
  WeightsReader& operator=(const WeightsReader&) = delete;

  // The checkpoint's metadata (JSON text, as checkpoint.cpp wrote it).
  const std::string& meta_json() const { return meta_; }
  // Reads every parameter and buffer of `model` (by its dotted name) from the file into its
  // storage and sets the model's tensor to it; throws std::runtime_error naming a parameter that is
  // missing or has another shape in the file.
  void load_into(GPT& model);
  // Bytes read from tensor records so far (the model's weights; the optimiser state is never read).
  size_t bytes_read() const { return bytes_read_; }

 private:
  at::Tensor tensor_at(const std::string& dotted) const;  // the model's tensor at "a.b.c", filled
  void fill(const at::Tensor& t) const;

  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  c10::IValue model_;  // the "model" object
  std::string meta_;
  // storage data pointer -> its record ("data/<n>"), and whether it has been read
  mutable std::unordered_map<const void*, std::pair<std::string, bool>> records_;
  mutable size_t bytes_read_ = 0;
};

}  // namespace flashcos::model
