// The GPT-2 family behind the Model interface.
#pragma once

#include <memory>

#include "model/gpt2/config.hpp"
#include "model/registry.hpp"

namespace shardkit::model::gpt2 {

const Family& family();

std::shared_ptr<const Model> make_model(const GptConfig& config);
// The configuration of a GPT-2 model; nullptr for a model of another family.
const GptConfig* config_of(const Model& model);

}  // namespace shardkit::model::gpt2
