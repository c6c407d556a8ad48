// Initial values drawn on the GPU are the bits the host draws, for every tensor of a model and at
// element indices past 2^32 (a multi-billion-parameter tensor's tail). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model/cuda/cuda_common.hpp"
#include "model/registry.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "trainer/cuda/random_init.hpp"
#include "trainer/init.hpp"

namespace shardkit::trainer::cuda {
namespace {

using namespace model::cuda;

// Elements [offset, offset + n) of tensor `tensor`, drawn on the device and on the host.
void expect_same_bits(const RandomInit& init, int tensor, int64_t offset, size_t n) {
  DeviceBuffer<float> device(n);
  draw_init_values(device.data(), static_cast<int64_t>(n), init.tensors.at(static_cast<size_t>(tensor)), init.seed,
                   offset, nullptr);
  std::vector<float> from_device(n), from_host(n);
  CUDA_CHECK(cudaMemcpy(from_device.data(), device.data(), device.bytes(), cudaMemcpyDeviceToHost));
  init_values(init, tensor, offset, from_host);
  size_t differing = 0;
  for (size_t i = 0; i < n; ++i) differing += std::memcmp(&from_device[i], &from_host[i], sizeof(float)) != 0;
  EXPECT_EQ(differing, 0u) << "tensor " << tensor << ", elements from " << offset << ": first of them "
                           << from_device[0] << " on the device, " << from_host[0] << " on the host";
}

TEST(RandomInitCuda, EveryTensorOfAModelIsTheHostsBits) {
  REQUIRE_GPUS(1);
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    const auto model = model::resolve_model(name);
    const RandomInit init(*model, 1234);
    for (size_t t = 0; t < model->table().size(); ++t) {
      expect_same_bits(init, static_cast<int>(t), 0, static_cast<size_t>(model->table()[t].numel()));
    }
  }
}

TEST(RandomInitCuda, ElementsPastTwoToTheThirtyTwoAreTheHostsBits) {
  REQUIRE_GPUS(1);
  const auto model = model::resolve_model("gpt2-tiny");
  RandomInit init(*model, 7);
  init.tensors[0] = {model::InitRule::kNormal, 0.02f, 0x5eed};
  // 32 M elements: every path of the logarithm and cosine is taken many times over.
  expect_same_bits(init, 0, (int64_t{1} << 32) - (int64_t{16} << 20), size_t{32} << 20);
  expect_same_bits(init, 0, int64_t{6'700'000'000}, size_t{1} << 20);
}

}  // namespace
}  // namespace shardkit::trainer::cuda
