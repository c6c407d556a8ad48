// A file as torch.save writes it (what torch.load, and so DeepSpeed's load_checkpoint, reads): a zip
// archive with one folder named after the file holding `data.pkl` (the pickled value), `byteorder`,
// one record `data/<key>` per storage the value's tensors view, and `version`. The storages' bytes are
// written afterwards, in pieces from any thread, so no tensor needs to be in memory whole.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>

#include "convert/torch/pickler.hpp"
#include "convert/torch/zip_writer.hpp"

namespace shardkit::convert::torch {

class TorchFileWriter {
 public:
  // Pickles `root` and lays out the archive at `path` (written as `path`.tmp until finish()).
  TorchFileWriter(const std::filesystem::path& path, const Value& root);
  // The archive at bytes [base, base + archive_size()) of `file`, its records in the folder `name` (what
  // torch.save into a buffer writes: "archive"). The caller keeps `file` open and syncs it.
  TorchFileWriter(const FileDescriptor& file, uint64_t base, const std::string& name, const Value& root);

  // Little-endian bytes [byte_offset, byte_offset + bytes.size()) of the storage `key`. Thread-safe.
  void write(const std::string& key, uint64_t byte_offset, std::span<const std::byte> bytes);
  // Every storage byte must have been written. Syncs the file and gives it its name.
  void finish() { zip_.finish(); }

  const std::filesystem::path& path() const noexcept { return zip_.path(); }
  uint64_t archive_size() const noexcept { return zip_.archive_size(); }

 private:
  static std::vector<ZipWriter::Entry> entries(const std::string& folder, const PickledValue& pickled,
                                               std::map<std::string, size_t>& entry_of);
  void write_records();

  PickledValue pickled_;
  std::map<std::string, size_t> entry_of_;  // storage key -> zip entry
  ZipWriter zip_;
};

}  // namespace shardkit::convert::torch
