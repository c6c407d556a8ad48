// Compares two checkpoints tensor by tensor and state by state, whatever their world sizes and
// stages: the test that a reshard or a resume kept every number.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.hpp"

namespace shardkit::ckpt {

struct StateDiff {
  std::string tensor;
  std::string state;
  int64_t numel = 0;
  double max_abs_diff = 0;  // NaN against a number counts as infinity; NaN against NaN as equal
  int64_t differing = 0;    // elements whose bits differ
};

struct DiffReport {
  std::vector<StateDiff> entries;      // tensors of equal shape present in both, states in both
  std::vector<std::string> only_in_a;  // tensors (or "state:<name>") missing from B
  std::vector<std::string> only_in_b;
  std::vector<std::string> shape_mismatch;
  double max_abs_diff() const noexcept;
  // True when both hold the same tensors and states and no difference exceeds `tolerance`.
  bool within(double tolerance) const noexcept;
};

// Streams both checkpoints in pieces of at most `piece_elems` elements.
DiffReport diff_checkpoints(CheckpointReader& a, CheckpointReader& b, const ProgressFn& progress = {},
                            int64_t piece_elems = int64_t{1} << 20);

}  // namespace shardkit::ckpt
