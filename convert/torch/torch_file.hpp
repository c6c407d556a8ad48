// One file written by torch.save (a zip archive holding `data.pkl` and one record per storage), opened
// without Python: the pickle is run by the restricted unpickler, and tensors are read piece by piece
// from their storage records as fp32, so a file's tensors never need to be in memory whole.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "convert/torch/unpickler.hpp"
#include "convert/torch/zip_reader.hpp"

namespace shardkit::convert::torch {

// data.pkl holds no tensor data: even a large model's state dict pickles in a few MB.
inline constexpr uint64_t kMaxPickleBytes = uint64_t{32} << 20;

class TorchFile {
 public:
  // Opens the archive, checks its records (version, byte order) and runs data.pkl, charging what it
  // builds to `budget` when given (the checkpoint's, shared by all its files).
  // Error(kInvalidInput) naming the file when it is not a torch.save archive or its pickle is refused.
  explicit TorchFile(const std::filesystem::path& path, ParseBudget* budget = nullptr);
  // An archive that is bytes [offset, offset + length) of `path` (an item of a PyTorch DCP .distcp file).
  TorchFile(const std::filesystem::path& path, uint64_t offset, uint64_t length, ParseBudget* budget = nullptr);

  const std::filesystem::path& path() const noexcept { return zip_.path(); }
  // The file, and where in it the archive lies when it is a part: for messages.
  const std::string& where() const noexcept { return zip_.where(); }
  const Value& root() const noexcept { return pickle_.root(); }

  // Elements [offset, offset + out.size()) of `tensor` (flattened, row-major) widened to fp32: float32,
  // float16 and bfloat16 tensors (exact), and float64 narrowed as torch's .float() does. The tensor must
  // be contiguous; its storage record must hold what its storage declares. Thread-safe.
  // Error(kInvalidInput) naming the file and `what` (the tensor's place in the checkpoint) otherwise.
  void read(const TensorRef& tensor, int64_t offset, std::span<float> out, const std::string& what) const;
  // The value of a one-element tensor of any element type (a step counter): integers exactly up to 2^53.
  double scalar(const TensorRef& tensor, const std::string& what) const;

 private:
  void open(ParseBudget* budget);
  const ZipEntry& storage_entry(const TensorRef& tensor, const std::string& what) const;

  ZipReader zip_;
  std::string prefix_;  // "<archive name>/": the folder every record lies in
  Pickle pickle_;
};

}  // namespace shardkit::convert::torch
