// `shardkit convert export-deepspeed` (and `convert reshard --to deepspeed`): a checkpoint becomes what
// DeepSpeed's save_checkpoint writes for a run of `world_size` data-parallel ranks at a ZeRO stage, so
// that DeepSpeed's load_checkpoint on that many ranks resumes with the same fp32 master weights, Adam
// moments, step, counters, parameter groups and scheduler: `latest` and `global_step<N>/` with the
// model states (the 16-bit or fp32 module weights, param_shapes, counters) and every rank's optimizer
// states. The source is a shardkit checkpoint or a DeepSpeed checkpoint folder (any stage and world
// size, any model); values are streamed from it in pieces on several threads, so memory stays bounded
// whatever the model's size. The files are laid out by convert/deepspeed/ds_layout. A Hugging Face
// Trainer's `checkpoint-N/` folder (DeepSpeed's files beside trainer_state.json) comes out as such a
// folder: the Trainer's own files are copied beside the new DeepSpeed ones.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "ckpt/tensor_table.hpp"
#include "convert/stream.hpp"

namespace shardkit::convert {

struct DeepSpeedExportRequest {
  std::filesystem::path source;  // a shardkit checkpoint (run or step folder) or a DeepSpeed checkpoint folder
  std::filesystem::path output;  // a new folder: `latest` and `global_step<N>/`
  int world_size = 0;
  std::optional<int> stage;  // ZeRO stage 1-3; default: the source's (stage 0 sources: 1)
  // The module weights' type: the run's bf16 or fp16, or fp32. Default: what the source's config enables.
  std::optional<ckpt::DType> dtype;
  // Stage 3's sub-group size in elements; default: the source's config's, else DeepSpeed's 1e9.
  std::optional<int64_t> sub_group_size;
  // For a DeepSpeed source, as `import-deepspeed --model` (empty: the tensors the checkpoint names).
  std::string model;
  // Instead of a run's files, the universal layout of ds_to_universal (`latest_universal` and
  // global_step<N>_universal/ with zero/<parameter>/), for load_universal at any world size; stages 1
  // and 2 only (DeepSpeed's stage 3 reads another format, and only its first parameter group).
  bool universal = false;
};

struct DeepSpeedExportResult {
  std::filesystem::path tag_dir;
  int world_size = 0;
  int stage = 0;
  ckpt::DType dtype = ckpt::DType::kF32;
  int64_t step = 0;
};

DeepSpeedExportResult export_deepspeed(const DeepSpeedExportRequest& request, const ConvertOptions& options);

}  // namespace shardkit::convert
