// `shardkit convert import`: Hugging Face weights of any family shardkit knows (safetensors file or
// folder, single or sharded, with the config.json that names the family) become a committed checkpoint
// at step 0 with zeroed Adam moments, laid out for any world size and ZeRO stage; `shardkit train
// --resume` fine-tunes from it.
#pragma once

#include <filesystem>

#include "convert/stream.hpp"

namespace shardkit::convert {

struct ImportRequest {
  std::filesystem::path weights;
  std::filesystem::path output;  // a new run directory
  int world_size = 1;
  int stage = 0;
};

// Returns the step directory written.
std::filesystem::path import_weights(const ImportRequest& request, const ConvertOptions& options);

}  // namespace shardkit::convert
