// Run directories: a folder of step directories and the `latest` pointer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/manifest.hpp"

namespace shardkit::ckpt {

// The checkpoint named by `run_dir`/latest, if the file exists. Error(kCorrupt) when it does not hold
// a plain step directory name.
std::optional<std::string> read_latest(const std::filesystem::path& run_dir);

// Turns a user's CKPT argument into a step directory: a directory with manifest.json is one; a
// directory with `latest` is a run directory and `latest` is followed. Error(kInvalidInput) with a
// hint otherwise.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

struct CheckpointListing {
  std::string name;  // step directory name
  int64_t step = 0;
  bool committed = false;  // manifest present and valid
  bool latest = false;     // `latest` names it
  std::string problem;     // why it is not committed
  std::optional<Manifest> manifest;
};

// Every step directory of `run_dir`, by step.
std::vector<CheckpointListing> list_checkpoints(const std::filesystem::path& run_dir);

}  // namespace shardkit::ckpt
