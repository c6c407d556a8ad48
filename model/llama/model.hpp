// The Llama family behind the Model interface.
#pragma once

#include <memory>

#include "model/llama/config.hpp"
#include "model/registry.hpp"

namespace shardkit::model::llama {

const Family& family();

std::shared_ptr<const Model> make_model(const LlamaConfig& config);
// The configuration of a Llama model; nullptr for a model of another family.
const LlamaConfig* config_of(const Model& model);

}  // namespace shardkit::model::llama
