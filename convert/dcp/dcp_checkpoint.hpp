// A PyTorch Distributed Checkpoint (DCP) folder as a source of full tensors: the weights and, where the
// state dict has them, AdamW's two moments and step of every parameter, read piece by piece out of the
// chunks the ranks saved, without Python. docs/FORMAT-DCP.md describes the layout.
//
// Two key layouts are recognised (the ones torchtitan and torch.distributed.checkpoint.state_dict's
// get_state_dict produce):
//   * {"model": ..., "optim": ...}: `model.<fqn>`, `optim.state.<fqn>.{exp_avg,exp_avg_sq,step}`,
//     `optim.param_groups.<i>.<field>`;
//   * torchtitan's: the model's `<fqn>` at the top level, `optimizer.state.<fqn>...`,
//     `optimizer.param_groups...`, `train_state.step`;
// and a checkpoint of weights alone in either. Parameters are the model entries with optimizer state;
// a model entry without any, equal to a parameter, is that parameter tied under a second name (GPT-2's
// lm_head). The table is that of a model shardkit knows (its Hugging Face names are the entries') or,
// without one, the entries themselves.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/tensor_table.hpp"
#include "convert/dcp/dcp_metadata.hpp"
#include "convert/deepspeed/ds_run.hpp"
#include "convert/torch/torch_file.hpp"
#include "model/model.hpp"

namespace shardkit::convert::dcp {

class DcpCheckpoint {
 public:
  // Reads the metadata, opens every chunk the table needs (checking its element type, shape and
  // storage) and the counters and parameter groups. Error(kInvalidInput) naming the file otherwise.
  DcpCheckpoint(const std::filesystem::path& folder, std::shared_ptr<const model::Model> model);

  const ckpt::TensorTable& table() const noexcept { return *table_; }
  const std::filesystem::path& folder() const noexcept { return folder_; }
  // "get_state_dict" or "torchtitan": which key layout the state dict had.
  const std::string& key_layout() const noexcept { return layout_name_; }
  // The number of ranks that wrote files (the distinct .distcp files).
  int world_size() const noexcept { return world_size_; }
  // Whether the state dict holds AdamW's moments for every parameter.
  bool has_moments() const noexcept { return has_moments_; }
  // step, optimizer_steps, consumed_samples, lr_scheduler.last_batch_iteration, imported_from.
  const nlohmann::json& trainer_state() const noexcept { return trainer_state_; }
  // The optimizer's parameter groups (table names) and hyperparameters, and the tied names.
  const std::optional<deepspeed::DeepSpeedRun>& run() const noexcept { return run_; }
  const std::string& run_missing() const noexcept { return run_missing_; }

  // Elements [offset, offset + out.size()) of table tensor `tensor`, state `state` (0: the weights,
  // 1: exp_avg, 2: exp_avg_sq) as fp32. Thread-safe.
  void read(int state, int tensor, int64_t offset, std::span<float> out) const;

 private:
  static constexpr int kStates = 3;
  // One chunk of one item, opened.
  struct Piece {
    const Chunk* chunk = nullptr;
    size_t full_from = 0;  // the dimensions after this one are whole in the chunk: runs span them
    std::unique_ptr<torch::TorchFile> file;
  };
  struct Source {
    const Item* item = nullptr;
    std::vector<Piece> pieces;
  };

  void find_layout();
  void build_table();
  Source open_item(const Item& item);
  // Whether two sources hold the same values (a tied name).
  bool same_values(const Source& a, const Source& b) const;
  void read_source(const Source& source, int64_t offset, std::span<float> out) const;
  // The Python value of a bytes item (a torch.save archive of a pickled value), kept alive by files_.
  const torch::Value& value_of(const Item& item);
  int64_t counter(const Item& item, const std::string& what);
  void read_counters();
  void read_run();
  std::string state_key(const std::string& fqn, const char* state) const;

  std::shared_ptr<const model::Model> model_;
  std::filesystem::path folder_;
  torch::ParseBudget parse_budget_;
  Metadata metadata_;
  std::string layout_name_;
  std::string model_prefix_;  // "model." or ""
  std::string optim_prefix_;  // "optim.", "optimizer." or "" (no optimizer state)
  int world_size_ = 0;
  bool has_moments_ = false;
  ckpt::TensorTable own_table_;
  const ckpt::TensorTable* table_ = nullptr;
  std::vector<std::string> fqns_;                     // per table tensor: the fqn it was read from
  std::vector<std::array<Source, kStates>> sources_;  // per table tensor
  nlohmann::json shared_params_ = nlohmann::json::object();
  std::vector<std::unique_ptr<torch::TorchFile>> values_;  // bytes items opened
  nlohmann::json trainer_state_;
  std::optional<deepspeed::DeepSpeedRun> run_;
  std::string run_missing_;
};

}  // namespace shardkit::convert::dcp
