#include "convert/torch/torch_writer.hpp"

#include <vector>

#include "base/error.hpp"

namespace shardkit::convert::torch {
namespace {

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// torch.save's serialization format version (the records format of PyTorch 1.6 and later).
const std::string kVersion = "3\n";
const std::string kByteOrder = "little";

}  // namespace

std::vector<ZipWriter::Entry> TorchFileWriter::entries(const std::string& name, const PickledValue& pickled,
                                                       std::map<std::string, size_t>& entry_of) {
  const std::string folder = name + "/";
  std::vector<ZipWriter::Entry> entries = {{folder + "data.pkl", pickled.bytes.size()},
                                           {folder + "byteorder", kByteOrder.size()}};
  for (const StorageRef* s : pickled.storages) {
    entry_of[s->key] = entries.size();
    entries.push_back({folder + "data/" + s->key, static_cast<uint64_t>(s->numel) * dtype_size(s->dtype)});
  }
  entries.push_back({folder + "version", kVersion.size()});
  return entries;
}

// torch.save names the folder after the file, without its extension.
TorchFileWriter::TorchFileWriter(const std::filesystem::path& path, const Value& root)
    : pickled_(pickle(root)), zip_(path, entries(path.stem().string(), pickled_, entry_of_)) {
  write_records();
}

TorchFileWriter::TorchFileWriter(const FileDescriptor& file, uint64_t base, const std::string& name, const Value& root)
    : pickled_(pickle(root)), zip_(file, base, entries(name, pickled_, entry_of_)) {
  write_records();
}

void TorchFileWriter::write_records() {
  zip_.write(0, 0, bytes_of(pickled_.bytes));
  zip_.write(1, 0, bytes_of(kByteOrder));
  zip_.write(entry_of_.size() + 2, 0, bytes_of(kVersion));
}

void TorchFileWriter::write(const std::string& key, uint64_t byte_offset, std::span<const std::byte> bytes) {
  const auto it = entry_of_.find(key);
  if (it == entry_of_.end()) fail(ErrorKind::kInternal, path().string() + ": no storage '" + key + "'");
  zip_.write(it->second, byte_offset, bytes);
}

}  // namespace shardkit::convert::torch
