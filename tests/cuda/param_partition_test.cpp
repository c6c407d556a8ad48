// ZeRO stage 3's parameter partition in host memory (offload_param cpu) against the same in device
// memory: store() lands every chunk of a partition of more than two chunks where it belongs, and
// on_device() brings up the slice asked for, across a chunk boundary. In a swap of bf16 (offload_param
// nvme) on_device() brings up the slices asked for, across the swap's chunks and through both
// page-locked buffers in turn, and refuses one larger than planned. Skipped (with a message) without a
// GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "model/cuda/cuda_common.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "tests/support/test_support.hpp"
#include "trainer/cuda/param_partition.hpp"

namespace shardkit::trainer::cuda {
namespace {

using namespace model::cuda;

using Bf16 = __nv_bfloat16;
using Partition = ParamPartition<Bf16>;
using Calls = std::vector<std::pair<int64_t, int64_t>>;  // (lo, n) of each producer call

// Two chunks and a bit of a pattern whose period (251 * 7) does not divide the chunk size: a chunk in
// the wrong place shows.
std::vector<Bf16> pattern() {
  std::vector<Bf16> values(static_cast<size_t>(2 * Partition::kChunk + 3));
  for (size_t i = 0; i < values.size(); ++i) values[i] = __float2bfloat16_rn(static_cast<float>(i % 251 + i % 7));
  return values;
}

bool same(const Bf16* a, const Bf16* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(Bf16)) == 0;
}

// Stores `values` into `partition` through a producer that copies them from device memory.
Calls store(Partition& partition, const std::vector<Bf16>& values, const Stream& stream) {
  const DeviceBuffer<Bf16> source(values.size());
  CUDA_CHECK(cudaMemcpy(source.data(), values.data(), values.size() * sizeof(Bf16), cudaMemcpyHostToDevice));
  Calls calls;
  partition.store(stream.get(), [&](int64_t lo, int64_t n, Bf16* out) {
    calls.emplace_back(lo, n);
    CUDA_CHECK(cudaMemcpyAsync(out, source.data() + lo, static_cast<size_t>(n) * sizeof(Bf16), cudaMemcpyDeviceToDevice,
                               stream.get()));
  });
  stream.synchronize();
  return calls;
}

// Elements [offset, offset + n) of a partition that keeps them away from the GPU, brought up into a
// staging buffer (which on_device() must return) and read back.
std::vector<Bf16> staged_slice(Partition& partition, int64_t offset, int64_t n, const Stream& stream) {
  DeviceBuffer<Bf16> staging(static_cast<size_t>(n));
  const Bf16* up = partition.on_device(offset, n, staging.data(), stream.get());
  EXPECT_EQ(up, staging.data());
  std::vector<Bf16> back(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpyAsync(back.data(), up, back.size() * sizeof(Bf16), cudaMemcpyDeviceToHost, stream.get()));
  stream.synchronize();
  return back;
}

TEST(ParamPartition, InHostMemoryStoresAndServesWhatDeviceMemoryDoes) {
  REQUIRE_GPUS(1);
  const std::vector<Bf16> values = pattern();
  const size_t count = values.size();
  const int64_t K = Partition::kChunk;
  const Stream stream;

  Partition host(count, ParamHome::kHost);
  ASSERT_TRUE(host.on_host());
  EXPECT_EQ(host.device_bytes(), 0);
  EXPECT_EQ(host.host_bytes(), static_cast<int64_t>(count * sizeof(Bf16)));
  EXPECT_EQ(store(host, values, stream), (Calls{{0, K}, {K, K}, {2 * K, 3}}));
  EXPECT_TRUE(same(host.data(), values.data(), count)) << "a chunk landed in the wrong place";
  // A slice across the first chunk boundary comes up into the staging buffer.
  const int64_t offset = K - 5, n = 10;
  const std::vector<Bf16> back = staged_slice(host, offset, n, stream);
  EXPECT_TRUE(same(back.data(), values.data() + offset, back.size()));

  // In device memory: one producer call straight into the partition, slices served in place.
  Partition device(count, ParamHome::kDevice);
  ASSERT_FALSE(device.on_host());
  EXPECT_EQ(device.host_bytes(), 0);
  EXPECT_EQ(store(device, values, stream), (Calls{{0, static_cast<int64_t>(count)}}));
  DeviceBuffer<Bf16> staging(static_cast<size_t>(n));
  EXPECT_EQ(device.on_device(offset, n, staging.data(), stream.get()), device.data() + offset);
  std::vector<Bf16> stored(count);
  CUDA_CHECK(cudaMemcpy(stored.data(), device.data(), count * sizeof(Bf16), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(same(stored.data(), values.data(), count));
}

TEST(ParamPartition, InASwapServesTheSlicesAskedFor) {
  REQUIRE_GPUS(1);
#if !SHARDKIT_HAVE_LIBURING
  GTEST_SKIP() << "built without liburing: no NVMe offload";
#endif
  constexpr int64_t kCount = 100'003;
  testing::TempDir dir;
  nvme::SwapOptions o;
  o.dir = dir.path();
  o.chunk_bytes = 16384;  // 4096 elements a chunk: the slices below cross chunks
  const auto ignore = [](const std::string&) {};
  // A swap of fp32 cannot hold a partition in bf16.
  EXPECT_THROW(Partition(kCount, ParamHome::kSwap,
                         std::make_unique<nvme::StateSwapper>(o, "fp32.swap", kCount, 1, "parameters", ignore), 100),
               Error);
  auto swap = std::make_unique<nvme::StateSwapper>(o, "params.swap", kCount, 1, "parameters", ignore, 2);
  const auto value = [](int64_t i) {
    return __float2bfloat16_rn(0.1f * std::sin(0.37f * static_cast<float>(i)) + 1e-4f);
  };
  swap->visit(nvme::StateSwapper::Access::kWrite, [&](const nvme::StateSwapper::Chunk& chunk) {
    for (size_t i = 0; i < chunk.bits16[0].size(); ++i) {
      const Bf16 v = value(chunk.offset + static_cast<int64_t>(i));
      std::memcpy(&chunk.bits16[0][i], &v, sizeof(v));
    }
  });
  Partition part(kCount, ParamHome::kSwap, std::move(swap), 20000);
  EXPECT_EQ(part.data(), nullptr);
  EXPECT_EQ(part.device_bytes() + part.host_bytes(), 0);
  EXPECT_GE(part.nvme_bytes(), kCount * 2);
  EXPECT_LT(part.nvme_bytes(), kCount * 2 + 16384);
  const Stream stream;
  // Three slices in a row (both page-locked buffers, the first again), the last to the very end.
  const std::pair<int64_t, int64_t> slices[] = {{4090, 9000}, {1, 3}, {kCount - 20000, 20000}};
  for (const auto& [offset, n] : slices) {
    const std::vector<Bf16> back = staged_slice(part, offset, n, stream);
    std::vector<Bf16> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = value(offset + i);
    EXPECT_TRUE(same(back.data(), want.data(), want.size())) << "slice at " << offset << " of " << n;
  }
  // A slice larger than the partition was built for overruns no buffer.
  DeviceBuffer<Bf16> staging(30000);
  EXPECT_THROW(part.on_device(0, 30000, staging.data(), stream.get()), Error);
  // The host optimizer writes the swap: a device producer has nothing to write.
  EXPECT_THROW(part.store(stream.get(), [](int64_t, int64_t, Bf16*) {}), Error);
}

}  // namespace
}  // namespace shardkit::trainer::cuda
