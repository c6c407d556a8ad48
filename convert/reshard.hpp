// `shardkit convert reshard`: rewrites a checkpoint for another world size and/or ZeRO stage, weights,
// Adam moments and trainer state bit for bit, streaming in bounded pieces.
#pragma once

#include <filesystem>
#include <optional>

#include "convert/stream.hpp"

namespace shardkit::convert {

struct ReshardRequest {
  std::filesystem::path source;  // step or run directory
  std::filesystem::path output;  // a new run directory: OUTPUT/step-N/ and OUTPUT/latest
  int world_size = 1;
  std::optional<int> stage;              // default: the source's stage
  std::optional<int> compression_level;  // default: the source's
};

// Returns the step directory written.
std::filesystem::path reshard(const ReshardRequest& request, const ConvertOptions& options);

}  // namespace shardkit::convert
