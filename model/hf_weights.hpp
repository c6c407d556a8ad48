// Pretrained weights of any family in Hugging Face's safetensors layout — one file, or a folder with
// model.safetensors or model.safetensors.index.json and its shards, plus config.json — read as fp32
// tensors of shardkit's table, in any piece. Used by `convert import`, `train --init-from` and `eval`.
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "ckpt/safetensors.hpp"
#include "ckpt/tensor_table.hpp"
#include "model/model.hpp"

namespace shardkit::model {

// Whether `path` names Hugging Face weights rather than a checkpoint: a folder with config.json beside
// the weights (a checkpoint's folders never have one), or a .safetensors file.
bool is_hf_weights(const std::filesystem::path& path);

class HfWeights {
 public:
  // Opens and validates everything up front: config.json (in the folder, or beside the file) names the
  // family; every file's header; names that fit the family (a tied output projection and buffers are
  // skipped); each table tensor present once with its shape and an F32, BF16 or F16 dtype; no file of
  // the folder leading out of it through a symbolic link (`path` itself may be one).
  // Error(kInvalidInput) naming the file and tensor otherwise.
  explicit HfWeights(const std::filesystem::path& path);
  ~HfWeights();

  const std::shared_ptr<const Model>& model() const noexcept { return model_; }
  const ckpt::TensorTable& table() const noexcept { return model_->table(); }
  // Where the weights came from (for messages and manifests).
  const std::filesystem::path& path() const noexcept { return path_; }

  // Elements [offset, offset + out.size()) of table tensor `tensor`, converted to fp32 (exactly: bf16
  // and fp16 widen without rounding). Thread-safe.
  void read(int tensor, int64_t offset, std::span<float> out) const;

 private:
  struct Source {
    const ckpt::safetensors::Reader* file = nullptr;
    const ckpt::safetensors::TensorInfo* info = nullptr;
  };
  std::filesystem::path path_;
  std::shared_ptr<const Model> model_;
  std::vector<std::unique_ptr<ckpt::safetensors::Reader>> files_;
  std::vector<Source> sources_;  // per table tensor
};

}  // namespace shardkit::model
