// `shardkit convert import-deepspeed` and `import-dcp`: a DeepSpeed ZeRO checkpoint (stage 1, 2 or 3, or
// the universal checkpoint of ds_to_universal.py) or a PyTorch Distributed Checkpoint (FSDP2,
// torchtitan) becomes a committed shardkit checkpoint with the fp32 master weights, both Adam moments and
// the step counters, laid out for any world size and ZeRO stage, and what an export needs to give the
// run back (trainer_state "deepspeed": parameter groups, hyperparameters, tied names). The model may be
// a GPT-2 or Llama one (to train or evaluate it in shardkit) or any other (to reshard, consolidate and
// export it). No Python is run: the torch.save files are read by convert/torch/.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "convert/source.hpp"
#include "convert/stream.hpp"

namespace shardkit::convert {

struct CheckpointImportRequest {
  // DeepSpeed: the folder holding `latest`, or the tag folder. DCP: the folder holding `.metadata`.
  std::filesystem::path source;
  SourceFormat format = SourceFormat::kDeepSpeed;  // what `source` must be
  std::filesystem::path output;                    // a new run directory
  // A preset or model file. Empty: a Hugging Face config.json in `source` or the folder above it (where
  // Hugging Face's Trainer saves one) when a family computes its model_type; otherwise no model, and
  // the tensors are those the checkpoint names.
  std::string model;
  // Default: the source's data-parallel size (1 for a universal checkpoint; DCP: the ranks that wrote).
  std::optional<int> world_size;
  // Default: the source's stage (0 for a universal checkpoint; 3 for DCP, FSDP's full sharding).
  std::optional<int> stage;
};

struct CheckpointImportResult {
  std::filesystem::path step_dir;
  int world_size = 0;
  int stage = 0;
  int64_t step = 0;
};

CheckpointImportResult import_checkpoint(const CheckpointImportRequest& request, const ConvertOptions& options);

}  // namespace shardkit::convert
