#include "trainer/dense_params.hpp"

#include <algorithm>

namespace shardkit::trainer {

DenseParams::DenseParams(const ckpt::TensorTable& table) {
  for (const auto& t : table) {
    params_.emplace_back(static_cast<size_t>(t.numel()), 0.0f);
    grads_.emplace_back(static_cast<size_t>(t.numel()), 0.0f);
  }
}

void DenseParams::zero_grads() {
  for (auto& g : grads_) std::fill(g.begin(), g.end(), 0.0f);
}

}  // namespace shardkit::trainer
