#include "trainer/init.hpp"

#include "base/xxh64.hpp"
#include "model/cpu/ops.hpp"
#include "trainer/data.hpp"

namespace shardkit::trainer {

void init_values(const model::Model& model, int tensor, uint64_t seed, int64_t offset, std::span<float> out) {
  const model::InitRule rule = model.init_rule(tensor);
  const auto n = static_cast<int64_t>(out.size());
  float* values = out.data();
  // Every element is a function of (seed, tensor, index) alone, so the threads split the range freely:
  // a multi-billion-parameter model initialises at the machine's speed, with the same bits.
  if (rule.kind != model::InitRule::kNormal) {
    model::cpu::fill(values, n, rule.kind == model::InitRule::kOnes ? 1.0f : 0.0f);
    return;
  }
  const std::string& name = model.table()[static_cast<size_t>(tensor)].name;
  const uint64_t stream = xxh64(name.data(), name.size());
  const float std = rule.std;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    values[i] = std * Philox::normal(seed, static_cast<uint64_t>(offset + i), stream);
  }
}

}  // namespace shardkit::trainer
