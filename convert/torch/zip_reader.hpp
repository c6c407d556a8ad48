// A reader of the ZIP archives torch.save writes (PyTorch's "zip file format", the container of every
// DeepSpeed *.pt file): the central directory, classic or ZIP64, and entries read by byte range with
// pread, so a multi-gigabyte tensor record is never held in memory whole.
//
// torch.save stores every record uncompressed ("stored", method 0) and writes zero sizes into the local
// headers (the sizes follow the data in a descriptor), so sizes and offsets come from the central
// directory; the local header is read only for the length of its name and extra field. Everything an
// archive declares is checked against the file before use: a crafted or truncated archive is an
// Error(kInvalidInput) naming the file, never a read outside it.
//
// The file is opened for each read rather than held open: a universal checkpoint has three files per
// parameter, thousands for a large model, more than a process may hold open.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "base/file_util.hpp"

namespace shardkit::convert::torch {

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;  // file offset of the first byte of the entry's data
  uint64_t size = 0;         // bytes (stored: compressed size == uncompressed size)
};

class ZipReader {
 public:
  // Opens and indexes the archive. Refuses (Error(kInvalidInput), naming the file and the entry) a file
  // without an end-of-central-directory record, a multi-disk or encrypted archive, a compressed entry,
  // an entry whose data lies outside the file, and a name given twice.
  explicit ZipReader(const std::filesystem::path& path);
  // An archive that is bytes [offset, offset + length) of `path` (PyTorch DCP keeps each item of a rank's
  // .distcp file as a whole torch.save archive, back to back): offsets inside are relative to its start.
  ZipReader(const std::filesystem::path& path, uint64_t offset, uint64_t length);

  const std::filesystem::path& path() const noexcept { return path_; }
  // The file, and where the archive lies in it when it is a part: for messages.
  const std::string& where() const noexcept { return where_; }
  // Bytes of the archive.
  uint64_t file_size() const noexcept { return file_size_; }
  const std::map<std::string, ZipEntry, std::less<>>& entries() const noexcept { return entries_; }
  // nullptr when there is no such entry.
  const ZipEntry* find(std::string_view name) const;
  // Bytes [offset, offset + out.size()) of the entry; a range past its end is Error(kInvalidInput).
  // Thread-safe.
  void read(const ZipEntry& entry, uint64_t offset, std::span<std::byte> out) const;
  // The whole entry, when it is at most `max_bytes` long (Error(kInvalidInput) otherwise).
  std::string read_all(const ZipEntry& entry, uint64_t max_bytes) const;

 private:
  void index(const FileDescriptor& file);
  // pread_exact of `n` bytes at archive offset `at`.
  void pread(const FileDescriptor& file, void* out, size_t n, uint64_t at) const;
  [[noreturn]] void refuse(const std::string& what) const;

  std::filesystem::path path_;
  std::string where_;
  uint64_t base_ = 0;  // file offset of the archive's first byte
  uint64_t file_size_ = 0;
  std::map<std::string, ZipEntry, std::less<>> entries_;
};

}  // namespace shardkit::convert::torch
