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
  ~ZipWriter();
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  // Bytes [offset, offset + data.size()) of entry `entry`. Thread-safe; each byte is written once.
  void write(size_t entry, uint64_t offset, std::span<const std::byte> data);
  // Checks that every byte was written, writes the headers and the central directory, fsyncs the file
  // and renames it to its path (the caller syncs the folder).
  void finish();

  const std::filesystem::path& path() const noexcept { return path_; }
  // Bytes of the whole archive.
  uint64_t file_size() const noexcept { return end_; }

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

  std::string local_header(const Placed& p, uint32_t crc) const;

  std::filesystem::path path_;
  std::filesystem::path tmp_;
  FileDescriptor file_;
  std::vector<Placed> placed_;
  uint64_t end_ = 0;  // where the central directory starts until finish(), then the file's size
  std::mutex mutex_;  // guards the runs
  bool finished_ = false;
};

}  // namespace shardkit::convert::torch
