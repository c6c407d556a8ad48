// The NVMe swap of optimizer states on its own: every access mode of the chunk pipeline returns and
// keeps exactly the values given (partial last chunk, few and many bounce buffers), and each refusal
// is one line naming the path and what was expected.
#include "trainer/nvme/state_swapper.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "tests/support/test_support.hpp"
#include "trainer/nvme/aligned_buffer.hpp"

namespace shardkit::trainer::nvme {
namespace {

using Access = StateSwapper::Access;

void ignore(const std::string&) {}

SwapOptions small_chunks(const std::filesystem::path& dir, int buffer_count) {
  SwapOptions o;
  o.dir = dir;
  o.chunk_bytes = 4096;  // 1024 elements: a few thousand elements make many chunks
  o.queue_depth = 3;
  o.buffer_count = buffer_count;
  return o;
}

float value(int state, int64_t i) {
  return static_cast<float>(state * 1000003 + i) * 0.5f;
}

// Error(kind)'s message of `f`, or "" (and a failure) when it does not throw.
template <typename F>
std::string error_of(F&& f, ErrorKind kind = ErrorKind::kInvalidInput) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(NvmeSwap, EveryAccessModeKeepsTheValuesChunkByChunk) {
  testing::TempDir dir;
  for (const int buffers : {1, 3, 6}) {  // 1 is raised to 3
    const int64_t n = 5 * 1024 + 77;     // a partial last chunk
    StateSwapper swap(small_chunks(dir.path(), buffers), "swap.bin", n, 3, "optimizer states", ignore);
    EXPECT_EQ(swap.file_bytes(), 3 * 6 * 4096);  // 12 bytes per element, in whole chunks
    int64_t next = 0;
    swap.visit(Access::kWrite, [&](const StateSwapper::Chunk& c) {
      EXPECT_EQ(c.offset, next);
      next += static_cast<int64_t>(c.states[0].size());
      for (int s = 0; s < kMaxStates; ++s) {
        for (size_t i = 0; i < c.states[s].size(); ++i) c.states[s][i] = value(s, c.offset + static_cast<int64_t>(i));
      }
    });
    EXPECT_EQ(next, n);
    // An update doubles the master weights and adds 1 to the moments.
    swap.visit(Access::kUpdate, [&](const StateSwapper::Chunk& c) {
      for (size_t i = 0; i < c.states[0].size(); ++i) {
        EXPECT_EQ(c.states[1][i], value(1, c.offset + static_cast<int64_t>(i)));
        c.states[0][i] *= 2;
        c.states[1][i] += 1;
        c.states[2][i] += 1;
      }
    });
    for (int s = 0; s < kMaxStates; ++s) {
      const int one[] = {s};
      std::vector<float> got;
      swap.visit(Access::kRead, one, [&](const StateSwapper::Chunk& c) {
        for (int other = 0; other < kMaxStates; ++other) EXPECT_EQ(c.states[other].empty(), other != s);
        got.insert(got.end(), c.states[s].begin(), c.states[s].end());
      });
      ASSERT_EQ(got.size(), static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float want = s == 0 ? value(0, i) * 2 : value(s, i) + 1;
        ASSERT_EQ(got[static_cast<size_t>(i)], want)
            << "state " << s << " element " << i << ", " << buffers << " buffers";
      }
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the swap file outlived its swapper";
}

// A one-state swap (stage 3's parameters) filled in one pass with a three-state one (the optimizer's),
// then read back by ranges at unaligned offsets across chunks (a gather's slices), two in flight.
TEST(NvmeSwap, TwoSwapsVisitedTogetherAndRangesReadBack) {
  testing::TempDir dir;
  const int64_t n = 5 * 1024 + 77;
  StateSwapper optimizer(small_chunks(dir.path(), 3), "optimizer.swap", n, 3, "optimizer states", ignore);
  StateSwapper params(small_chunks(dir.path(), 4), "params.swap", n, 1, "parameters", ignore);
  EXPECT_EQ(params.file_bytes(), 6 * 4096);  // 4 bytes per element, in whole chunks
  const int kParams[] = {0};
  const StateSwapper::Part parts[] = {{&optimizer, Access::kWrite, optimizer.all_states()},
                                      {&params, Access::kWrite, kParams}};
  int64_t visited = 0;
  StateSwapper::visit(parts, [&](std::span<const StateSwapper::Chunk> c) {
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(c[0].offset, visited);
    EXPECT_EQ(c[1].offset, visited);
    EXPECT_TRUE(c[1].states[1].empty());
    for (int s = 0; s < kMaxStates; ++s) {
      for (size_t i = 0; i < c[0].states[s].size(); ++i)
        c[0].states[s][i] = value(s, c[0].offset + static_cast<int64_t>(i));
    }
    for (size_t i = 0; i < c[1].states[0].size(); ++i)
      c[1].states[0][i] = value(7, c[1].offset + static_cast<int64_t>(i));
    visited += static_cast<int64_t>(c[0].states[0].size());
  });
  EXPECT_EQ(visited, n);
  RangeRead a, b;
  params.start_read(a, 0, 1000, 3000);
  params.start_read(b, 0, n - 5, 5);  // the end of the partial last chunk
  const std::span<const float> tail = params.finish_read(b);
  ASSERT_EQ(tail.size(), 5u);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(tail[static_cast<size_t>(i)], value(7, n - 5 + i));
  const std::span<const float> middle = params.finish_read(a);
  ASSERT_EQ(middle.size(), 3000u);
  for (int64_t i = 0; i < 3000; ++i) ASSERT_EQ(middle[static_cast<size_t>(i)], value(7, 1000 + i)) << i;
  optimizer.start_read(a, 2, 17, 2048);  // a state after the first, into a's buffer again
  const std::span<const float> moment = optimizer.finish_read(a);
  for (int64_t i = 0; i < 2048; ++i) ASSERT_EQ(moment[static_cast<size_t>(i)], value(2, 17 + i)) << i;
  // Past the partition's end, or a state the swap does not hold: an error, not padding or another
  // state's bytes; the read stays usable.
  EXPECT_EQ(error_of([&] { params.start_read(a, 0, n - 4, 5); }, ErrorKind::kInternal),
            params.path().string() +
                ": a range read of elements [5193, 5198) of state 0; the swap holds 1 state of 5197 elements");
  EXPECT_EQ(error_of([&] { optimizer.start_read(a, 3, 0, 1); }, ErrorKind::kInternal),
            optimizer.path().string() +
                ": a range read of elements [0, 1) of state 3; the swap holds 3 states of 5197 elements");
  params.start_read(a, 0, 0, 1);
  EXPECT_EQ(params.finish_read(a)[0], value(7, 0));
}

// Stage 3's parameters in a GPU's 16-bit type: a swap of 2-byte elements visited with the optimizer's
// fp32 one chunk for chunk (the same elements in half the bytes), read back by ranges into a buffer
// of the caller's sized by range_bytes at any offset, and refused where its chunks would lose the
// O_DIRECT alignment.
TEST(NvmeSwap, ASixteenBitSwapGoesWithAnFp32OneAndReadsIntoTheCallersBuffer) {
  testing::TempDir dir;
  SwapOptions o = small_chunks(dir.path(), 3);
  o.chunk_bytes = 8192;  // 2048 elements of either width
  const int64_t n = 5 * 2048 + 77;
  const auto bits = [](int64_t i) { return static_cast<uint16_t>(i * 7 + 3); };
  StateSwapper optimizer(o, "optimizer.swap", n, 3, "optimizer states", ignore);
  StateSwapper params(o, "params.swap", n, 1, "parameters", ignore, 2);
  EXPECT_EQ(params.file_bytes(), 6 * 4096);  // 2 bytes per element, in whole chunks
  EXPECT_EQ(StateSwapper::need(o, n, 1, "parameters", 2).what,
            "the parameters of this rank's 10317-element partition (2 bytes per element)");
  const int kParams[] = {0};
  const StateSwapper::Part parts[] = {{&optimizer, Access::kWrite, optimizer.all_states()},
                                      {&params, Access::kWrite, kParams}};
  int64_t visited = 0;
  StateSwapper::visit(parts, [&](std::span<const StateSwapper::Chunk> c) {
    for (const std::span<float> state : c[1].states) EXPECT_TRUE(state.empty());
    ASSERT_EQ(c[1].bits16[0].size(), c[0].states[0].size());
    for (size_t i = 0; i < c[1].bits16[0].size(); ++i) c[1].bits16[0][i] = bits(c[1].offset + static_cast<int64_t>(i));
    for (const std::span<float> state : c[0].states) std::fill(state.begin(), state.end(), 0.0f);
    visited += static_cast<int64_t>(c[1].bits16[0].size());
  });
  EXPECT_EQ(visited, n);

  constexpr int64_t kCount = 3000;
  AlignedBuffer buffer(StateSwapper::range_bytes(kCount, 2));
  RangeRead read(std::span(buffer.data(), buffer.size()));
  for (const int64_t offset : {int64_t{0}, int64_t{1}, int64_t{2047}, int64_t{2049}, n - kCount}) {
    params.start_read(read, 0, offset, kCount);
    const std::span<const uint16_t> got = params.finish_read<uint16_t>(read);
    ASSERT_EQ(got.size(), static_cast<size_t>(kCount));
    EXPECT_GE(reinterpret_cast<const std::byte*>(got.data()), buffer.data()) << "read elsewhere than asked";
    EXPECT_LE(reinterpret_cast<const std::byte*>(got.data() + kCount), buffer.data() + buffer.size());
    for (int64_t i = 0; i < kCount; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], bits(offset + i)) << offset << "+" << i;
  }
  // More than the caller's buffer holds; elements read as another width (the read stays usable).
  EXPECT_EQ(error_of([&] { params.start_read(read, 0, 0, 3 * kCount); }, ErrorKind::kInternal),
            params.path().string() + ": a range read of 20480 bytes into a buffer of 12288");
  params.start_read(read, 0, 5, 10);
  EXPECT_EQ(error_of([&] { params.finish_read<float>(read); }, ErrorKind::kInternal),
            params.path().string() + ": read as elements of 4 bytes, holds elements of 2");
  EXPECT_EQ(params.finish_read<uint16_t>(read)[0], bits(5));
  // A chunk of 4096 bytes of fp32 would be 2048 bytes of 16-bit elements: not aligned for O_DIRECT.
  EXPECT_NE(error_of([&] {
              StateSwapper(small_chunks(dir.path(), 3), "s", 10, 1, "parameters", ignore, 2);
            }).find("multiple of 8192 for a swap of 16-bit elements"),
            std::string::npos);
}

TEST(NvmeSwap, AFailingVisitLeavesNothingInFlightAndTheSwapUsable) {
  testing::TempDir dir;
  StateSwapper swap(small_chunks(dir.path(), 4), "swap.bin", 8 * 1024, 3, "optimizer states", ignore);
  swap.visit(Access::kWrite, [](const StateSwapper::Chunk& c) {
    for (auto s : c.states) std::fill(s.begin(), s.end(), 1.0f);
  });
  EXPECT_THROW(swap.visit(Access::kUpdate,
                          [](const StateSwapper::Chunk& c) {
                            if (c.offset == 3 * 1024) throw std::runtime_error("stop");
                          }),
               std::runtime_error);
  double sum = 0;
  swap.visit(Access::kRead, [&](const StateSwapper::Chunk& c) {
    for (float x : c.states[2]) sum += static_cast<double>(x);
  });
  EXPECT_EQ(sum, 8 * 1024);
}

TEST(NvmeSwap, BadFoldersAreRefusedNamingThePath) {
  testing::TempDir dir;
  const auto missing = dir / "absent";
  EXPECT_EQ(error_of([&] { StateSwapper(small_chunks(missing, 3), "s", 10, 3, "optimizer states", ignore); }),
            missing.string() + ": nvme_path does not exist (expected a writable directory)");
  std::ofstream(dir / "file") << "x";
  EXPECT_EQ(error_of([&] { StateSwapper(small_chunks(dir / "file", 3), "s", 10, 3, "optimizer states", ignore); }),
            (dir / "file").string() + ": nvme_path is not a directory (expected a writable directory)");
  SwapOptions unaligned = small_chunks(dir.path(), 3);
  unaligned.chunk_bytes = 1000;
  EXPECT_TRUE(error_of([&] {
                StateSwapper(unaligned, "s", 10, 3, "optimizer states", ignore);
              }).find("multiple of 4096") != std::string::npos);
}

// A disk that fills while the file is allocated (here a file-size limit, RLIMIT_FSIZE): an I/O error
// naming the file, which is removed again.
TEST(NvmeSwap, AnAllocationThatRunsOutOfSpaceFailsAndLeavesNoFile) {
  testing::TempDir dir;
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string e = error_of(
      [&] { StateSwapper(small_chunks(dir.path(), 3), "s", 1 << 20, 3, "optimizer states", ignore); }, ErrorKind::kIo);
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_EQ(e, (dir / "s").string() +
                   ": cannot allocate 12.58 MB for the optimizer states of this rank's "
                   "1048576-element partition (12 bytes per element): File too large");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(NvmeSwap, ALiveRunsFileIsRefusedAndAKilledRunsFileReplaced) {
  testing::TempDir dir;
  {
    StateSwapper live(small_chunks(dir.path(), 3), "s.swap", 100, 3, "optimizer states", ignore);
    EXPECT_EQ(
        error_of([&] { StateSwapper(small_chunks(dir.path(), 3), "s.swap", 100, 3, "optimizer states", ignore); }),
        (dir / "s.swap").string() +
            ": in use by a running shardkit job (its swap file is locked); expected no other run with "
            "this name in nvme_path");
    EXPECT_TRUE(std::filesystem::exists(dir / "s.swap")) << "the refusal removed the live run's file";
  }
  std::ofstream(dir / "s.swap") << "left by a killed run";
  std::vector<std::string> notices;
  StateSwapper again(small_chunks(dir.path(), 3), "s.swap", 100, 3, "optimizer states",
                     [&](const std::string& l) { notices.push_back(l); });
  ASSERT_FALSE(notices.empty());
  EXPECT_NE(notices[0].find("was left by a run that ended without removing it: replaced"), std::string::npos);
}

// nvme_path may be shared with others: what they leave where a rank's swap file goes is refused in
// one line, never followed, waited on or removed. A FIFO used to block the open forever (here a
// helper thread opens its other end after a while, so that a regression fails instead of hanging), a
// directory ended in "filesystem error", a link in an error about the open.
TEST(NvmeSwap, WhatIsInTheWayOfTheSwapFileIsRefusedNotFollowedOrWaitedOn) {
  testing::TempDir dir;
  const auto swap_at = [&](const std::string& name) {
    StateSwapper(small_chunks(dir.path(), 3), name, 100, 3, "optimizer states", ignore);
  };
  const auto in_the_way = [&](const std::string& name, const std::string& what) {
    return (dir / name).string() + ": " + what +
           " is in the way of this rank's swap file (expected no entry of that name in nvme_path; remove it or choose "
           "another nvme_path)";
  };
  ASSERT_EQ(::mkfifo((dir / "fifo.swap").c_str(), 0600), 0);
  std::atomic<bool> done = false, rescued = false;
  std::thread rescuer([&] {
    for (int i = 0; i < 100 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (done) return;
    rescued = true;
    const int fd = ::open((dir / "fifo.swap").c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  });
  const std::string fifo_error = error_of([&] { swap_at("fifo.swap"); });
  done = true;
  rescuer.join();
  EXPECT_FALSE(rescued) << "the open waited for a writer";
  EXPECT_EQ(fifo_error, in_the_way("fifo.swap", "a FIFO"));

  std::filesystem::create_directories(dir / "dir.swap");
  std::ofstream(dir / "dir.swap" / "theirs") << "kept";
  EXPECT_EQ(error_of([&] { swap_at("dir.swap"); }), in_the_way("dir.swap", "a directory"));
  EXPECT_TRUE(std::filesystem::exists(dir / "dir.swap" / "theirs"));

  std::ofstream(dir / "victim") << "kept";
  std::filesystem::create_symlink(dir / "victim", dir / "link.swap");
  EXPECT_EQ(error_of([&] { swap_at("link.swap"); }), in_the_way("link.swap", "a symbolic link"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.swap"));
  EXPECT_EQ(std::filesystem::file_size(dir / "victim"), 4u);
}

// buffer_count and aio.block_size come from the config: their product is checked before anything is
// allocated (it used to end in std::bad_alloc, or fill the machine), overflow included.
TEST(NvmeSwap, BounceBuffersBeyondTheMemoryAvailableAreRefusedBeforeAllocation) {
  testing::TempDir dir;
  ASSERT_EQ(::setenv("SHARDKIT_HOST_MEMORY", "64MiB", 1), 0);
  SwapOptions many = small_chunks(dir.path(), 32);
  many.chunk_bytes = 1 << 20;  // 32 buffers of 3 MiB: 96 MiB
  const std::string e = error_of([&] { StateSwapper(many, "s", 1000, 3, "optimizer states", ignore); });
  EXPECT_EQ(e,
            "NVMe swap of the optimizer states: 32 buffers (buffer_count) of 3 x 1048576 bytes (aio.block_size) "
            "need 100.66 MB, more than the 67.11 MB of memory available (SHARDKIT_HOST_MEMORY overrides what the "
            "kernel says); lower buffer_count or aio.block_size");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "refused before the swap file was made";
  many.buffer_count = 16;  // 48 MiB fit
  EXPECT_NO_THROW(StateSwapper(many, "s", 1000, 3, "optimizer states", ignore));
  ASSERT_EQ(::unsetenv("SHARDKIT_HOST_MEMORY"), 0);

  SwapOptions wrapping = small_chunks(dir.path(), std::numeric_limits<int>::max());
  wrapping.chunk_bytes = int64_t{1} << 40;
  EXPECT_NE(error_of([&] { StateSwapper::need(wrapping, 1000, 3, "optimizer states"); })
                .find("2147483647 buffers (buffer_count) of 3 x 1099511627776 bytes (aio.block_size) need more than "
                      "2^63 bytes"),
            std::string::npos);
}

}  // namespace
}  // namespace shardkit::trainer::nvme
