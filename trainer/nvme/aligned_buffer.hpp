// Host memory aligned for O_DIRECT: the buffer's address, the file offset and the length of a
// direct transfer must all be multiples of the device's logical block size (at most 4 KiB).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace shardkit::trainer::nvme {

inline constexpr size_t kDirectAlignment = 4096;

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `bytes` rounded up to kDirectAlignment, zero-filled (the tail of a last chunk is written too).
  explicit AlignedBuffer(size_t bytes) : bytes_((bytes + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment) {
    void* p = std::aligned_alloc(kDirectAlignment, bytes_);
    if (p == nullptr) throw std::bad_alloc();
    data_.reset(static_cast<std::byte*>(p));
    std::fill_n(data_.get(), bytes_, std::byte{0});
  }

  std::byte* data() const noexcept { return data_.get(); }
  size_t size() const noexcept { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t bytes_ = 0;
};

}  // namespace shardkit::trainer::nvme
