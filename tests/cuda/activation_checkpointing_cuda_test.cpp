// Activation checkpointing on the CUDA backend: each block's forward pass rerun before its backward
// pass, with the block inputs on the GPU or (cpu_checkpointing) in page-locked host memory, trains
// like keeping every activation -- for both families (five blocks, so that the host's two device slots
// take turns over an odd count; Llama with a tied head), at every ZeRO stage in fp32 and at stages 1
// (replayed as a CUDA graph) and 3 in bf16. The recomputation runs the same kernels on the same
// inputs, so the losses are expected to be the same bits; the test holds them to the GPU tests'
// tolerance and prints whether the bits agreed. Skipped (with a message) without enough GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/mpi.hpp"
#include "tests/cuda/require_gpus.hpp"
#include "tests/support/mpi_support.hpp"
#include "trainer/trainer.hpp"

namespace shardkit {
namespace {

using trainer::StepRecord;
using trainer::TrainOptions;

class Workspace : public testing::SharedDir {
 public:
  explicit Workspace(comm::MpiCollective& world) : SharedDir(world) {
    write_tokens("tokens.bin", 60000);
    write_json(
        "gpt2-5.json",
        {{"name", "gpt2-5"}, {"n_layer", 5}, {"n_head", 4}, {"n_embd", 128}, {"vocab_size", 256}, {"n_positions", 64}});
    write_json("llama-5-tied.json", {{"family", "llama"},
                                     {"num_hidden_layers", 5},
                                     {"hidden_size", 128},
                                     {"intermediate_size", 256},
                                     {"num_attention_heads", 4},
                                     {"num_key_value_heads", 2},
                                     {"head_dim", 32},
                                     {"vocab_size", 256},
                                     {"max_position_embeddings", 64},
                                     {"rms_norm_eps", 1e-5},
                                     {"rope_theta", 10000.0},
                                     {"rope_scaling", nullptr},
                                     {"tie_word_embeddings", true}});
  }

  std::vector<std::string> models() {
    return {(*this / "gpt2-5.json").string(), "llama-tiny", (*this / "llama-5-tied.json").string()};
  }

  // `checkpointing`: "" none, "device" the section, "host" the section with cpu_checkpointing.
  std::filesystem::path config(int stage, const std::string& precision, const std::string& checkpointing) {
    nlohmann::json j = {
        {"train_batch_size", 8},
        {"gradient_accumulation_steps", 2},
        {"gradient_clipping", 1.0},
        {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 50000}, {"allgather_bucket_size", 60000}}},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}}};
    if (precision == "bf16") j["bf16"] = {{"enabled", true}};
    if (!checkpointing.empty()) j["activation_checkpointing"] = {{"cpu_checkpointing", checkpointing == "host"}};
    return write_json(precision + "-s" + std::to_string(stage) + "-" + checkpointing + ".json", j);
  }
};

TrainOptions options(const std::filesystem::path& config, const std::filesystem::path& data, const std::string& model) {
  TrainOptions o;
  o.config = config;
  o.model = model;
  o.data = data;
  o.steps = 6;
  o.resume = "none";
  o.seed = 3;
  o.device = trainer::ComputeDevice::kCuda;
  o.quiet = true;
  o.threads = 4;
  return o;
}

// Losses within `rtol` of the reference's; returns whether every loss and gradient norm had its bits.
bool expect_close(const std::vector<StepRecord>& got, const std::vector<StepRecord>& want, double rtol,
                  const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  bool same_bits = got.size() == want.size();
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    EXPECT_NEAR(got[i].loss, want[i].loss, rtol * want[i].loss) << what << " step " << got[i].step;
    EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, rtol * want[i].grad_norm) << what << " step " << got[i].step;
    same_bits = same_bits && std::bit_cast<uint64_t>(got[i].loss) == std::bit_cast<uint64_t>(want[i].loss) &&
                std::bit_cast<uint64_t>(got[i].grad_norm) == std::bit_cast<uint64_t>(want[i].grad_norm);
  }
  return same_bits;
}

TEST(CudaActivationCheckpointing, TrainsLikeKeepingEveryActivation) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());  // a GPU of its own for every rank
  Workspace ws(world);
  struct Case {
    const char* precision;
    int stage;
    double rtol;
  };
  const Case cases[] = {{"fp32", 0, 1e-5}, {"fp32", 1, 1e-5}, {"fp32", 2, 1e-5},
                        {"fp32", 3, 1e-5}, {"bf16", 1, 1e-3}, {"bf16", 3, 1e-3}};
  for (const std::string& model : ws.models()) {
    for (const Case& c : cases) {
      const std::string what = model + " " + c.precision + " stage " + std::to_string(c.stage);
      const auto kept = testing::train(world, options(ws.config(c.stage, c.precision, ""), ws / "tokens.bin", model));
      ASSERT_EQ(kept.size(), 6u) << what;
      for (const std::string where : {"device", "host"}) {
        const auto recomputed =
            testing::train(world, options(ws.config(c.stage, c.precision, where), ws / "tokens.bin", model));
        const bool bits = expect_close(recomputed, kept, c.rtol, what + ", block inputs on the " + where);
        if (world.rank() == 0) {
          std::printf("%s, block inputs on the %s: %s\n", what.c_str(), where.c_str(),
                      bits ? "the same bits" : "within the tolerance, not the same bits");
        }
      }
    }
  }
}

// The command line's flag turns it on as the section does.
TEST(CudaActivationCheckpointing, TheFlagTrainsLikeTheSection) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  REQUIRE_GPUS(world.size());
  Workspace ws(world);
  const std::string model = ws.models().back();
  const auto section = testing::train(world, options(ws.config(1, "bf16", "device"), ws / "tokens.bin", model));
  TrainOptions flag = options(ws.config(1, "bf16", ""), ws / "tokens.bin", model);
  flag.activation_checkpointing = true;
  const auto flagged = testing::train(world, flag);
  ASSERT_EQ(flagged.size(), section.size());
  for (size_t i = 0; i < section.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint64_t>(flagged[i].loss), std::bit_cast<uint64_t>(section[i].loss)) << i;
  }
}

}  // namespace
}  // namespace shardkit
