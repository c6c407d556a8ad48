#include "trainer/init.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "ckpt/checksum.hpp"
#include "trainer/data.hpp"

namespace shardkit::trainer {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

void init_gpt2_values(const model::GptConfig& config, const ckpt::TensorInfo& tensor, uint64_t seed, int64_t offset,
                      std::span<float> out) {
  const std::string_view name = tensor.name;
  if (ends_with(name, ".bias")) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  if (name.find(".ln_") != std::string_view::npos) {
    std::fill(out.begin(), out.end(), 1.0f);
    return;
  }
  const float std =
      ends_with(name, "c_proj.weight") ? 0.02f / std::sqrt(2.0f * static_cast<float>(config.n_layer)) : 0.02f;
  const uint64_t stream = ckpt::xxh64(tensor.name.data(), tensor.name.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = std * Philox::normal(seed, static_cast<uint64_t>(offset) + i, stream);
  }
}

}  // namespace shardkit::trainer
