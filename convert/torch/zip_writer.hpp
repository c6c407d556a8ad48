// A writer of the ZIP archives torch.save produces: every entry stored (no compression), its data
// aligned to 64 bytes, sizes and offsets past 4 GiB in ZIP64 records. The entries and their sizes are
// declared up front, so every byte has its place before anything is written: threads then fill any
// entry's bytes in any order with pwrite, and the local headers (which carry each entry's CRC-32) are
// written last. The archive appears at its path only when finish() has synced it: until then it is a
// temporary file beside it, removed if the writer is destroyed unfinished.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "base/file_util.hpp"

namespace shardkit::convert::torch {

class ZipWriter {
 public:
  struct Entry {
    std::string name;
    uint64_t size = 0;
  };

  // Lays the entries out in the given order and creates `path`'s temporary file.
  // Error(kInvalidInput) naming the path when it cannot be created.
  ZipWriter(std::filesystem::path path, std::vector<Entry> entries);
  // An archive at bytes [base, base + archive_size()) of `file`, which the caller owns, names, syncs
  // and keeps open until finish() (a PyTorch DCP .distcp file holds one per item, back to back):
  // finish() writes the headers and the directory only.
  ZipWriter(const FileDescriptor& file, uint64_t base, std::vector<Entry> entries);
  ~ZipWriter();
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  // Bytes [offset, offset + data.size()) of entry `entry`. Thread-safe; each byte is written once.
  void write(size_t entry, uint64_t offset, std::span<const std::byte> data);
  // Checks that every byte was written, writes the headers and the central directory, fsyncs the file
  // and renames it to its path (the caller syncs the folder).
  void finish();

  const std::filesystem::path& path() const noexcept { return path_; }
  // Bytes of the whole archive, known from the entries alone.
  uint64_t archive_size() const noexcept { return size_; }

 private:
  // The CRC-32 of one written run of an entry, combined in order at finish().
  struct Run {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint32_t crc = 0;
  };
  struct Placed {
    Entry entry;
    uint64_t header = 0;  // offset of the local header
    uint64_t data = 0;    // offset of the first data byte
    std::vector<Run> runs;
  };

  void place(std::vector<Entry> entries);
  std::string local_header(const Placed& p, uint32_t crc) const;
  // The central directory and end records, given each entry's CRC-32.
  std::string directory(const std::vector<uint32_t>& crcs) const;
  void pwrite(const void* data, size_t size, uint64_t offset) const;

  std::filesystem::path path_;
  std::filesystem::path tmp_;  // empty for an archive inside a caller's file
  FileDescriptor own_;
  const FileDescriptor* file_ = nullptr;
  uint64_t base_ = 0;  // file offset of the archive's first byte
  std::vector<Placed> placed_;
  uint64_t end_ = 0;   // where the central directory starts
  uint64_t size_ = 0;  // the whole archive
  std::mutex mutex_;   // guards the runs
  bool finished_ = false;
};

}  // namespace shardkit::convert::torch
