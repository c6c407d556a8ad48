// What the weight-decay tests of both engines (tests/mpi, tests/cuda) check after one AdamW step with
// zero gradients from decay_test_value(): the tensors the model says decay moved by lr * weight_decay
// * w, the others not at all -- in a rank's master partition and in every tensor as the model reads it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckpt/layout.hpp"
#include "model/model.hpp"
#include "trainer/adamw.hpp"

namespace shardkit::testing {

// Non-zero values of both signs (a zero would hide whether it decayed), a function of the element.
inline float decay_test_value(int tensor, int64_t i) {
  const float magnitude = 0.5f + 0.01f * static_cast<float>((tensor * 7919 + i) % 101);
  return i % 2 ? -magnitude : magnitude;
}

// Initialises the engine's parameters with decay_test_value and takes one step with zero gradients (lr
// 0.1, weight_decay 0.5); returns the decay that applied to the decaying tensors (lr * weight_decay).
template <typename Engine>
float step_with_zero_gradients(Engine& engine) {
  engine.initialize([](int t, int64_t offset, std::span<float> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = decay_test_value(t, offset + static_cast<int64_t>(i));
  });
  engine.zero_grads();
  engine.reduce_grads();
  trainer::OptimizerStep step;
  step.lr = 0.1;
  step.weight_decay = 0.5;
  engine.step(step);
  return trainer::AdamWCoefficients::of(step).decay;
}

// The value after the step: decayed by `decay` (to 4 ulp: a GPU or a compiler may fuse the multiply
// and subtract), or untouched to the bit.
inline void expect_stepped(float got, float before, bool decays, float decay, const std::string& where) {
  if (decays) {
    ASSERT_NE(got, before) << where;
    ASSERT_FLOAT_EQ(got, before - decay * before) << where;
  } else {
    ASSERT_EQ(got, before) << where;
  }
}

// The rank's master partition: `master` is its flat buffer in the checkpoint layout. What decays is
// asked of the model itself, not of the flags the engine was given.
inline void expect_stepped_master(std::span<const float> master, const ckpt::Layout& layout, int rank,
                                  const model::Model& model, float decay, const std::string& where) {
  for (const ckpt::Fragment& f : layout.fragments(rank)) {
    for (int64_t i = 0; i < f.length; ++i) {
      expect_stepped(master[static_cast<size_t>(f.flat_offset + i)], decay_test_value(f.tensor, f.tensor_offset + i),
                     model.decays(f.tensor), decay,
                     where + "master " + model.table()[static_cast<size_t>(f.tensor)].name + "[" +
                         std::to_string(f.tensor_offset + i) + "]");
    }
  }
}

// Every tensor whole, as the model reads it after the step, group by group (gathered at stage 3):
// `read(t)` returns tensor t's values while its group is acquired.
template <typename Engine, typename Read>
void expect_stepped_parameters(Engine& engine, const model::Model& model, float decay, const std::string& where,
                               Read read) {
  const std::vector<model::TensorGroup>& groups = model.groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    engine.acquire(static_cast<int>(g));
    for (int t = groups[g].first; t < groups[g].last; ++t) {
      const std::vector<float> p = read(t);
      for (size_t i = 0; i < p.size(); ++i) {
        expect_stepped(
            p[i], decay_test_value(t, static_cast<int64_t>(i)), model.decays(t), decay,
            where + "parameter " + model.table()[static_cast<size_t>(t)].name + "[" + std::to_string(i) + "]");
      }
    }
    engine.release(static_cast<int>(g));
  }
}

}  // namespace shardkit::testing
