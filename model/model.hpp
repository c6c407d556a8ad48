// The seam between shardkit and the architectures it trains. A model family (model/<family>/) implements
// Model once per configuration: what its tensors are, how they are grouped, initialised and named in
// Hugging Face's files, and how its forward and backward passes run. The trainer, both backends, eval,
// the converters and the command line see only this interface; the checkpoint library below them sees
// only the tensor table.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.hpp"
#include "ckpt/tensor_table.hpp"
#include "model/init_rule.hpp"
#include "model/param_store.hpp"

namespace shardkit::model {

// Wall-clock split of one forward_backward call, in milliseconds.
struct PassTimes {
  double forward_ms = 0;   // through the output projection and the loss (and its gradient)
  double backward_ms = 0;  // the rest of the backward pass
};

// What a model's activation buffers are sized and kept for: micro-batches of up to `batch` sequences
// of `seq_len` tokens, and activation checkpointing (DeepSpeed's "activation_checkpointing" section,
// train --activation-checkpointing).
struct ActivationPlan {
  int batch = 1;
  int seq_len = 1;
  // Keep only each block's input (the residual stream entering it) in the forward pass and rerun the
  // block's forward pass, the same kernels in the same order, just before its backward pass into one
  // block's buffers reused by every block: activation memory falls from L blocks' worth to L block
  // inputs plus one block, for a second forward pass of the blocks. The gradients are the same bits.
  bool checkpointing = false;
  // With checkpointing on a GPU: the block inputs in page-locked host memory, copied back before each
  // block is recomputed (DeepSpeed's cpu_checkpointing). CPU models hold everything in host memory.
  bool inputs_on_host = false;
};

// A family's forward and backward passes in fp32 on the CPU, for batches of up to the batch and
// sequence length it was made for. Parameters and gradients come from a ParameterStore.
class CpuModel {
 public:
  virtual ~CpuModel() = default;

  // Mean next-token cross-entropy of B sequences of T tokens, no gradients.
  virtual double forward(ParameterStore& params, const int32_t* inputs, const int32_t* targets, int B, int T) = 0;
  // The mean cross-entropy; adds the gradient of grad_scale * loss into the store's gradient buffers.
  virtual double forward_backward(ParameterStore& params, const int32_t* inputs, const int32_t* targets, int B, int T,
                                  float grad_scale, PassTimes* times = nullptr) = 0;
  // Bytes of activation buffers held.
  virtual int64_t activation_bytes() const = 0;
};

// What a tensor name found in a Hugging Face file is to a model.
struct HfName {
  enum Kind {
    kParameter,   // `name` is the table's name for it
    kTiedOutput,  // the output projection of a model whose head is tied to the token embedding (`name`)
    kBuffer,      // a non-parameter the file may carry (attention masks, rotary tables)
    kOptimizer,   // an Adam moment of a `consolidate --with-optimizer` export
  } kind;
  std::string name;
};

class Model {
 public:
  virtual ~Model() = default;

  // The family's name, recorded in manifests ("gpt2", "llama").
  virtual const std::string& family() const = 0;
  // Preset or file the configuration came from, for messages.
  virtual const std::string& name() const = 0;
  virtual int vocab_size() const = 0;
  // The longest sequence the model supports (learned positions, or the rotary embedding's range).
  virtual int max_seq_len() const = 0;
  // The width of the residual stream (DeepSpeed's "auto" bucket sizes derive from it).
  virtual int hidden_size() const = 0;

  // The configuration as a manifest records it: "family" plus the family's fields. Two models with
  // equal architecture() compute the same function of the same tensors.
  virtual nlohmann::json to_json() const = 0;
  nlohmann::json architecture() const {
    nlohmann::json j = to_json();
    j.erase("name");
    return j;
  }

  // Tensors in table order: names and orientations are those of the family's Hugging Face model.
  virtual const ckpt::TensorTable& table() const = 0;
  // What the passes acquire and release together, in table order, covering the table: the unit of
  // ZeRO-3's gathers and of the gradient buckets.
  virtual const std::vector<TensorGroup>& groups() const = 0;
  virtual InitRule init_rule(int tensor) const = 0;
  // Whether AdamW's weight decay applies to the tensor, by its role: the matrices and embeddings
  // decay, biases and normalisation weights do not -- the two parameter groups Hugging Face's Trainer,
  // nanoGPT and llm.c give torch.optim.AdamW, so a run here and theirs regularise the same weights.
  virtual bool decays(int tensor) const = 0;

  // config.json for the family's Hugging Face class; torch_dtype "float32", "bfloat16" or "float16".
  virtual nlohmann::json hf_config(const std::string& torch_dtype) const = 0;
  // nullopt: the name is no tensor of this family (the caller also checks it against the table).
  virtual std::optional<HfName> classify_hf_name(std::string_view name) const = 0;

  // Bytes of activations a CPU model for `plan` holds, known before any is allocated (in double: a
  // crafted configuration's figure may not fit an int64).
  virtual double cpu_activation_bytes(const ActivationPlan& plan) const = 0;
  // Error(kInvalidInput) when plan.seq_len exceeds max_seq_len() or the activations exceed the machine.
  virtual std::unique_ptr<CpuModel> make_cpu_model(const ActivationPlan& plan) const = 0;
};

}  // namespace shardkit::model
