// `shardkit convert import-deepspeed`: a DeepSpeed ZeRO checkpoint (stage 1, 2 or 3, or the universal
// checkpoint of ds_to_universal.py) becomes a committed shardkit checkpoint with the fp32 master
// weights, both Adam moments and the step counters, laid out for any world size and ZeRO stage, and
// what DeepSpeed needs back to resume from it (trainer_state "deepspeed"). The model may be a GPT-2 or
// Llama one (to train or evaluate it in shardkit) or any other (to reshard, consolidate and export it).
// No Python is run: the torch.save files are read by convert/deepspeed/.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "convert/stream.hpp"

namespace shardkit::convert {

struct DeepSpeedImportRequest {
  std::filesystem::path source;  // the folder holding `latest`, or the tag folder
  std::filesystem::path output;  // a new run directory
  // A preset or model file. Empty: the Hugging Face config.json that Hugging Face's Trainer saves
  // beside `latest` (in `source`, or in the folder above a tag folder) when a family computes its
  // model_type; otherwise no model, and the tensors are those the checkpoint names.
  std::string model;
  std::optional<int> world_size;  // default: the source's data-parallel size (1 for a universal checkpoint)
  std::optional<int> stage;       // default: the source's stage (0 for a universal checkpoint)
};

struct DeepSpeedImportResult {
  std::filesystem::path step_dir;
  int world_size = 0;
  int stage = 0;
  int64_t step = 0;
};

DeepSpeedImportResult import_deepspeed(const DeepSpeedImportRequest& request, const ConvertOptions& options);

}  // namespace shardkit::convert
