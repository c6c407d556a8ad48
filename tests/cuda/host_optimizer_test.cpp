// The offloaded optimizer gives the bits of one cpu_adamw over the whole arrays wherever its states
// live -- host memory, or an NVMe swap file whose chunks straddle the transfer ring's slots -- and
// wherever the weights it writes live (device memory through the ring, host memory directly, or a
// weight swap of bf16): the master weights, both moments and the weights in bf16, after
// three steps with weight decay skipped on some ranges. The ring has more chunks than slots, so every
// slot is reused. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <vector>

#include "model/cuda/device_type.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "tests/support/test_support.hpp"
#include "trainer/cuda/host_optimizer.hpp"
#include "trainer/cuda/optimizer_kernels.hpp"

namespace shardkit::trainer::cuda {
namespace {

using namespace model::cuda;

using T = __nv_bfloat16;

constexpr size_t kCount = 100'003;          // not a multiple of anything below
constexpr int64_t kRingChunk = 4096;        // 25 ring chunks through 4 slots
constexpr int64_t kSwapChunkBytes = 24576;  // 6144 elements: swap chunks straddle ring chunks

float initial(size_t i) {
  return 0.1f * std::sin(0.37f * static_cast<float>(i));
}
float gradient(int step, size_t i) {
  return 0.01f * std::cos(0.11f * static_cast<float>(i) + static_cast<float>(step));
}

OptimizerStep step_of(int step) {
  OptimizerStep s;
  s.lr = 1e-3;
  s.weight_decay = 0.1;
  s.step = step;
  return s;
}

const std::vector<ElementRange> kNoDecay = {{100, 5000}, {40000, 40001}, {99000, 100003}};

struct States {
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<uint16_t> weights;  // bf16 bit patterns
};

States reference() {
  States r{std::vector<float>(kCount), std::vector<float>(kCount, 0.0f), std::vector<float>(kCount, 0.0f),
           std::vector<uint16_t>(kCount)};
  for (size_t i = 0; i < kCount; ++i) r.master[i] = initial(i);
  std::vector<float> g(kCount);
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < kCount; ++i) g[i] = gradient(step, i);
    cpu_adamw(r.master, r.exp_avg, r.exp_avg_sq, g, AdamWCoefficients::of(step_of(step)),
              {kNoDecay.data(), static_cast<int64_t>(kNoDecay.size())}, ckpt::DType::kBF16, r.weights.data());
  }
  return r;
}

template <typename V>
size_t differing(const std::vector<V>& a, const std::vector<V>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(V)) != 0;
  return n;
}

std::unique_ptr<nvme::StateSwapper> make_swap(const testing::TempDir& dir, const std::string& name, int states,
                                              int element_bytes) {
  nvme::SwapOptions o;
  o.dir = dir.path();
  o.chunk_bytes = kSwapChunkBytes;
  return std::make_unique<nvme::StateSwapper>(
      o, name, static_cast<int64_t>(kCount), states, name, [](const std::string&) {}, element_bytes);
}

const char* name_of(ParamHome home) {
  return home == ParamHome::kDevice ? "device" : home == ParamHome::kHost ? "host" : "swap";
}

States run(bool swapped, ParamHome home, const testing::TempDir& dir) {
  const std::string name = name_of(home);
  std::unique_ptr<nvme::StateSwapper> swap = swapped ? make_swap(dir, name + ".states", 3, 4) : nullptr;
  std::unique_ptr<nvme::StateSwapper> weight_swap =
      home == ParamHome::kSwap ? make_swap(dir, name + ".weights", 1, sizeof(T)) : nullptr;
  HostOptimizer<T> opt(kCount, adamw_optimizer(), home, std::move(swap), weight_swap.get(), kRingChunk);
  opt.fill([](int64_t lo, std::span<const std::span<float>> states) {
    for (size_t i = 0; i < states[0].size(); ++i) states[0][i] = initial(static_cast<size_t>(lo) + i);
  });
  Stream stream;
  DeviceBuffer<T> device_params(home == ParamHome::kDevice ? kCount : 0);
  PinnedBuffer<T> host_params(home == ParamHome::kHost ? kCount : 0);
  T* params = home == ParamHome::kDevice ? device_params.data() : host_params.data();
  opt.upload(params, stream.get());
  DeviceBuffer<float> grads(kCount);
  std::vector<float> g(kCount);
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < kCount; ++i) g[i] = gradient(step, i);
    CUDA_CHECK(cudaMemcpyAsync(grads.data(), g.data(), grads.bytes(), cudaMemcpyHostToDevice, stream.get()));
    opt.step(grads.data(), params, step_of(step), {kNoDecay.data(), static_cast<int64_t>(kNoDecay.size())},
             stream.get());
  }
  CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  States out;
  std::vector<float>* states[] = {&out.master, &out.exp_avg, &out.exp_avg_sq};
  for (int s = 0; s < 3; ++s) {
    opt.read(s, 0, static_cast<int64_t>(kCount),
             [&](std::span<const float> piece) { states[s]->insert(states[s]->end(), piece.begin(), piece.end()); });
  }
  if (weight_swap) {
    weight_swap->visit(nvme::StateSwapper::Access::kRead, [&](const nvme::StateSwapper::Chunk& chunk) {
      out.weights.insert(out.weights.end(), chunk.bits16[0].begin(), chunk.bits16[0].end());
    });
  } else {
    out.weights.resize(kCount);
    CUDA_CHECK(cudaMemcpy(out.weights.data(), params, kCount * sizeof(T), cudaMemcpyDefault));
  }
  return out;
}

TEST(HostOptimizerCuda, StatesAndWeightsAreOneUpdatesBitsWhereverTheyLive) {
  REQUIRE_GPUS(1);
  const States want = reference();
  testing::TempDir dir;
  for (const bool swapped : {false, true}) {
    if (swapped && !SHARDKIT_HAVE_LIBURING) {
      std::cout << "built without liburing: the swapped states are not tested\n";
      continue;
    }
    for (const ParamHome home : {ParamHome::kDevice, ParamHome::kHost, ParamHome::kSwap}) {
      if (home == ParamHome::kSwap && !SHARDKIT_HAVE_LIBURING) continue;
      SCOPED_TRACE(std::string(swapped ? "swapped" : "host memory") + ", weights in " + name_of(home));
      const States got = run(swapped, home, dir);
      EXPECT_EQ(differing(got.master, want.master), 0u);
      EXPECT_EQ(differing(got.exp_avg, want.exp_avg), 0u);
      EXPECT_EQ(differing(got.exp_avg_sq, want.exp_avg_sq), 0u);
      EXPECT_EQ(differing(got.weights, want.weights), 0u);
    }
  }
}

// What the ring page-locks does not grow with the model: four slots of 64 MiB of gradients and, with
// the weights on the device, 32 MiB of bf16 weights each.
TEST(HostOptimizerCuda, ThePageLockedRingIsBoundedWhateverTheModelSize) {
  EXPECT_EQ(HostOptimizer<T>::pinned_bytes(size_t{7} << 30, ParamHome::kDevice), int64_t{4} * (64 + 32) << 20);
  EXPECT_EQ(HostOptimizer<T>::pinned_bytes(size_t{7} << 30, ParamHome::kHost), int64_t{4} * 64 << 20);
  EXPECT_EQ(HostOptimizer<T>::pinned_bytes(size_t{7} << 30, ParamHome::kSwap), int64_t{4} * 64 << 20);
  EXPECT_EQ(HostOptimizer<T>::pinned_bytes(1000, ParamHome::kDevice), 1000 * 6);  // one slot as large as the states
}

}  // namespace
}  // namespace shardkit::trainer::cuda
