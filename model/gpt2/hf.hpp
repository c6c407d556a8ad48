// Hugging Face's view of GPT-2: the config.json that GPT2LMHeadModel.from_pretrained accepts, and the
// mapping from the tensor names found in Hugging Face files to shardkit's table (which uses
// GPT2LMHeadModel's own state-dict names: "transformer.h.0.attn.c_attn.weight", Conv1D [in, out]).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "model/gpt2/config.hpp"
#include "model/model.hpp"

namespace shardkit::model::gpt2 {

// config.json for GPT2LMHeadModel; `torch_dtype` is "float32", "bfloat16" or "float16".
nlohmann::json hf_config_json(const GptConfig& config, const std::string& torch_dtype);

// The GPT-2 configuration of a Hugging Face config.json (model_type gpt2; n_layer, n_head, n_embd,
// vocab_size, n_positions or n_ctx). Error(kInvalidInput) naming `where` otherwise.
GptConfig config_from_hf(const nlohmann::json& config, const std::string& where);

// "h.0.ln_1.weight" and "transformer.h.0.ln_1.weight" -> parameter "transformer.h.0.ln_1.weight";
// "lm_head.weight" -> the tied output projection (a copy of wte); "h.0.attn.bias" /
// "h.0.attn.masked_bias" -> attention-mask buffers of older files; "optimizer.exp_avg.<name>" and
// "optimizer.exp_avg_sq.<name>" -> Adam moments of a `consolidate --with-optimizer` export (kOptimizer).
// nullopt: not a GPT-2 name.
std::optional<HfName> classify_hf_name(std::string_view name);

}  // namespace shardkit::model::gpt2
