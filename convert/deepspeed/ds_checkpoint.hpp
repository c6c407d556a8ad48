// A DeepSpeed ZeRO checkpoint as a source of full tensors: the fp32 master weights and the optimizer's
// moments of every parameter (Adam's and AdamW's exp_avg and exp_avg_sq, or Lion's exp_avg alone),
// read piece by piece out of the ranks' files, the training counters, and what the
// run needs back to resume (its parameter groups, tied parameters, scheduler and config). The tensors
// are those of a model shardkit knows (checked against its table) or, without one, whatever the files'
// `param_shapes` name: resharding needs only names, shapes and the layout. Three layouts
// (docs/DEEPSPEED.md describes them):
//   * ZeRO stage 1/2: mp_rank_00_model_states.pt (parameter names and shapes per param group, in flat
//     order) and one [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt per data-parallel rank (the rank's
//     slice of each group's flat fp32 buffer and of the moments);
//   * ZeRO stage 3: zero_pp_rank_R_mp_rank_00_model_states.pt and ..._optim_states.pt per rank (each
//     parameter split into ceil(n / W) elements per rank, padded, concatenated per sub-group);
//   * the universal checkpoint of ds_to_universal.py: zero/<parameter>/{fp32,exp_avg[,exp_avg_sq],step}.pt.
// The folder given may hold `latest` (or `latest_universal`), which names the tag folder, or be the tag
// folder itself.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/tensor_table.hpp"
#include "convert/deepspeed/ds_run.hpp"
#include "convert/torch/torch_file.hpp"
#include "model/model.hpp"

namespace shardkit::convert::deepspeed {

enum class SourceLayout { kZero12, kZero3, kUniversal };

// The optimizer moments a checkpoint may hold, by the optimizer's state keys: Adam's and AdamW's, and
// Lion's (DeepSpeed's FusedLion and DeepSpeedCPULion keep exp_avg alone).
inline const std::vector<std::string> kAdamMoments = {"exp_avg", "exp_avg_sq"};
inline const std::vector<std::string> kLionMoments = {"exp_avg"};

class DeepSpeedCheckpoint {
 public:
  // Finds the files, runs every pickle, and maps every tensor of the table to the pieces of the files
  // that hold it, checking names, shapes, world sizes, partition sizes and padding against each other.
  // The table is `model`'s or, when `model` is null, the parameters `param_shapes` names, in its order.
  // Error(kInvalidInput) naming the file and what was expected otherwise.
  DeepSpeedCheckpoint(const std::filesystem::path& path, std::shared_ptr<const model::Model> model);

  const ckpt::TensorTable& table() const noexcept { return *table_; }
  // The run's parameter groups, tied parameters and scheduler state, in the table's names; nullopt
  // (with the reason in run_missing()) where the files do not keep them (a universal checkpoint) or keep
  // values that cannot be carried over.
  const std::optional<DeepSpeedRun>& run() const noexcept { return run_; }
  const std::string& run_missing() const noexcept { return run_missing_; }
  // The config the run was saved with (`ds_config` of the model states), or null.
  const nlohmann::json& ds_config() const noexcept { return ds_config_; }

  const std::filesystem::path& folder() const noexcept { return folder_; }
  SourceLayout layout() const noexcept { return layout_; }
  // The data-parallel world size and ZeRO stage it was saved with (a universal checkpoint: 0 and 0).
  int world_size() const noexcept { return world_size_; }
  int stage() const noexcept { return stage_; }
  // Counters for the manifest's trainer_state: step, consumed_samples, skipped_steps, optimizer_steps,
  // lr_scheduler.last_batch_iteration.
  const nlohmann::json& trainer_state() const noexcept { return trainer_state_; }

  // The optimizer moments the checkpoint holds (kAdamMoments or kLionMoments): states 1.. of read().
  const std::vector<std::string>& moments() const noexcept { return moments_; }

  // Elements [offset, offset + out.size()) of table tensor `tensor`, state `state` (0: the fp32 master
  // weights, then moments() in order). Thread-safe.
  void read(int state, int tensor, int64_t offset, std::span<float> out) const;

 private:
  // A run of a tensor's elements held contiguously by one tensor of one file.
  struct Piece {
    int64_t begin = 0;  // first element of the table tensor
    int64_t length = 0;
    const torch::TorchFile* file = nullptr;
    const torch::TensorRef* source = nullptr;
    int64_t source_offset = 0;  // element of `source`
    std::string what;           // for messages
  };

  void locate_folder(const std::filesystem::path& path);
  // Error(kInvalidInput) when `entry` leads out of the folder the user named through a symbolic link.
  void require_inside(const std::filesystem::path& entry) const;
  void open_zero();
  void open_universal();
  void map_zero12(const std::vector<const torch::Value*>& states, const torch::Value& param_shapes);
  void map_zero3(const std::vector<const torch::Value*>& states, const torch::Value& param_shapes);
  void read_counters(const torch::Value* model_states, const std::string& where, std::optional<int64_t> optimizer_step);
  // The table of a checkpoint of no known model: every parameter of param_shapes' groups, in order.
  void table_from_shapes(const torch::Value& param_shapes, const std::string& where);
  // The groups and hyperparameters of rank 0's optimizer state, the tied parameters and the scheduler.
  void read_run(const torch::Value& model_states, const torch::Value& param_shapes, const torch::Value& optimizer_state,
                const std::string& where);
  // Index of the table tensor a DeepSpeed parameter name stands for; its shape must be `shape`.
  int parameter(const std::string& name, const std::vector<int64_t>& shape, const std::string& where);
  // The moments one group state dict (`what` of file `where`) holds; the first one sets moments(),
  // every later one must hold the same.
  void take_moments(const torch::Value& group_state, const std::string& where, const std::string& what);
  void add(int state, int tensor, Piece piece);
  void check_complete() const;

  std::shared_ptr<const model::Model> model_;
  ckpt::TensorTable own_table_;  // without a model
  const ckpt::TensorTable* table_ = nullptr;
  std::optional<DeepSpeedRun> run_;
  std::string run_missing_;
  nlohmann::json ds_config_;
  std::filesystem::path root_;  // the folder the user named: nothing is read outside it
  std::filesystem::path folder_;
  SourceLayout layout_ = SourceLayout::kZero12;
  int world_size_ = 0;
  int stage_ = 0;
  nlohmann::json trainer_state_;
  torch::ParseBudget parse_budget_;  // the memory all files' pickles may take together
  std::vector<std::unique_ptr<torch::TorchFile>> files_;
  std::vector<std::string> moments_;
  std::vector<std::vector<std::vector<Piece>>> pieces_;  // per table tensor and state, by begin
  std::vector<std::string> seen_as_;                     // the name each tensor was found under
  std::unordered_map<std::string, int> by_source_name_;  // and the reverse
};

}  // namespace shardkit::convert::deepspeed
