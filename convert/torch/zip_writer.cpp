#include "convert/torch/zip_writer.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.hpp"
#include "base/write_target.hpp"

namespace shardkit::convert::torch {
namespace {

constexpr uint64_t kAlignment = 64;  // torch.save aligns every record's data to 64 bytes
constexpr uint64_t k32 = 0xffffffff;
constexpr uint16_t kVersionZip64 = 45;
constexpr uint16_t kVersionPlain = 20;
constexpr uint16_t kPaddingExtraId = 0x4246;  // "FB": the padding field torch's writer uses

void put16(std::string& s, uint64_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>((v >> 8) & 0xff));
}
void put32(std::string& s, uint64_t v) {
  put16(s, v & 0xffff);
  put16(s, (v >> 16) & 0xffff);
}
void put64(std::string& s, uint64_t v) {
  put32(s, v & k32);
  put32(s, v >> 32);
}

void pwrite_all(const FileDescriptor& fd, const void* data, size_t size, uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd.get(), p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail(ErrorKind::kIo, fd.path().string() + ": write failed: " + std::strerror(n < 0 ? errno : EIO));
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

// Bytes of the local header's fixed part, name and ZIP64 field (the padding field follows).
uint64_t local_prefix(const ZipWriter::Entry& e) {
  return 30 + e.name.size() + (e.size >= k32 ? 20 : 0);
}

}  // namespace

ZipWriter::ZipWriter(std::filesystem::path path, std::vector<Entry> entries)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp") {
  place(std::move(entries));
  own_ = create_fresh_file(tmp_, O_WRONLY);
  file_ = &own_;
}

ZipWriter::ZipWriter(const FileDescriptor& file, uint64_t base, std::vector<Entry> entries)
    : path_(file.path()), file_(&file), base_(base) {
  place(std::move(entries));
}

void ZipWriter::place(std::vector<Entry> entries) {
  uint64_t at = 0;
  for (Entry& e : entries) {
    if (e.name.empty() || e.name.size() > 0xffff) fail(ErrorKind::kInternal, "a zip entry name of bad length");
    Placed p;
    p.header = at;
    // The padding field (4 bytes and the padding) brings the data to the next multiple of 64.
    const uint64_t before_pad = at + local_prefix(e) + 4;
    p.data = (before_pad + kAlignment - 1) / kAlignment * kAlignment;
    at = p.data + e.size;
    p.entry = std::move(e);
    placed_.push_back(std::move(p));
  }
  end_ = at;
  size_ = end_ + directory(std::vector<uint32_t>(placed_.size(), 0)).size();
}

ZipWriter::~ZipWriter() {
  if (!finished_ && !tmp_.empty()) {
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
  }
}

void ZipWriter::pwrite(const void* data, size_t size, uint64_t offset) const {
  pwrite_all(*file_, data, size, base_ + offset);
}

void ZipWriter::write(size_t entry, uint64_t offset, std::span<const std::byte> data) {
  Placed& p = placed_.at(entry);
  if (offset > p.entry.size || data.size() > p.entry.size - offset) {
    fail(ErrorKind::kInternal, path_.string() + ": a write past the end of entry " + p.entry.name);
  }
  if (data.empty()) return;
  pwrite(data.data(), data.size(), p.data + offset);
  const uint32_t crc = static_cast<uint32_t>(
      crc32_z(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<z_size_t>(data.size())));
  const std::lock_guard lock(mutex_);
  p.runs.push_back({offset, data.size(), crc});
}

std::string ZipWriter::local_header(const Placed& p, uint32_t crc) const {
  const bool zip64 = p.entry.size >= k32;
  std::string h;
  put32(h, 0x04034b50);
  put16(h, zip64 ? kVersionZip64 : kVersionPlain);
  put16(h, 0);  // flags
  put16(h, 0);  // method: stored
  put16(h, 0);  // time
  put16(h, 0);  // date
  put32(h, crc);
  put32(h, zip64 ? k32 : p.entry.size);
  put32(h, zip64 ? k32 : p.entry.size);
  put16(h, p.entry.name.size());
  const uint64_t pad_total = p.data - p.header - local_prefix(p.entry);  // the padding field, header included
  put16(h, (zip64 ? 20 : 0) + pad_total);
  h += p.entry.name;
  if (zip64) {
    put16(h, 0x0001);
    put16(h, 16);
    put64(h, p.entry.size);
    put64(h, p.entry.size);
  }
  put16(h, kPaddingExtraId);
  put16(h, pad_total - 4);
  h.append(pad_total - 4, 'Z');
  return h;
}

void ZipWriter::finish() {
  std::vector<uint32_t> crcs;
  for (Placed& p : placed_) {
    std::sort(p.runs.begin(), p.runs.end(), [](const Run& a, const Run& b) { return a.offset < b.offset; });
    uint32_t crc = 0;
    uint64_t covered = 0;
    for (const Run& r : p.runs) {
      if (r.offset != covered) break;
      crc = static_cast<uint32_t>(crc32_combine(crc, r.crc, static_cast<z_off_t>(r.length)));
      covered += r.length;
    }
    if (covered != p.entry.size) {
      fail(ErrorKind::kInternal, path_.string() + ": entry " + p.entry.name + " was not written whole (" +
                                     std::to_string(covered) + " of " + std::to_string(p.entry.size) + " bytes)");
    }
    const std::string header = local_header(p, crc);
    pwrite(header.data(), header.size(), p.header);
    crcs.push_back(crc);
  }
  const std::string tail = directory(crcs);
  pwrite(tail.data(), tail.size(), end_);
  if (!tmp_.empty()) {
    own_.fsync();
    own_.close();
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) fail(ErrorKind::kIo, tmp_.string() + ": cannot rename to " + path_.string() + ": " + ec.message());
  }
  finished_ = true;
}

std::string ZipWriter::directory(const std::vector<uint32_t>& crcs) const {
  std::string directory;
  for (size_t i = 0; i < placed_.size(); ++i) {
    const Placed& p = placed_[i];
    const uint32_t crc = crcs[i];
    const bool big_size = p.entry.size >= k32;
    const bool big_offset = p.header >= k32;
    std::string extra;
    if (big_size || big_offset) {
      std::string values;
      if (big_size) {
        put64(values, p.entry.size);
        put64(values, p.entry.size);
      }
      if (big_offset) put64(values, p.header);
      put16(extra, 0x0001);
      put16(extra, values.size());
      extra += values;
    }
    const uint16_t version = big_size || big_offset ? kVersionZip64 : kVersionPlain;
    put32(directory, 0x02014b50);
    put16(directory, version);  // made by
    put16(directory, version);  // needed
    put16(directory, 0);        // flags
    put16(directory, 0);        // method
    put16(directory, 0);        // time
    put16(directory, 0);        // date
    put32(directory, crc);
    put32(directory, big_size ? k32 : p.entry.size);
    put32(directory, big_size ? k32 : p.entry.size);
    put16(directory, p.entry.name.size());
    put16(directory, extra.size());
    put16(directory, 0);  // comment
    put16(directory, 0);  // disk
    put16(directory, 0);  // internal attributes
    put32(directory, 0);  // external attributes
    put32(directory, big_offset ? k32 : p.header);
    directory += p.entry.name;
    directory += extra;
  }
  const uint64_t cd_offset = end_;
  const uint64_t cd_size = directory.size();
  const uint64_t count = placed_.size();
  std::string tail = directory;
  if (count >= 0xffff || cd_offset >= k32 || cd_size >= k32) {
    const uint64_t zip64_at = cd_offset + cd_size;
    put32(tail, 0x06064b50);
    put64(tail, 44);  // size of the rest of this record
    put16(tail, kVersionZip64);
    put16(tail, kVersionZip64);
    put32(tail, 0);
    put32(tail, 0);
    put64(tail, count);
    put64(tail, count);
    put64(tail, cd_size);
    put64(tail, cd_offset);
    put32(tail, 0x07064b50);
    put32(tail, 0);
    put64(tail, zip64_at);
    put32(tail, 1);
  }
  put32(tail, 0x06054b50);
  put16(tail, 0);
  put16(tail, 0);
  put16(tail, std::min<uint64_t>(count, 0xffff));
  put16(tail, std::min<uint64_t>(count, 0xffff));
  put32(tail, std::min(cd_size, k32));
  put32(tail, std::min(cd_offset, k32));
  put16(tail, 0);  // comment
  return tail;
}

}  // namespace shardkit::convert::torch
