// Hugging Face's view of the Llama family: LlamaConfig's config.json both ways, shardkit's own JSON
// form of the configuration (the same field names, every one present), and what the tensor names of
// a LlamaForCausalLM file are.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "model/llama/config.hpp"
#include "model/model.hpp"

namespace shardkit::model::llama {

// The presets: llama-tiny (tests), smollm-135m, tinyllama-1.1b, llama-3.2-1b, llama-2-7b.
const std::vector<LlamaConfig>& presets();

// shardkit's form (a manifest's "model", a model file with "family": "llama"): every field required.
nlohmann::json to_json(const LlamaConfig& config);
LlamaConfig config_from_json(const nlohmann::json& j, const std::string& where);

// config.json for LlamaForCausalLM.from_pretrained; torch_dtype "float32", "bfloat16" or "float16".
nlohmann::json hf_config_json(const LlamaConfig& config, const std::string& torch_dtype);
// A LlamaForCausalLM config.json: LlamaConfig's defaults for absent fields; rope scaling given as
// rope_scaling (type "llama3" or "default"/none) or as rope_parameters; biases, other activations and
// other rope types refused. Error(kInvalidInput) naming `where` and the field.
LlamaConfig config_from_hf(const nlohmann::json& j, const std::string& where);

// "model.layers.0.mlp.up_proj.weight" (or without "model.", as a LlamaModel file has it) -> that
// parameter; "lm_head.weight" -> the parameter, or kTiedOutput when the head is tied; rotary tables
// of older files -> kBuffer; "optimizer.exp_avg*.<name>" -> kOptimizer.
std::optional<HfName> classify_hf_name(const LlamaConfig& config, std::string_view name);

}  // namespace shardkit::model::llama
