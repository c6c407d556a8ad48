// Large host buffers on transparent huge pages. Where the kernel hands them out only on request
// (THP "madvise", Debian's default) and especially inside virtual machines, where every 4 KiB page
// fault and TLB miss walks two page tables, a checkpoint's gigabytes of states on small pages are
// filled at a fraction of the memory's speed: reading 1.2 GB from the page cache into fresh 4 KiB
// pages ran at 0.36 GB/s on the 2-core CI machine, into huge pages at 7.8 GB/s.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <utility>
#include <vector>

namespace shardkit {

// std::allocator, except that allocations of 2 MiB or more are 2 MiB aligned and advised to the
// kernel as huge-page memory (a hint: without THP they are ordinary pages).
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHugePage = size_t{2} << 20;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return std::allocator<T>().allocate(n);
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, rounded);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure leaves ordinary pages
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugePage) {
      std::allocator<T>().deallocate(p, n);
    } else {
      std::free(p);
    }
  }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

// A vector for buffers that may be gigabytes: a rank's flat states, gradients, snapshots.
template <typename T>
using LargeVector = std::vector<T, HugePageAllocator<T>>;

// A fixed-size buffer on huge pages whose elements start uninitialised, for tens of gigabytes that one
// thread would take minutes to zero page by page: the owner fills it on all its threads (which also
// spreads the first touch of the pages over them).
template <typename T>
class HugeBuffer {
 public:
  HugeBuffer() = default;
  explicit HugeBuffer(size_t count)
      : data_(count > 0 ? HugePageAllocator<T>().allocate(count) : nullptr), size_(count) {}
  ~HugeBuffer() {
    if (data_ != nullptr) HugePageAllocator<T>().deallocate(data_, size_);
  }
  HugeBuffer(HugeBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  HugeBuffer& operator=(HugeBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  std::span<T> span() noexcept { return {data_, size_}; }
  std::span<const T> span() const noexcept { return {data_, size_}; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace shardkit
