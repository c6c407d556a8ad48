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

}  // namespace shardkit
