// `shardkit convert import`: Hugging Face weights of any family shardkit knows (safetensors file or
// folder, single or sharded, with the config.json that names the family) become a committed checkpoint
// at step 0 with zeroed Adam moments, laid out for any world size and ZeRO stage; `shardkit train
// --resume` fine-tunes from it.
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

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

// The trainer_state of weights imported to start from: no optimizer step taken, the scheduler before
// its first step (the loss scaler and the data order come from the training run's own config and seed).
nlohmann::json fresh_trainer_state(const std::filesystem::path& imported_from);

}  // namespace shardkit::convert
