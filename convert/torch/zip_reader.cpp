#include "convert/torch/zip_reader.hpp"

#include <fcntl.h>

#include <cstring>
#include <vector>

#include "base/error.hpp"
#include "base/json_input.hpp"

namespace shardkit::convert::torch {
namespace {

constexpr uint32_t kEocdSignature = 0x06054b50;
constexpr uint32_t kZip64EocdSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint32_t kCentralSignature = 0x02014b50;
constexpr uint32_t kLocalSignature = 0x04034b50;
constexpr size_t kEocdSize = 22;
constexpr size_t kZip64EocdSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr size_t kCentralSize = 46;
constexpr size_t kLocalSize = 30;
// The EOCD may be followed by an archive comment of at most 65535 bytes.
constexpr size_t kMaxTail = kEocdSize + 0xffff;
constexpr uint16_t kZip64ExtraId = 0x0001;
// torch.save writes a few entries per tensor; far fewer than this even for the largest models, and the
// bound keeps a crafted directory from allocating beyond the file's own size.
constexpr uint64_t kMaxEntries = uint64_t{1} << 22;
constexpr size_t kMaxNameBytes = 4096;
// The directory is read whole: torch.save spends about 100 bytes an entry, so this holds hundreds of
// thousands of storages, and a crafted size cannot make it allocate the file's size.
constexpr uint64_t kMaxDirectoryBytes = uint64_t{64} << 20;

uint16_t u16(const unsigned char* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t u32(const unsigned char* p) {
  return u16(p) | (static_cast<uint32_t>(u16(p + 2)) << 16);
}
uint64_t u64(const unsigned char* p) {
  return u32(p) | (static_cast<uint64_t>(u32(p + 4)) << 32);
}

}  // namespace

ZipReader::ZipReader(const std::filesystem::path& path) : path_(path), where_(path.string()) {
  const FileDescriptor file = open_input_file(path, ErrorKind::kInvalidInput);
  file_size_ = static_cast<uint64_t>(file.size());
  index(file);
}

ZipReader::ZipReader(const std::filesystem::path& path, uint64_t offset, uint64_t length)
    : path_(path), where_(path.string() + " (the archive at byte " + std::to_string(offset) + ")"), base_(offset) {
  const FileDescriptor file = open_input_file(path, ErrorKind::kInvalidInput);
  const auto size = static_cast<uint64_t>(file.size());
  if (offset > size || length > size - offset) {
    fail(ErrorKind::kInvalidInput, path.string() + ": " + std::to_string(length) + " bytes at byte " +
                                       std::to_string(offset) + " were expected; the file holds " +
                                       std::to_string(size) + " (truncated?)");
  }
  file_size_ = length;
  index(file);
}

void ZipReader::refuse(const std::string& what) const {
  fail(ErrorKind::kInvalidInput, where_ + ": not a readable PyTorch zip archive: " + what);
}

void ZipReader::pread(const FileDescriptor& file, void* out, size_t n, uint64_t at) const {
  file.pread_exact(out, n, static_cast<int64_t>(base_ + at));
}

void ZipReader::index(const FileDescriptor& file) {
  if (file_size_ < kEocdSize) refuse("the file is too short (" + std::to_string(file_size_) + " bytes)");
  const size_t tail_size = static_cast<size_t>(std::min<uint64_t>(file_size_, kMaxTail));
  std::vector<unsigned char> tail(tail_size);
  pread(file, tail.data(), tail_size, file_size_ - tail_size);
  // The last EOCD signature whose comment length reaches exactly to the end of the file.
  size_t eocd = tail_size;
  for (size_t i = tail_size - kEocdSize + 1; i-- > 0;) {
    if (u32(&tail[i]) == kEocdSignature && i + kEocdSize + u16(&tail[i + 20]) == tail_size) {
      eocd = i;
      break;
    }
  }
  if (eocd == tail_size) refuse("no end-of-central-directory record (truncated?)");
  const unsigned char* e = &tail[eocd];
  if (u16(e + 4) != 0 || u16(e + 6) != 0) refuse("a multi-disk archive");
  uint64_t count = u16(e + 10);
  uint64_t cd_size = u32(e + 12);
  uint64_t cd_offset = u32(e + 16);
  const uint64_t eocd_pos = file_size_ - tail_size + eocd;
  if (count == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff) {
    // ZIP64: the locator right before the EOCD points at the ZIP64 EOCD record.
    if (eocd_pos < kZip64LocatorSize) refuse("a ZIP64 archive without its locator");
    unsigned char loc[kZip64LocatorSize];
    pread(file, loc, sizeof loc, eocd_pos - kZip64LocatorSize);
    if (u32(loc) != kZip64LocatorSignature) refuse("a ZIP64 archive without its locator");
    const uint64_t z_pos = u64(loc + 8);
    if (z_pos > eocd_pos - kZip64LocatorSize || eocd_pos - kZip64LocatorSize - z_pos < kZip64EocdSize) {
      refuse("the ZIP64 end record lies outside the file");
    }
    unsigned char z[kZip64EocdSize];
    pread(file, z, sizeof z, z_pos);
    if (u32(z) != kZip64EocdSignature) refuse("no ZIP64 end-of-central-directory record");
    count = u64(z + 32);
    cd_size = u64(z + 40);
    cd_offset = u64(z + 48);
  }
  if (cd_offset > file_size_ || cd_size > file_size_ - cd_offset) refuse("the central directory lies outside the file");
  if (cd_size > kMaxDirectoryBytes) refuse("a central directory of " + std::to_string(cd_size) + " bytes");
  if (count > kMaxEntries || count * kCentralSize > cd_size) {
    refuse("the central directory declares " + std::to_string(count) + " entries in " + std::to_string(cd_size) +
           " bytes");
  }
  std::vector<unsigned char> cd(static_cast<size_t>(cd_size));
  pread(file, cd.data(), cd.size(), cd_offset);
  size_t pos = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd.size() - pos < kCentralSize || u32(&cd[pos]) != kCentralSignature) {
      refuse("central directory entry " + std::to_string(i) + " is damaged");
    }
    const unsigned char* c = &cd[pos];
    const uint16_t flags = u16(c + 8);
    const uint16_t method = u16(c + 10);
    uint64_t compressed = u32(c + 20);
    uint64_t uncompressed = u32(c + 24);
    const size_t name_len = u16(c + 28);
    const size_t extra_len = u16(c + 30);
    const size_t comment_len = u16(c + 32);
    uint64_t local = u32(c + 42);
    if (cd.size() - pos - kCentralSize < name_len + extra_len + comment_len) {
      refuse("central directory entry " + std::to_string(i) + " runs past the directory");
    }
    if (name_len == 0 || name_len > kMaxNameBytes) refuse("an entry name of " + std::to_string(name_len) + " bytes");
    std::string name(reinterpret_cast<const char*>(c + kCentralSize), name_len);
    if (name.find('\0') != std::string::npos) refuse("an entry name with a NUL byte");
    // ZIP64 extra field: the 64-bit values of the fields saturated above, in this order.
    const unsigned char* x = c + kCentralSize + name_len;
    for (size_t at = 0; at + 4 <= extra_len;) {
      const uint16_t id = u16(x + at);
      const size_t len = u16(x + at + 2);
      if (at + 4 + len > extra_len) refuse("entry " + quoted_excerpt(name) + " has a damaged extra field");
      if (id == kZip64ExtraId) {
        size_t k = at + 4;
        auto take = [&](uint64_t& field) {
          if (field != 0xffffffff) return;
          if (k + 8 > at + 4 + len) refuse("entry " + quoted_excerpt(name) + " has a short ZIP64 field");
          field = u64(x + k);
          k += 8;
        };
        take(uncompressed);
        take(compressed);
        take(local);
      }
      at += 4 + len;
    }
    pos += kCentralSize + name_len + extra_len + comment_len;
    if (flags & 0x1) refuse("entry " + quoted_excerpt(name) + " is encrypted");
    if (method != 0) {
      refuse("entry " + quoted_excerpt(name) + " is compressed (method " + std::to_string(method) +
             "); torch.save stores every entry uncompressed");
    }
    if (compressed != uncompressed) refuse("entry " + quoted_excerpt(name) + " is stored with two different sizes");
    // The data starts after the local header, whose name and extra field lengths may differ from the
    // central directory's (torch.save pads the local extra field to align the data to 64 bytes).
    if (local > file_size_ || file_size_ - local < kLocalSize)
      refuse("entry " + quoted_excerpt(name) + " lies outside the file");
    unsigned char lh[kLocalSize];
    pread(file, lh, sizeof lh, local);
    if (u32(lh) != kLocalSignature) refuse("entry " + quoted_excerpt(name) + " has no local header at its offset");
    const uint64_t data = local + kLocalSize + u16(lh + 26) + u16(lh + 28);
    if (data > file_size_ || compressed > file_size_ - data) {
      refuse("entry " + quoted_excerpt(name) + " (" + std::to_string(compressed) +
             " bytes) runs past the end of the file");
    }
    ZipEntry entry{name, data, compressed};
    if (!entries_.emplace(name, std::move(entry)).second) refuse("entry " + quoted_excerpt(name) + " appears twice");
  }
}

const ZipEntry* ZipReader::find(std::string_view name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

void ZipReader::read(const ZipEntry& entry, uint64_t offset, std::span<std::byte> out) const {
  if (offset > entry.size || out.size() > entry.size - offset) {
    fail(ErrorKind::kInvalidInput, where_ + ": entry " + quoted_excerpt(entry.name) + " holds " +
                                       std::to_string(entry.size) + " bytes; " + std::to_string(out.size()) +
                                       " bytes at " + std::to_string(offset) + " were expected");
  }
  if (out.empty()) return;
  const FileDescriptor file = open_input_file(path_, ErrorKind::kInvalidInput);
  pread(file, out.data(), out.size(), entry.data_offset + offset);
}

std::string ZipReader::read_all(const ZipEntry& entry, uint64_t max_bytes) const {
  if (entry.size > max_bytes) {
    fail(ErrorKind::kInvalidInput, where_ + ": entry " + quoted_excerpt(entry.name) + " is " +
                                       std::to_string(entry.size) + " bytes, more than the " +
                                       std::to_string(max_bytes) + " expected at most");
  }
  std::string bytes(static_cast<size_t>(entry.size), '\0');
  read(entry, 0, std::as_writable_bytes(std::span<char>(bytes.data(), bytes.size())));
  return bytes;
}

}  // namespace shardkit::convert::torch
