#include "ckpt/direct_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/error.hpp"

namespace shardkit::ckpt {
namespace {

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

void DirectWriter::Free::operator()(std::byte* p) const noexcept {
  std::free(p);
}

DirectWriter::DirectWriter(const std::filesystem::path& path, int workers, size_t max_bytes, bool bypass_page_cache)
    : path_(path), buffered_(path, O_WRONLY), max_bytes_(round_up(max_bytes, kAlignment)) {
  if (!bypass_page_cache) return;
  try {
    unbuffered_ = FileDescriptor(path, O_WRONLY | O_DIRECT);
    direct_ = true;
  } catch (const Error&) {
    // The filesystem has no direct I/O (EINVAL at open): the page cache it is.
  }
  if (!direct_) return;
  for (int w = 0; w < workers; ++w) {
    auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlignment, max_bytes_));
    if (!p) fail(ErrorKind::kIo, path_.string() + ": cannot allocate " + std::to_string(max_bytes_) + " bytes");
    staging_.emplace_back(p);
  }
}

void DirectWriter::write_all(int fd, const std::byte* data, size_t size, int64_t offset) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && fd == unbuffered_.get()) {
      // The filesystem took O_DIRECT at open but refuses these writes: fall back for good.
      direct_ = false;
      return write_all(buffered_.get(), data, size, offset);
    }
    if (n <= 0) {
      fail(ErrorKind::kIo, path_.string() + ": write of " + std::to_string(size) + " bytes at offset " +
                               std::to_string(offset) + " failed: " + std::strerror(n < 0 ? errno : ENOSPC));
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
}

void DirectWriter::write(const void* data, size_t size, size_t padded, int64_t offset, int worker) {
  const bool aligned = padded % kAlignment == 0 && static_cast<size_t>(offset) % kAlignment == 0;
  if (direct() && aligned && padded <= max_bytes_) {
    std::byte* stage = staging_[static_cast<size_t>(worker)].get();
    std::memcpy(stage, data, size);
    std::memset(stage + size, 0, padded - size);
    write_all(unbuffered_.get(), stage, padded, offset);
    return;
  }
  write_all(buffered_.get(), static_cast<const std::byte*>(data), size, offset);
  if (padded > size) {
    const std::vector<std::byte> zeros(padded - size);
    write_all(buffered_.get(), zeros.data(), zeros.size(), offset + static_cast<int64_t>(size));
  }
}

void DirectWriter::close() {
  unbuffered_.close();
  buffered_.close();
}

}  // namespace shardkit::ckpt
