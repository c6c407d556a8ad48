// What a DeepSpeed run keeps beside the optimizer states and must get back when it resumes: its
// parameter groups (which parameters each holds, in flat order, and their hyperparameters), the
// parameters tied to others, and the LR scheduler's state. An import records it in the checkpoint's
// trainer_state under "deepspeed" (with the run's config as the manifest's config), so that an export
// gives DeepSpeed back exactly what it saved; a checkpoint trained by shardkit derives it from its model
// and config (docs/DEEPSPEED.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "convert/torch/pickler.hpp"

namespace shardkit::convert::deepspeed {

struct DeepSpeedRun {
  struct Group {
    std::vector<std::string> params;  // in the group's flat order
    nlohmann::json options;           // lr, betas, eps, weight_decay, ... as the optimizer saved them
  };
  std::vector<Group> groups;
  nlohmann::json shared_params = nlohmann::json::object();  // tied parameter -> the parameter holding it
  nlohmann::json lr_scheduler;                              // its state_dict(); null when there is none
  // Adam's step as torch.optim.Adam(W) keeps it (a one-element tensor) or as DeepSpeed's FusedAdam does
  // (a Python int).
  bool step_is_tensor = true;

  nlohmann::json to_json() const;
  // Error(kCorrupt) naming `where` when `j` is not what to_json writes.
  static DeepSpeedRun from_json(const nlohmann::json& j, const std::string& where);
};

// A pickled value as JSON: None, bools, numbers, strings, lists, tuples and sets (as arrays) and dicts
// with string or integer keys. Anything else (a tensor, an object) is Error(kInvalidInput) naming
// `where` and `path`, the value's place.
nlohmann::json to_json(const torch::Value& v, const std::string& where, const std::string& path);
// The reverse: arrays become lists, objects dicts with string keys.
const torch::Value* from_json(torch::ValueBuilder& b, const nlohmann::json& j);

}  // namespace shardkit::convert::deepspeed
