// The trainer on MPI ranks, for each model family: every ZeRO stage at this world size trains exactly
// like one rank at stage 0; a resumed run reproduces the uninterrupted one bit for bit at the same
// world size and stage, and to 1e-5 at another world size and stage. Run at 1-4 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/sanitizers.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/diff.hpp"
#include "comm/mpi.hpp"
#include "tests/support/mpi_support.hpp"
#include "trainer/trainer.hpp"

namespace shardkit {
namespace {

using trainer::StepRecord;
using trainer::TrainOptions;

// A shared directory with a token file and configs with small buckets, so that reduction and gathering
// run in many pieces.
class Workspace : public testing::SharedDir {
 public:
  explicit Workspace(comm::MpiCollective& world) : SharedDir(world) {
    write_tokens("tokens.bin", 6000);
    // llama-tiny with its head tied to the embedding: the embedding's group is then used at both ends
    // of the pass, its gradients open throughout the backward pass.
    write_json("llama-tied.json", {{"family", "llama"},
                                   {"num_hidden_layers", 2},
                                   {"hidden_size", 64},
                                   {"intermediate_size", 160},
                                   {"num_attention_heads", 4},
                                   {"num_key_value_heads", 1},
                                   {"head_dim", 16},
                                   {"vocab_size", 256},
                                   {"max_position_embeddings", 64},
                                   {"rms_norm_eps", 1e-5},
                                   {"rope_theta", 10000.0},
                                   {"rope_scaling", nullptr},
                                   {"tie_word_embeddings", true}});
  }

  // The models every test runs: one of each family, and the tied Llama for the stage comparison. The
  // sanitizer build, some ten times slower, runs the Llama ones (GPT-2's paths run there in the command
  // line tests too).
  std::vector<std::string> models(bool with_tied = false) {
    std::vector<std::string> m = {"llama-tiny"};
    if (!kUnderAddressSanitizer) m.insert(m.begin(), "gpt2-tiny");
    if (with_tied) m.push_back((*this / "llama-tied.json").string());
    return m;
  }

  // With `lion`, DeepSpeed's Lion at a tenth of AdamW's learning rate (the paper's advice).
  std::filesystem::path config(int stage, const std::string& name, bool lion = false) {
    const double lr = lion ? 2e-4 : 2e-3;
    const nlohmann::json optimizer =
        lion ? nlohmann::json{{"type", "Lion"}, {"params", {{"lr", lr}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.1}}}}
             : nlohmann::json{{"type", "AdamW"}, {"params", {{"lr", lr}, {"weight_decay", 0.01}}}};
    return write_json(
        name + ".json",
        {{"train_batch_size", 24},
         {"gradient_accumulation_steps", 2},
         {"gradient_clipping", 1.0},
         {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 20000}}},
         {"optimizer", optimizer},
         {"scheduler",
          {{"type", "WarmupDecayLR"},
           {"params", {{"warmup_num_steps", 3}, {"total_num_steps", 40}, {"warmup_max_lr", lr}}}}},
         {"fp16", {{"enabled", true}, {"initial_scale_power", 12}, {"loss_scale_window", 4}}}});
  }
};

TrainOptions options(const std::filesystem::path& config, const std::filesystem::path& data, int64_t steps,
                     const std::string& model) {
  TrainOptions o;
  o.config = config;
  o.model = model;
  o.data = data;
  o.steps = steps;
  o.resume = "none";
  o.seed = 7;
  o.threads = 1;
  o.quiet = true;
  return o;
}

using testing::train;

void expect_losses_close(const std::vector<StepRecord>& got, const std::vector<StepRecord>& want, size_t offset,
                         double rtol, const std::string& what) {
  ASSERT_EQ(got.size() + offset, want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const StepRecord& w = want[i + offset];
    EXPECT_EQ(got[i].step, w.step) << what;
    EXPECT_NEAR(got[i].loss, w.loss, rtol * std::fabs(w.loss)) << what << " step " << w.step;
    EXPECT_NEAR(got[i].lr, w.lr, 1e-12) << what << " step " << w.step;
    EXPECT_EQ(got[i].loss_scale, w.loss_scale) << what << " step " << w.step;
  }
}

TEST(TrainMpi, EveryStageMatchesOneRankAtStage0) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  for (const std::string& model : ws.models(true)) {
    // The reference: one rank, stage 0.
    const std::vector<StepRecord> reference =
        testing::train_on_rank0(world, options(ws.config(0, "s0"), ws / "tokens.bin", 6, model));
    ASSERT_EQ(reference.size(), 6u);
    EXPECT_LT(reference.back().loss, reference.front().loss) << model << " does not learn";
    for (int stage = 0; stage <= 3; ++stage) {
      const auto records =
          train(world, options(ws.config(stage, "s" + std::to_string(stage)), ws / "tokens.bin", 6, model));
      expect_losses_close(
          records, reference, 0, 1e-5,
          model + ", stage " + std::to_string(stage) + " on " + std::to_string(world.size()) + " ranks");
    }
  }
}

// Lion through the same engines: every stage on this world follows one rank at stage 0, a checkpoint
// holds its two states, a resume continues it bit for bit, and a run of another optimizer refuses it.
TEST(TrainMpi, LionTrainsAtEveryStageAndResumesOnlyAsLion) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  const std::string model = ws.models().front();
  const std::vector<StepRecord> reference =
      testing::train_on_rank0(world, options(ws.config(0, "lion-s0", true), ws / "tokens.bin", 4, model));
  ASSERT_EQ(reference.size(), 4u);
  EXPECT_LT(reference.back().loss, reference.front().loss) << model << " does not learn with Lion";
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = "lion" + std::to_string(stage);
    TrainOptions full = options(ws.config(stage, name, true), ws / "tokens.bin", 4, model);
    full.save_dir = ws / (name + "-full");
    full.save_interval = 2;
    const auto uninterrupted = train(world, full);
    expect_losses_close(uninterrupted, reference, 0, 1e-5,
                        "Lion, stage " + std::to_string(stage) + " on " + std::to_string(world.size()) + " ranks");
    EXPECT_EQ(ckpt::CheckpointReader(full.save_dir).manifest().states, (std::vector<std::string>{"fp32", "exp_avg"}));
    if (stage != 1 && stage != 3) continue;  // the optimizer's states partitioned, and with the parameters

    TrainOptions resumed = full;
    resumed.save_dir = ws / (name + "-resumed");
    resumed.resume = (full.save_dir / "step-00000002").string();
    const auto continued = train(world, resumed);
    ASSERT_EQ(continued.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(continued[i].loss, uninterrupted[i + 2].loss) << "stage " << stage;
    ckpt::CheckpointReader a(full.save_dir), b(resumed.save_dir);
    for (const auto& e : ckpt::diff_checkpoints(a, b).entries) EXPECT_EQ(e.differing, 0) << e.tensor << " " << e.state;

    TrainOptions as_adamw = resumed;
    as_adamw.config = ws.config(stage, name + "-adamw");
    as_adamw.save_dir = ws / (name + "-adamw");
    try {
      train(world, as_adamw);
      ADD_FAILURE() << "an AdamW run resumed a Lion checkpoint";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds the optimizer states [fp32, exp_avg], but this run's AdamW keeps "
                                           "[fp32, exp_avg, exp_avg_sq]"),
                std::string::npos)
          << e.what();
    }
    world.barrier();
  }
}

// Activation checkpointing changes where activations live, not what is computed: at every stage the
// losses, learning rates and loss scales are the same bits with it (from the config's section, and at
// stage 3 from the command line's flag) as without.
TEST(TrainMpi, ActivationCheckpointingTrainsBitForBitLikeKeepingEveryActivation) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  // What a rank recomputes does not depend on the world size; what several ranks add is stage 3
  // gathering a block's parameters again for its recomputation. One rank gathers nothing, and
  // EveryStageMatchesOneRankAtStage0 covers its stages.
  if (world.size() == 1) GTEST_SKIP() << "activation checkpointing is checked on 2 or more ranks";
  Workspace ws(world);
  for (const std::string& model : ws.models(true)) {
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string name = "s" + std::to_string(stage);
      const std::vector<StepRecord> kept = train(world, options(ws.config(stage, name), ws / "tokens.bin", 4, model));
      nlohmann::json with_section = nlohmann::json::parse(std::ifstream(ws.config(stage, name)));
      with_section["activation_checkpointing"] = {{"partition_activations", false}, {"cpu_checkpointing", false}};
      TrainOptions from_config = options(ws.write_json(name + "-ac.json", with_section), ws / "tokens.bin", 4, model);
      std::vector<TrainOptions> runs = {from_config};
      // The flag only sets what the section sets: one stage (the one that gathers) checks it trains alike.
      if (stage == 3) {
        runs.push_back(options(ws.config(stage, name), ws / "tokens.bin", 4, model));
        runs.back().activation_checkpointing = true;
      }
      for (const TrainOptions& o : runs) {
        const std::vector<StepRecord> recomputed = train(world, o);
        const std::string what = model + ", stage " + std::to_string(stage) + ", " + o.config.filename().string() +
                                 (o.activation_checkpointing ? " and the flag" : "");
        ASSERT_EQ(recomputed.size(), kept.size()) << what;
        for (size_t i = 0; i < kept.size(); ++i) {
          EXPECT_EQ(recomputed[i].loss, kept[i].loss) << what << " step " << kept[i].step;
          EXPECT_EQ(recomputed[i].grad_norm, kept[i].grad_norm) << what << " step " << kept[i].step;
          EXPECT_EQ(recomputed[i].lr, kept[i].lr) << what << " step " << kept[i].step;
          EXPECT_EQ(recomputed[i].loss_scale, kept[i].loss_scale) << what << " step " << kept[i].step;
        }
      }
    }
  }
}

TEST(TrainMpi, ResumeAtTheSameWorldSizeAndStageIsBitExact) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  Workspace ws(world);
  for (const std::string& model : ws.models()) {
    for (int stage : {1, 3}) {
      const auto config = ws.config(stage, "resume" + std::to_string(stage));
      TrainOptions full = options(config, ws / "tokens.bin", 6, model);
      full.save_dir = ws / (model + "-full" + std::to_string(stage));
      full.save_interval = 3;
      const auto uninterrupted = train(world, full);

      TrainOptions resumed = full;
      resumed.save_dir = ws / (model + "-resumed" + std::to_string(stage));
      resumed.resume = (full.save_dir / "step-00000003").string();
      const auto continued = train(world, resumed);
      ASSERT_EQ(continued.size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(continued[i].step, uninterrupted[i + 3].step);
        EXPECT_EQ(continued[i].loss, uninterrupted[i + 3].loss)
            << model << " stage " << stage << " step " << continued[i].step;
        EXPECT_EQ(continued[i].grad_norm, uninterrupted[i + 3].grad_norm);
      }
      // The final states are identical, bit for bit.
      ckpt::CheckpointReader a(full.save_dir), b(resumed.save_dir);
      const ckpt::DiffReport diff = ckpt::diff_checkpoints(a, b);
      for (const auto& e : diff.entries) EXPECT_EQ(e.differing, 0) << e.tensor << " " << e.state;
      EXPECT_EQ(b.manifest().step, 6);
    }
  }
}

TEST(TrainMpi, ResumeAtAnotherWorldSizeAndStageContinuesTheRun) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  // On one rank every resume below is at the same world size, where one rank holds every partition
  // whole at any stage: ResumeAtTheSameWorldSizeAndStageIsBitExact's case.
  if (world.size() == 1) GTEST_SKIP() << "resuming at another world size needs 2 or more ranks";
  Workspace ws(world);
  for (const std::string& model : ws.models()) {
    // This world at stage 2 -> one rank at stage 3.
    TrainOptions full = options(ws.config(2, "w_s2"), ws / "tokens.bin", 13, model);
    full.save_dir = ws / (model + "-world");
    full.save_interval = 3;
    const auto uninterrupted = train(world, full);
    TrainOptions to_one = options(ws.config(3, "one_s3"), ws / "tokens.bin", 13, model);
    to_one.resume = (full.save_dir / "step-00000003").string();
    expect_losses_close(testing::train_on_rank0(world, to_one), uninterrupted, 3, 1e-5,
                        model + ": W ranks stage 2 -> 1 rank stage 3");

    // One rank at stage 1 -> this world at stage 0 and at stage 3.
    TrainOptions single = options(ws.config(1, "one_s1"), ws / "tokens.bin", 13, model);
    single.save_dir = ws / (model + "-single");
    single.save_interval = 3;
    const std::vector<StepRecord> reference = testing::train_on_rank0(world, single);
    for (int stage : {0, 3}) {
      TrainOptions resumed =
          options(ws.config(stage, "w_from_one" + std::to_string(stage)), ws / "tokens.bin", 13, model);
      resumed.resume = (single.save_dir / "step-00000003").string();
      expect_losses_close(train(world, resumed), reference, 3, 1e-5,
                          model + ": 1 rank stage 1 -> W ranks stage " + std::to_string(stage));
    }
  }
}

}  // namespace
}  // namespace shardkit
