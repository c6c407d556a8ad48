// A ParameterStore holding every tensor whole, for single-process evaluation and tests: no
// partitioning, gradients accumulated in place.
#pragma once

#include <vector>

#include "ckpt/tensor_table.hpp"
#include "model/param_store.hpp"

namespace shardkit::trainer {

class DenseParams final : public model::ParameterStore {
 public:
  explicit DenseParams(const ckpt::TensorTable& table);

  void acquire(int) override {}
  void release(int) override {}
  const float* param(int tensor) const override { return params_[static_cast<size_t>(tensor)].data(); }
  void open_grads(int) override {}
  float* grad(int tensor) override { return grads_[static_cast<size_t>(tensor)].data(); }
  void close_grads(int) override {}

  std::vector<float>& values(int tensor) { return params_[static_cast<size_t>(tensor)]; }
  const std::vector<float>& gradient(int tensor) const { return grads_[static_cast<size_t>(tensor)]; }
  void zero_grads();

 private:
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
};

}  // namespace shardkit::trainer
