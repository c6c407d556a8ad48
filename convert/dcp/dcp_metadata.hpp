// The `.metadata` file of a PyTorch Distributed Checkpoint (DCP) folder, read without Python: which
// items the state dict held (by flattened key), each tensor's element type, full shape and the chunks
// it was saved in, and where every chunk or pickled value lies in the ranks' `.distcp` files.
// docs/FORMAT-DCP.md describes the format.
//
// The file is a pickle of torch.distributed.checkpoint.metadata's dataclasses; it is read by the
// restricted unpickler with its DCP list of globals (nothing else resolves) and checked whole before
// any value is used: every chunk inside its tensor, chunk volumes summing to the tensor's, every
// storage location a file of the folder (no path leads out of it) and a byte range, and nothing named
// twice. Error(kInvalidInput) naming the file and what was expected otherwise.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "convert/torch/unpickler.hpp"

namespace shardkit::convert::dcp {

// Where one saved item lies: bytes [offset, offset + length) of a file of the checkpoint's folder,
// holding one whole torch.save archive.
struct StorageLocation {
  std::string file;  // a name inside the folder ("__0_0.distcp")
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One saved piece of a tensor: the box [offsets, offsets + sizes) of its full shape.
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  StorageLocation location;
};

struct Item {
  std::string key;     // the flattened state dict key ("model.layers.0.attention.wq.weight")
  bool tensor = true;  // false: a pickled Python value (BytesStorageMetadata), in `chunks[0].location`
  torch::Dtype dtype = torch::Dtype::kF32;
  std::vector<int64_t> shape;
  std::vector<Chunk> chunks;
  int64_t numel() const noexcept;
};

class Metadata {
 public:
  // Reads `folder`/.metadata, charging its pickle to `budget` when given.
  explicit Metadata(const std::filesystem::path& folder, torch::ParseBudget* budget = nullptr);

  const std::filesystem::path& folder() const noexcept { return folder_; }
  // Every item, in the order of the state dict.
  const std::vector<Item>& items() const noexcept { return items_; }
  // The item saved under `key`, or nullptr.
  const Item* find(std::string_view key) const;

 private:
  std::filesystem::path folder_;
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> by_key_;
};

// Whether `path` is a DCP checkpoint folder (it holds a `.metadata` file).
bool is_dcp_folder(const std::filesystem::path& path);

}  // namespace shardkit::convert::dcp
