// Compiled without floating-point contraction (trainer/CMakeLists.txt): the normal draw must round
// each operation as the GPU's does.
#include "trainer/init.hpp"

#include "base/parallel_memory.hpp"
#include "base/xxh64.hpp"
#include "model/model.hpp"

namespace shardkit::trainer {

RandomInit::RandomInit(const model::Model& model, uint64_t random_seed) : seed(random_seed) {
  tensors.reserve(model.table().size());
  for (size_t t = 0; t < model.table().size(); ++t) {
    const model::InitRule rule = model.init_rule(static_cast<int>(t));
    const std::string& name = model.table()[t].name;
    tensors.push_back({rule.kind, rule.std, xxh64(name.data(), name.size())});
  }
}

void init_values(const RandomInit& init, int tensor, int64_t offset, std::span<float> out) {
  const InitDraw& draw = init.tensors.at(static_cast<size_t>(tensor));
  const auto n = static_cast<int64_t>(out.size());
  float* values = out.data();
  if (draw.kind != model::InitRule::kNormal) {
    parallel_fill(values, n, init_value(draw, init.seed, 0));
    return;
  }
  // Every element is a function of (seed, tensor, index) alone, so the threads split the range freely:
  // a multi-billion-parameter model initialises at the machine's speed, with the same bits.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) values[i] = init_value(draw, init.seed, static_cast<uint64_t>(offset + i));
}

}  // namespace shardkit::trainer
