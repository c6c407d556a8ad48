// The shard writer's positional chunk writer: what lands in the file, with and without direct I/O,
// from several threads at once, with a short chunk padded by zeros and one of an odd size.
#include "ckpt/direct_writer.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

using ckpt::DirectWriter;

constexpr size_t kChunk = 3 * DirectWriter::kAlignment;

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + static_cast<size_t>(seed) * 17) & 0xff);
  return v;
}

std::vector<std::byte> read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  for (size_t i = 0; i < c.size(); ++i) out[i] = static_cast<std::byte>(c[i]);
  return out;
}

// Eight full chunks from four threads, then a short last chunk padded to a whole one, then a piece
// whose size is not a multiple of 4 KiB (which goes through the page cache whatever the mode).
void write_and_check(bool bypass_page_cache) {
  testing::TempDir dir;
  const auto path = dir.path() / "shard.bin";
  std::ofstream(path).close();
  DirectWriter writer(path, 4, kChunk, bypass_page_cache);

  std::vector<std::byte> expected(9 * kChunk + 100, std::byte{0});
  std::vector<std::vector<std::byte>> chunks;
  for (int c = 0; c < 8; ++c) chunks.push_back(pattern(kChunk, c));
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int c = w; c < 8; c += 4) {
        writer.write(chunks[c].data(), kChunk, kChunk, static_cast<int64_t>(c * kChunk), w);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t c = 0; c < 8; ++c) std::copy(chunks[c].begin(), chunks[c].end(), expected.begin() + c * kChunk);

  const std::vector<std::byte> last = pattern(1000, 8);
  writer.write(last.data(), last.size(), kChunk, static_cast<int64_t>(8 * kChunk), 0);
  std::copy(last.begin(), last.end(), expected.begin() + 8 * kChunk);
  const std::vector<std::byte> odd = pattern(100, 9);
  writer.write(odd.data(), odd.size(), odd.size(), static_cast<int64_t>(9 * kChunk), 1);
  std::copy(odd.begin(), odd.end(), expected.begin() + 9 * kChunk);
  if (!bypass_page_cache) {
    EXPECT_FALSE(writer.direct());
  }
  writer.close();

  EXPECT_EQ(read_all(path), expected);
}

TEST(DirectWriter, ChunksLandWithDirectIoWhereTheFilesystemAllowsIt) {
  write_and_check(true);
}

TEST(DirectWriter, ChunksLandThroughThePageCacheWhenAskedTo) {
  write_and_check(false);
}

}  // namespace
}  // namespace shardkit
