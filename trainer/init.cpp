#include "trainer/init.hpp"

#include <algorithm>

#include "ckpt/checksum.hpp"
#include "trainer/data.hpp"

namespace shardkit::trainer {

void init_values(const model::Model& model, int tensor, uint64_t seed, int64_t offset, std::span<float> out) {
  const model::InitRule rule = model.init_rule(tensor);
  if (rule.kind != model::InitRule::kNormal) {
    std::fill(out.begin(), out.end(), rule.kind == model::InitRule::kOnes ? 1.0f : 0.0f);
    return;
  }
  const std::string& name = model.table()[static_cast<size_t>(tensor)].name;
  const uint64_t stream = ckpt::xxh64(name.data(), name.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = rule.std * Philox::normal(seed, static_cast<uint64_t>(offset) + i, stream);
  }
}

}  // namespace shardkit::trainer
