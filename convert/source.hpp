// A checkpoint to convert from, whatever wrote it: a shardkit checkpoint (run or step folder), a
// DeepSpeed ZeRO checkpoint folder or a PyTorch Distributed Checkpoint (DCP) folder. Any way the converters see one
// tensor table, the training counters, the run's config and a reader of the fp32 master weights and both Adam moments,
// so every output (a shardkit checkpoint, DeepSpeed's files, consolidated weights) is one pass from any source.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/tensor_table.hpp"
#include "convert/deepspeed/ds_run.hpp"
#include "convert/stream.hpp"

namespace shardkit::convert {

// The states a source reads, by index: what every checkpoint shardkit converts holds.
inline constexpr int kSourceFp32 = 0, kSourceExpAvg = 1, kSourceExpAvgSq = 2;

enum class SourceFormat { kShardkit, kDeepSpeed, kDcp };

struct CheckpointSource {
  std::filesystem::path path;  // the step, tag or DCP folder read
  SourceFormat format = SourceFormat::kShardkit;
  const ckpt::TensorTable* table = nullptr;
  nlohmann::json trainer_state;  // step, consumed_samples, skipped_steps, optimizer_steps, lr_scheduler...
  nlohmann::json config;         // the run's DeepSpeed config, or null
  // As a manifest records it: a family's model, or {"family": "external", "hf_config": ...}.
  nlohmann::json model;
  int world_size = 0;
  int stage = 0;
  int64_t chunk_elems = 0;  // a shardkit source's chunk size: its readers hold chunk buffers
  bool has_moments = true;  // false: the source holds the master weights only (reading a moment fails)
  // The states it holds by their checkpoint names, the master weights first: AdamW's three, or the master
  // weights alone (has_moments false); a run of another optimizer holds its own (Lion, shardkit's or
  // DeepSpeed's: fp32, exp_avg), which an import, a shardkit-to-shardkit reshard and the weights'
  // exports carry.
  std::vector<std::string> states;
  // What a DeepSpeed run needs back, where the source records it (nullopt: `run_missing` says why).
  std::optional<deepspeed::DeepSpeedRun> run;
  std::string run_missing;
  // A reader of state kSourceFp32 / kSourceExpAvg / kSourceExpAvgSq for one thread.
  std::function<StateReadFn()> reader;
  // Keeps what `table` and the readers refer to alive.
  std::shared_ptr<const void> keep;
};

// Whether `path` is a DeepSpeed checkpoint folder (a folder whose `latest` or `latest_universal` names a
// tag folder of DeepSpeed's files, or such a tag folder) rather than a shardkit checkpoint.
bool is_deepspeed_checkpoint(const std::filesystem::path& path);

// Whether `path` is a PyTorch DCP checkpoint folder (it holds `.metadata`).
bool is_dcp_checkpoint(const std::filesystem::path& path);

// Opens any of the three. `model` (a preset or model file) applies to a DeepSpeed or DCP source: its
// tensors are checked against that model's table. Without it, a Hugging Face config.json beside the
// checkpoint (Hugging Face's Trainer keeps one beside `latest`) names the model when a family computes
// its model_type; otherwise the table is the parameters the checkpoint names. Error(kInvalidInput) naming the file
// otherwise.
CheckpointSource open_checkpoint_source(const std::filesystem::path& path, const std::string& model = {});
// A DeepSpeed checkpoint folder only (its reader's errors say what is missing).
CheckpointSource open_deepspeed_source(const std::filesystem::path& path, const std::string& model = {});
// A DCP checkpoint folder only. `model` as for DeepSpeed; a config.json beside the folder names it too.
CheckpointSource open_dcp_source(const std::filesystem::path& path, const std::string& model = {});

// Whether the source holds Lion's states (fp32, exp_avg): DeepSpeed's files and the consolidated
// exports take them as they take AdamW's.
bool holds_lion_states(const CheckpointSource& source);

// Error(kInvalidInput) naming the source and its states unless it holds AdamW's states or the master
// weights alone: what `target` (DeepSpeed's or DCP's files, the Adam moments of a consolidation) takes.
void require_adamw_or_weights(const CheckpointSource& source, const std::string& target);

// The optimizer's parameter groups, hyperparameters, tied names and scheduler state an export writes
// back: as an import recorded them, or, for a run shardkit trained, the two groups Hugging Face's
// Trainer makes with the settings of its config. Error(kInvalidInput) when the source has neither.
deepspeed::DeepSpeedRun optimizer_run(const CheckpointSource& source);

}  // namespace shardkit::convert
