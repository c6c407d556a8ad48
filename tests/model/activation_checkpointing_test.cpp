// Activation checkpointing on the CPU models: recomputing each block's forward pass before its
// backward pass gives the same loss and the same gradient bits as keeping every block's activations,
// for each family (GPT-2, Llama with an untied and a tied head), over micro-batches that accumulate
// and a batch smaller than the one the buffers were sized for; and the activations held are fewer.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/llama/config.hpp"
#include "model/llama/model.hpp"
#include "model/registry.hpp"
#include "trainer/dense_params.hpp"
#include "trainer/init.hpp"

namespace shardkit {
namespace {

constexpr int kBatch = 3, kSeq = 48;

// Token ids below the vocabulary, a different stream per call.
std::vector<int32_t> tokens(int count, uint32_t seed, int vocab) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  uint32_t x = seed;
  for (int32_t& id : out) id = static_cast<int32_t>((x = x * 1664525u + 1013904223u) >> 8) % vocab;
  return out;
}

// The losses of two accumulated micro-batches (the second smaller than the buffers) and the gradients.
struct Pass {
  std::vector<double> losses;
  std::unique_ptr<trainer::DenseParams> params;
};

Pass train(const model::Model& m, bool checkpointing) {
  Pass out;
  out.params = std::make_unique<trainer::DenseParams>(m.table());
  const trainer::RandomInit init(m, 11);
  for (size_t t = 0; t < m.table().size(); ++t) {
    trainer::init_values(init, static_cast<int>(t), 0, out.params->values(static_cast<int>(t)));
  }
  const auto cpu = m.make_cpu_model({.batch = kBatch, .seq_len = kSeq, .checkpointing = checkpointing});
  out.params->zero_grads();
  for (const int batch : {kBatch, kBatch - 1}) {
    const std::vector<int32_t> inputs = tokens(batch * kSeq, 1 + batch, m.vocab_size());
    const std::vector<int32_t> targets = tokens(batch * kSeq, 100 + batch, m.vocab_size());
    out.losses.push_back(cpu->forward_backward(*out.params, inputs.data(), targets.data(), batch, kSeq, 1.0f));
  }
  return out;
}

std::vector<std::shared_ptr<const model::Model>> models() {
  model::llama::LlamaConfig tied = *model::llama::config_of(*model::resolve_model("llama-tiny"));
  tied.name = "llama-tiny-tied";
  tied.tie_word_embeddings = true;
  return {model::resolve_model("gpt2-tiny"), model::resolve_model("llama-tiny"), model::llama::make_model(tied)};
}

TEST(ActivationCheckpointing, RecomputingEachBlockGivesTheSameLossesAndGradientBits) {
  for (const auto& m : models()) {
    SCOPED_TRACE(m->name());
    const Pass kept = train(*m, false);
    const Pass recomputed = train(*m, true);
    EXPECT_EQ(recomputed.losses, kept.losses);
    for (size_t t = 0; t < m->table().size(); ++t) {
      const std::vector<float>& want = kept.params->gradient(static_cast<int>(t));
      const std::vector<float>& got = recomputed.params->gradient(static_cast<int>(t));
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << m->table()[t].name << ": gradient differs";
    }
  }
}

TEST(ActivationCheckpointing, HoldsOneBlocksActivationsBesideTheBlockInputs) {
  for (const auto& m : models()) {
    SCOPED_TRACE(m->name());
    const model::ActivationPlan all{.batch = kBatch, .seq_len = kSeq};
    model::ActivationPlan one = all;
    one.checkpointing = true;
    const double kept = m->cpu_activation_bytes(all), recomputed = m->cpu_activation_bytes(one);
    EXPECT_LT(recomputed, kept);
    // The figure is what the model then holds.
    EXPECT_EQ(static_cast<double>(m->make_cpu_model(one)->activation_bytes()), recomputed);
    EXPECT_EQ(static_cast<double>(m->make_cpu_model(all)->activation_bytes()), kept);
  }
  // llama-2-7b at 8 x 4096 tokens: 32 layers' activations (about 61,500 floats a token each) against
  // one layer's, 32 layer inputs (4,096 floats a token each) and the buffers outside the layers.
  const auto big = model::resolve_model("llama-2-7b");
  const double kept = big->cpu_activation_bytes({.batch = 8, .seq_len = 4096});
  const double recomputed = big->cpu_activation_bytes({.batch = 8, .seq_len = 4096, .checkpointing = true});
  EXPECT_GT(kept / recomputed, 8.0) << kept << " vs " << recomputed;
  // Linear in the sequence: the attention keeps two floats a row (its backward pass recomputes the
  // probabilities), not T. Four times the tokens, at most four times the bytes.
  const double quarter = big->cpu_activation_bytes({.batch = 8, .seq_len = 1024});
  EXPECT_LE(kept / quarter, 4.0) << kept << " vs " << quarter;
}

}  // namespace
}  // namespace shardkit
