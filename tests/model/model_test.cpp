// The model seam: presets with the published shapes, the families' JSON forms and Hugging Face
// config.json both ways, refusals naming what is wrong, the rotary frequencies of the llama3 scaling,
// and initialisation by role.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <numbers>

#include "base/error.hpp"
#include "base/host_memory.hpp"
#include "model/llama/config.hpp"
#include "model/llama/model.hpp"
#include "model/registry.hpp"

namespace shardkit {
namespace {

// SHARDKIT_HOST_MEMORY replaces the kernel's figures (for machines that add memory as it is used);
// unset, they come back; a value that is not a size is refused naming the variable.
TEST(HostMemory, TheOverrideReplacesWhatTheKernelSays) {
  const double physical = physical_memory_bytes();
  ASSERT_GT(physical, 0.0);
  ASSERT_EQ(::setenv(kHostMemoryVariable, "256GiB", 1), 0);
  EXPECT_EQ(physical_memory_bytes(), 256.0 * (1 << 30));
  EXPECT_EQ(available_memory_bytes(), 256.0 * (1 << 30));
  ASSERT_EQ(::setenv(kHostMemoryVariable, "lots", 1), 0);
  try {
    available_memory_bytes();
    ADD_FAILURE() << "'lots' accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "SHARDKIT_HOST_MEMORY: 'lots' is not a size (examples: 4096, 64MiB, 1GiB, 5GB)");
  }
  ASSERT_EQ(::unsetenv(kHostMemoryVariable), 0);
  EXPECT_EQ(physical_memory_bytes(), physical);
  EXPECT_LE(available_memory_bytes(), physical);
}

void expect_error(ErrorKind kind, const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error containing: " << fragment;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Model, PresetsHaveThePublishedParameterCounts) {
  // The counts of the published checkpoints (tied heads counted once).
  const std::pair<const char*, int64_t> expected[] = {
      {"gpt2", 124'439'808},           {"gpt2-xl", 1'557'611'200},
      {"smollm-135m", 134'515'008},    {"tinyllama-1.1b", 1'100'048'384},
      {"llama-3.2-1b", 1'235'814'400}, {"llama-2-7b", 6'738'415'616},
  };
  for (const auto& [name, count] : expected) {
    const auto m = model::resolve_model(name);
    EXPECT_EQ(m->table().total_elements(), count) << name;
    EXPECT_EQ(m->name(), name);
  }
  EXPECT_EQ(model::resolve_model("llama-3.2-1b")->vocab_size(), 128256);
  EXPECT_EQ(model::resolve_model("gpt2")->family(), "gpt2");
  EXPECT_EQ(model::resolve_model("llama-tiny")->family(), "llama");
}

TEST(Model, EveryPresetSurvivesItsJsonFormAndItsHuggingFaceConfig) {
  for (const model::Family* f : model::families()) {
    for (const std::string& name : f->presets) {
      const auto m = f->preset(name);
      const auto from_manifest = model::model_from_manifest(m->to_json(), "manifest");
      EXPECT_EQ(from_manifest->architecture(), m->architecture()) << name;
      EXPECT_EQ(from_manifest->name(), name);
      const auto from_hf = model::model_from_hf_config(m->hf_config("bfloat16"), "config.json");
      EXPECT_EQ(from_hf->architecture(), m->architecture()) << name;
      EXPECT_TRUE(from_hf->table() == m->table()) << name;
      ASSERT_EQ(m->groups().front().first, 0) << name;
      EXPECT_EQ(m->groups().back().last, static_cast<int>(m->table().size())) << name;
      for (size_t g = 1; g < m->groups().size(); ++g) EXPECT_EQ(m->groups()[g].first, m->groups()[g - 1].last);
    }
  }
}

TEST(Model, AManifestWithoutAFamilyIsGpt2s) {
  // What `train` wrote before families existed.
  const nlohmann::json old = {{"model_type", "gpt2"},
                              {"n_layer", 2},
                              {"n_head", 4},
                              {"n_embd", 128},
                              {"vocab_size", 256},
                              {"n_positions", 64},
                              {"activation_function", "gelu_new"},
                              {"layer_norm_epsilon", 1e-5},
                              {"tie_word_embeddings", true}};
  const auto m = model::model_from_manifest(old, "step-00000010");
  EXPECT_EQ(m->family(), "gpt2");
  EXPECT_EQ(m->architecture(), model::resolve_model("gpt2-tiny")->architecture());
  expect_error(
      ErrorKind::kCorrupt,
      [] {
        model::model_from_manifest({{"family", "mamba"}}, "m");
      },
      "not one of gpt2, llama");
  expect_error(
      ErrorKind::kCorrupt,
      [] {
        model::model_from_manifest({{"family", "llama"}, {"hidden_size", 64}}, "m");
      },
      "'num_hidden_layers' is missing");
}

nlohmann::json llama_hf() {
  // As a Hugging Face Llama 3.2 1B config.json has it (in part).
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"vocab_size", 300},
          {"max_position_embeddings", 128},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling",
           {{"factor", 32.0},
            {"high_freq_factor", 4.0},
            {"low_freq_factor", 1.0},
            {"original_max_position_embeddings", 8192},
            {"rope_type", "llama3"}}},
          {"tie_word_embeddings", true},
          {"hidden_act", "silu"},
          {"torch_dtype", "bfloat16"}};
}

TEST(Model, LlamaConfigJsonInEveryFormTransformersWrites) {
  const auto m = model::model_from_hf_config(llama_hf(), "config.json");
  const model::llama::LlamaConfig* c = model::llama::config_of(*m);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(m->table().find("lm_head.weight"), -1);

  // transformers 5 moves rope_theta and the scaling into rope_parameters.
  nlohmann::json v5 = llama_hf();
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                           {"factor", 32.0},          {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(model::model_from_hf_config(v5, "v5.json")->architecture(), m->architecture());

  // Defaults of LlamaConfig where fields are absent: kv heads = heads, head_dim = hidden / heads.
  nlohmann::json sparse = {{"model_type", "llama"},         {"hidden_size", 64},       {"num_attention_heads", 8},
                           {"num_hidden_layers", 1},        {"intermediate_size", 96}, {"vocab_size", 100},
                           {"num_key_value_heads", nullptr}};
  const auto sparse_model = model::model_from_hf_config(sparse, "sparse.json");
  const auto* d = model::llama::config_of(*sparse_model);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->n_kv_head, 8);
  EXPECT_EQ(d->head_dim, 8);
  EXPECT_FALSE(d->tie_word_embeddings);
  EXPECT_EQ(d->max_position_embeddings, 2048);
}

TEST(Model, WhatTheLlamaFamilyDoesNotComputeIsRefusedByName) {
  auto with = [](const char* key, nlohmann::json value) {
    nlohmann::json j = llama_hf();
    j[key] = std::move(value);
    return j;
  };
  const std::pair<nlohmann::json, std::string> cases[] = {
      {with("attention_bias", true), "no biases"},
      {with("mlp_bias", true), "no biases"},
      {with("hidden_act", "gelu"), "hidden_act is \"gelu\""},
      {with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}), "rope type \"yarn\""},
      {with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}), "'low_freq_factor' is missing"},
      {with("num_key_value_heads", 3), "not a multiple of num_key_value_heads 3"},
      {with("head_dim", 15), "head_dim 15 is odd"},
      {with("rms_norm_eps", 0), "rms_norm_eps"},
      {with("rope_theta", "big"), "'rope_theta' is \"big\""},
      {with("model_type", "mistral"), "model_type \"mistral\" is not one shardkit trains"},
  };
  for (const auto& [config, fragment] : cases) {
    expect_error(
        ErrorKind::kInvalidInput, [&] { model::model_from_hf_config(config, "config.json"); }, fragment);
  }
}

// The config.json of OpenAI's gpt2 on the Hugging Face hub, as transformers writes it (dropouts 0.1:
// shardkit trains without dropout, which does not change the model's shapes or its inference).
nlohmann::json gpt2_hub() {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"activation_function", "gelu_new"},
          {"attn_pdrop", 0.1},
          {"embd_pdrop", 0.1},
          {"resid_pdrop", 0.1},
          {"initializer_range", 0.02},
          {"layer_norm_epsilon", 1e-05},
          {"n_ctx", 1024},
          {"n_embd", 768},
          {"n_head", 12},
          {"n_layer", 12},
          {"n_positions", 1024},
          {"summary_activation", nullptr},
          {"summary_first_dropout", 0.1},
          {"summary_proj_to_labels", true},
          {"summary_type", "cls_index"},
          {"summary_use_proj", true},
          {"vocab_size", 50257}};
}

TEST(Model, WhatTheGpt2FamilyDoesNotComputeIsRefusedByName) {
  EXPECT_EQ(model::model_from_hf_config(gpt2_hub(), "config.json")->architecture(),
            model::resolve_model("gpt2")->architecture());
  auto with = [](const char* key, nlohmann::json value) {
    nlohmann::json j = gpt2_hub();
    j[key] = std::move(value);
    return j;
  };
  for (const char* same : {"gelu_pytorch_tanh", "gelu_fast"}) {
    EXPECT_EQ(model::model_from_hf_config(with("activation_function", same), "config.json")->architecture(),
              model::resolve_model("gpt2")->architecture())
        << same;
  }
  const std::pair<nlohmann::json, std::string> cases[] = {
      {with("activation_function", "gelu"), "activation_function is \"gelu\""},
      {with("activation_function", "relu"), "activation_function is \"relu\""},
      {with("layer_norm_epsilon", 1e-6), "layer_norm_epsilon is 1e-06"},
      {with("layer_norm_epsilon", "small"), "layer_norm_epsilon is \"small\""},
      {with("scale_attn_weights", false), "scale_attn_weights is false"},
      {with("scale_attn_by_inverse_layer_idx", true), "scale_attn_by_inverse_layer_idx is true"},
      {with("tie_word_embeddings", false), "tie_word_embeddings is false"},
      {with("add_cross_attention", true), "add_cross_attention is true"},
      {with("add_cross_attention", 1), "'add_cross_attention' is 1, expected true or false"},
      {with("n_inner", 1000), "n_inner other than 4 * n_embd"},
  };
  for (const auto& [config, fragment] : cases) {
    expect_error(
        ErrorKind::kInvalidInput, [&] { model::model_from_hf_config(config, "config.json"); }, fragment);
  }
}

TEST(Model, Llama3ScalingKeepsHighFrequenciesStretchesLowOnesAndBlendsBetween) {
  const model::llama::LlamaConfig c = *model::llama::config_of(*model::resolve_model("llama-3.2-1b"));
  const std::vector<float> scaled = model::llama::rope_inv_freq(c);
  model::llama::LlamaConfig plain = c;
  plain.rope_scaling = {};
  const std::vector<float> base = model::llama::rope_inv_freq(plain);
  ASSERT_EQ(scaled.size(), 32u);
  int kept = 0, stretched = 0, blended = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    // The definition, in double: wavelengths against the original context's band [8192/4, 8192/1].
    const double f = base[i];
    EXPECT_NEAR(f, std::pow(500000.0, -2.0 * static_cast<double>(i) / 64), 1e-6 * f);
    const double wavelen = 2 * std::numbers::pi / f;
    double want = f;
    if (wavelen > 8192) {
      want = f / 32;
      ++stretched;
    } else if (wavelen >= 2048) {
      const double smooth = (8192 / wavelen - 1) / 3;
      want = (1 - smooth) * f / 32 + smooth * f;
      ++blended;
    } else {
      ++kept;
    }
    EXPECT_NEAR(scaled[i], want, 1e-6 * want) << "frequency " << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(stretched, 0);
  EXPECT_GT(blended, 0);
}

TEST(Model, InitialisationFollowsEachTensorsRole) {
  const auto llama = model::resolve_model("llama-tiny");
  const ckpt::TensorTable& t = llama->table();
  EXPECT_EQ(llama->init_rule(t.find("model.layers.1.input_layernorm.weight")).kind, model::InitRule::kOnes);
  EXPECT_EQ(llama->init_rule(t.find("model.layers.0.post_attention_layernorm.weight")).kind, model::InitRule::kOnes);
  EXPECT_EQ(llama->init_rule(t.find("model.norm.weight")).kind, model::InitRule::kOnes);
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight",
                           "model.layers.1.mlp.down_proj.weight", "lm_head.weight"}) {
    const model::InitRule r = llama->init_rule(t.find(name));
    EXPECT_EQ(r.kind, model::InitRule::kNormal) << name;
    EXPECT_FLOAT_EQ(r.std, 0.02f) << name;
  }
  const auto gpt2 = model::resolve_model("gpt2-tiny");
  const ckpt::TensorTable& g = gpt2->table();
  EXPECT_EQ(gpt2->init_rule(g.find("transformer.ln_f.weight")).kind, model::InitRule::kOnes);
  EXPECT_EQ(gpt2->init_rule(g.find("transformer.ln_f.bias")).kind, model::InitRule::kZeros);
  EXPECT_EQ(gpt2->init_rule(g.find("transformer.h.1.attn.c_attn.bias")).kind, model::InitRule::kZeros);
  EXPECT_FLOAT_EQ(gpt2->init_rule(g.find("transformer.h.0.mlp.c_proj.weight")).std, 0.02f / 2.0f);  // 1/sqrt(2L)
  EXPECT_FLOAT_EQ(gpt2->init_rule(g.find("transformer.wpe.weight")).std, 0.02f);
}

TEST(Model, WeightDecayFollowsEachTensorsRole) {
  // Matrices and embeddings decay, biases and normalisation weights do not: in both families exactly
  // the tensors of two or more dimensions, the rule the PyTorch references (tests/trainer, bench/)
  // apply on their side -- checked for every tensor of tied and untied, one- and many-layer models.
  for (const char* name : {"gpt2-tiny", "gpt2", "llama-tiny", "smollm-135m", "tinyllama-1.1b"}) {
    const auto m = model::resolve_model(name);
    const ckpt::TensorTable& t = m->table();
    for (size_t i = 0; i < t.size(); ++i)
      EXPECT_EQ(m->decays(static_cast<int>(i)), t[i].shape.size() >= 2) << t[i].name;
  }
  const auto gpt2 = model::resolve_model("gpt2-tiny");
  const ckpt::TensorTable& g = gpt2->table();
  for (const char* name :
       {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight",
        "transformer.h.1.attn.c_proj.weight", "transformer.h.0.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight"}) {
    EXPECT_TRUE(gpt2->decays(g.find(name))) << name;
  }
  for (const char* name : {"transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
                           "transformer.h.1.attn.c_attn.bias", "transformer.h.1.ln_2.weight",
                           "transformer.h.0.mlp.c_proj.bias", "transformer.ln_f.weight", "transformer.ln_f.bias"}) {
    EXPECT_FALSE(gpt2->decays(g.find(name))) << name;
  }
  const auto llama = model::resolve_model("llama-tiny");
  const ckpt::TensorTable& l = llama->table();
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                           "model.layers.1.mlp.down_proj.weight", "lm_head.weight"}) {
    EXPECT_TRUE(llama->decays(l.find(name))) << name;
  }
  for (const char* name : {"model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
                           "model.norm.weight"}) {
    EXPECT_FALSE(llama->decays(l.find(name))) << name;
  }
}

TEST(Model, HuggingFaceNamesOfEachFamily) {
  const auto untied = model::resolve_model("llama-tiny");
  const auto tied = model::resolve_model("smollm-135m");
  using K = model::HfName;
  EXPECT_EQ(untied->classify_hf_name("lm_head.weight")->kind, K::kParameter);
  EXPECT_EQ(tied->classify_hf_name("lm_head.weight")->kind, K::kTiedOutput);
  EXPECT_EQ(untied->classify_hf_name("layers.0.mlp.up_proj.weight")->name, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(untied->classify_hf_name("model.layers.0.self_attn.rotary_emb.inv_freq")->kind, K::kBuffer);
  EXPECT_EQ(untied->classify_hf_name("optimizer.exp_avg.model.norm.weight")->kind, K::kOptimizer);
  const auto gpt2 = model::resolve_model("gpt2-tiny");
  EXPECT_EQ(gpt2->classify_hf_name("h.0.ln_1.weight")->name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(gpt2->classify_hf_name("lm_head.weight")->kind, K::kTiedOutput);
}

}  // namespace
}  // namespace shardkit
