#include "trainer/ds_config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.hpp"

namespace shardkit::trainer {
namespace {

using nlohmann::json;

constexpr char kWhere[] = "config.json";

// The two configs of the seed article as printed there; samples/configs holds the same two.
constexpr char kSeedFp16[] = R"({
  "train_batch_size": 32,
  "gradient_accumulation_steps": 4,
  "fp16": {"enabled": true, "initial_scale_power": 16},
  "zero_optimization": {
    "stage": 2,
    "allgather_partitions": true,
    "reduce_scatter": true,
    "overlap_comm": true,
    "contiguous_gradients": true
  }
})";
constexpr char kSeedAuto[] = R"({
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": "auto",
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "initial_scale_power": 16,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "zero_optimization": {
    "stage": 2,
    "overlap_comm": true,
    "reduce_scatter": true,
    "contiguous_gradients": true,
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8
  },
  "gradient_clipping": 1.0,
  "wall_clock_breakdown": false
})";

DsConfig parse(const json& config, int world_size = 1, int64_t hidden_size = 0, int64_t total_steps = 0) {
  return parse_ds_config(config, world_size, AutoContext{hidden_size, total_steps, {}, {}}, kWhere);
}

// A minimal valid config (train batch 8) with `patch` merged into its top level.
json with(const json& patch = json::object()) {
  json config = {{"train_batch_size", 8}};
  config.update(patch);
  return config;
}

// The message of the Error(kInvalidInput) that parsing `config` must throw; "" (and a failure) if none.
std::string error_of(const json& config, int world_size = 1) {
  try {
    parse(config, world_size);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << config.dump();
  return "";
}

testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// Every field of each struct, for comparing two configs field by field.
auto fields(const Fp16Config& f) {
  return std::tie(f.enabled, f.loss_scale, f.initial_scale_power, f.loss_scale_window, f.hysteresis,
                  f.consecutive_hysteresis, f.min_loss_scale);
}
auto fields(const OffloadConfig& o) {
  return std::tie(o.device, o.pin_memory, o.nvme_path, o.buffer_count, o.fast_init);
}
auto fields(const AioConfig& a) {
  return std::tie(a.block_size, a.queue_depth, a.intra_op_parallelism, a.single_submit, a.overlap_events, a.use_gds);
}
auto fields(const ZeroConfig& z) {
  return std::tie(z.stage, z.contiguous_gradients, z.reduce_scatter, z.overlap_comm, z.allgather_partitions,
                  z.reduce_bucket_size, z.allgather_bucket_size, z.stage3_prefetch_bucket_size,
                  z.stage3_param_persistence_threshold, z.stage3_max_live_parameters, z.stage3_max_reuse_distance,
                  z.sub_group_size, z.round_robin_gradients);
}
auto fields(const OptimizerConfig& o) {
  return std::tie(o.type, o.kind, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.adam_w_mode, o.bias_correction,
                  o.given);
}
auto fields(const SchedulerConfig& s) {
  return std::tie(s.type, s.warmup_min_lr, s.warmup_max_lr, s.warmup_num_steps, s.warmup_type, s.total_num_steps,
                  s.warmup_min_ratio, s.cos_min_ratio);
}
auto fields(const DsConfig& c) {
  return std::tie(c.train_batch_size, c.micro_batch_per_gpu, c.gradient_accumulation_steps, c.bf16, c.gradient_clipping,
                  c.steps_per_print, c.wall_clock_breakdown, c.communication_data_type,
                  c.activation_checkpointing.enabled, c.activation_checkpointing.cpu_checkpointing);
}

void expect_same(const DsConfig& a, const DsConfig& b) {
  EXPECT_EQ(fields(a), fields(b));
  EXPECT_EQ(fields(a.fp16), fields(b.fp16));
  EXPECT_EQ(fields(a.zero), fields(b.zero));
  EXPECT_EQ(fields(a.zero.offload_optimizer), fields(b.zero.offload_optimizer));
  EXPECT_EQ(fields(a.zero.offload_param), fields(b.zero.offload_param));
  EXPECT_EQ(fields(a.optimizer), fields(b.optimizer));
  EXPECT_EQ(fields(a.scheduler), fields(b.scheduler));
}

// A fresh folder under the system temp dir, removed with its files at the end of the test.
class TempDir {
 public:
  TempDir() : path_(std::filesystem::temp_directory_path() / ("shardkit_ds_config_test_" + random_suffix())) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::filesystem::path write(const std::string& name, const std::string& text) const {
    const std::filesystem::path file = path_ / name;
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static std::string random_suffix() {
    std::random_device device;
    return std::to_string(device()) + std::to_string(device());
  }
  std::filesystem::path path_;
};

TEST(DsConfigSeed, Fp16ConfigResolvesAtWorldSizesThatDivideIt) {
  for (const int world_size : {1, 2, 4, 8}) {
    SCOPED_TRACE("world size " + std::to_string(world_size));
    const DsConfig c = parse(json::parse(kSeedFp16), world_size);
    EXPECT_EQ(c.train_batch_size, 32);
    EXPECT_EQ(c.gradient_accumulation_steps, 4);
    EXPECT_EQ(c.micro_batch_per_gpu, 32 / world_size / 4);
    EXPECT_TRUE(c.fp16.enabled);
    EXPECT_EQ(c.fp16.initial_scale_power, 16);
    EXPECT_EQ(c.fp16.hysteresis, 2);
    EXPECT_EQ(c.fp16.loss_scale, 0);
    EXPECT_EQ(c.zero.stage, 2);
    EXPECT_TRUE(c.zero.overlap_comm);
    EXPECT_TRUE(c.zero.reduce_scatter);
    EXPECT_FALSE(c.optimizer.given);
    EXPECT_EQ(c.gradient_clipping, 1.0);
    EXPECT_EQ(c.steps_per_print, 10);
    EXPECT_TRUE(c.warnings.empty());
  }
}

TEST(DsConfigSeed, Fp16ConfigFailsAtWorldSizesThatDoNotDivideIt) {
  EXPECT_EQ(error_of(json::parse(kSeedFp16), 3),
            "config.json: train_batch_size 32 != train_micro_batch_size_per_gpu 2 * gradient_accumulation_steps 4 * "
            "world size 3");
  EXPECT_TRUE(Contains(error_of(json::parse(kSeedFp16), 16),
                       "train_batch_size 32 is smaller than gradient_accumulation_steps 4 * world size 16"));
}

TEST(DsConfigSeed, AutoConfigTakesTheBatchFromTheMicroBatch) {
  for (const int world_size : {1, 3}) {
    SCOPED_TRACE("world size " + std::to_string(world_size));
    const DsConfig c = parse(json::parse(kSeedAuto), world_size);
    EXPECT_EQ(c.micro_batch_per_gpu, 2);
    EXPECT_EQ(c.gradient_accumulation_steps, 1);
    EXPECT_EQ(c.train_batch_size, 2 * world_size);
    EXPECT_EQ(c.fp16.loss_scale_window, 500);
    EXPECT_EQ(c.fp16.min_loss_scale, 1);
    EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
    EXPECT_EQ(c.zero.allgather_bucket_size, 500'000'000);
    EXPECT_FALSE(c.wall_clock_breakdown);
    EXPECT_TRUE(c.warnings.empty());
  }
}

TEST(DsConfigBatch, ResolvesEveryCaseOfTheRule) {
  struct Case {
    json config;
    int world_size;
    int64_t train, micro, gas;
  };
  const std::vector<Case> cases = {
      {{{"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 2}},
       2,
       16,
       4,
       2},
      {{{"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", 4}}, 2, 16, 4, 2},
      {{{"train_batch_size", 24}, {"train_micro_batch_size_per_gpu", 4}}, 3, 24, 4, 2},
      {{{"train_batch_size", 16}, {"gradient_accumulation_steps", 2}}, 2, 16, 4, 2},
      {{{"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 2}}, 2, 16, 4, 2},
      {{{"train_batch_size", 16}}, 2, 16, 8, 1},
      {{{"train_micro_batch_size_per_gpu", 4}}, 2, 8, 4, 1},
      // "auto" and null mean "not given"; integral floats are integers.
      {{{"train_batch_size", "auto"}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", nullptr}},
       2,
       8,
       4,
       1},
      {{{"train_batch_size", 32.0}, {"train_micro_batch_size_per_gpu", 4e0}}, 1, 32, 4, 8},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.config.dump() + " at world size " + std::to_string(k.world_size));
    const DsConfig c = parse(k.config, k.world_size);
    EXPECT_EQ(c.train_batch_size, k.train);
    EXPECT_EQ(c.micro_batch_per_gpu, k.micro);
    EXPECT_EQ(c.gradient_accumulation_steps, k.gas);
  }
}

TEST(DsConfigBatch, InconsistentSizesNameAllFourNumbers) {
  // Integer division leaves a remainder that the check then catches.
  EXPECT_EQ(error_of({{"train_batch_size", 10}, {"train_micro_batch_size_per_gpu", 3}}),
            "config.json: train_batch_size 10 != train_micro_batch_size_per_gpu 3 * gradient_accumulation_steps 3 * "
            "world size 1");
  EXPECT_TRUE(Contains(error_of({{"train_batch_size", 7}}, 2),
                       "train_batch_size 7 != train_micro_batch_size_per_gpu 3 * gradient_accumulation_steps 1 * "
                       "world size 2"));
  EXPECT_TRUE(Contains(
      error_of({{"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 3}},
               2),
      "train_batch_size 16 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 3 * world size 2"));
  EXPECT_TRUE(Contains(error_of({{"train_micro_batch_size_per_gpu", int64_t{1} << 30},
                                 {"gradient_accumulation_steps", int64_t{1} << 40}}),
                       "is too large"));
}

// Found by fuzz/ds_config_fuzz.cpp: sizes that leave no accumulation step (or no micro-batch) at this
// world size were divided by that zero (SIGFPE).
TEST(DsConfigBatch, SizesTooSmallForTheWorldSizeAreRejectedNotDividedByZero) {
  EXPECT_EQ(error_of({{"train_batch_size", 12}, {"train_micro_batch_size_per_gpu", 2}}, 8),
            "config.json: train_batch_size 12 is smaller than train_micro_batch_size_per_gpu 2 * world size 8");
  EXPECT_EQ(error_of({{"train_batch_size", 4}, {"gradient_accumulation_steps", 4}}, 2),
            "config.json: train_batch_size 4 is smaller than gradient_accumulation_steps 4 * world size 2");
}

TEST(DsConfigBatch, NeedsTrainOrMicroBatchSize) {
  for (const json& config : {json::object(), json{{"gradient_accumulation_steps", 4}},
                             json{{"train_batch_size", nullptr}, {"train_micro_batch_size_per_gpu", nullptr}}}) {
    EXPECT_EQ(error_of(config), "config.json: either train_batch_size or train_micro_batch_size_per_gpu must be given");
  }
}

TEST(DsConfigBatch, AutoSizesResolveByTheRuleOrSayTheyAreAuto) {
  // A Hugging Face Trainer config: every batch key "auto". shardkit has no Trainer arguments to take
  // them from, and the message says so instead of "must be given".
  const json all_auto = {{"train_batch_size", "auto"},
                         {"train_micro_batch_size_per_gpu", "auto"},
                         {"gradient_accumulation_steps", "auto"}};
  EXPECT_EQ(error_of(all_auto),
            "config.json: train_batch_size and train_micro_batch_size_per_gpu are \"auto\" or absent: \"auto\" is "
            "filled in by Hugging Face's Trainer only; give train_micro_batch_size_per_gpu (or train_batch_size) as a "
            "number");
  EXPECT_TRUE(Contains(error_of({{"train_batch_size", "auto"}, {"gradient_accumulation_steps", 2}}), "\"auto\""));
  // One concrete size is enough: DeepSpeed's rule gives the others.
  json micro = all_auto;
  micro["train_micro_batch_size_per_gpu"] = 4;
  const DsConfig from_micro = parse(micro, 2);
  EXPECT_EQ(
      std::tuple(from_micro.train_batch_size, from_micro.micro_batch_per_gpu, from_micro.gradient_accumulation_steps),
      std::tuple(8, 4, 1));
  json train = all_auto;
  train["train_batch_size"] = 32;
  train["gradient_accumulation_steps"] = 4;
  const DsConfig from_train = parse(train, 2);
  EXPECT_EQ(
      std::tuple(from_train.train_batch_size, from_train.micro_batch_per_gpu, from_train.gradient_accumulation_steps),
      std::tuple(32, 4, 4));
}

TEST(DsConfigBatch, RejectsNonPositiveAndFractionalSizes) {
  EXPECT_EQ(error_of({{"train_batch_size", 0}}), "config.json: train_batch_size is 0, must be >= 1");
  EXPECT_TRUE(Contains(error_of({{"train_micro_batch_size_per_gpu", -2}}), "train_micro_batch_size_per_gpu is -2"));
  EXPECT_TRUE(Contains(error_of(with({{"gradient_accumulation_steps", 2.5}})),
                       "gradient_accumulation_steps is 2.5, must be an integer"));
  EXPECT_TRUE(Contains(error_of({{"train_batch_size", 8}}, 0), "world size 0"));
}

TEST(DsConfigAuto, ZeroSizesFollowTheHiddenSize) {
  const json config = with({{"zero_optimization",
                             {{"stage", 3},
                              {"reduce_bucket_size", "auto"},
                              {"stage3_prefetch_bucket_size", "auto"},
                              {"stage3_param_persistence_threshold", "auto"}}}});
  const DsConfig sized = parse(config, 1, 768);
  EXPECT_EQ(sized.zero.reduce_bucket_size, 768 * 768);
  EXPECT_EQ(sized.zero.stage3_prefetch_bucket_size, 530'841);  // floor(0.9 * 589824)
  EXPECT_EQ(sized.zero.stage3_param_persistence_threshold, 7'680);
  EXPECT_TRUE(sized.warnings.empty());

  const DsConfig unsized = parse(config, 1, 0);
  EXPECT_EQ(unsized.zero.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(unsized.zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(unsized.zero.stage3_param_persistence_threshold, 100'000);

  // A given number wins over the hidden size.
  EXPECT_EQ(parse(with({{"zero_optimization", {{"reduce_bucket_size", 2e8}}}}), 1, 768).zero.reduce_bucket_size,
            200'000'000);
}

TEST(DsConfigAuto, OtherAutoValuesTakeTheDefaults) {
  const DsConfig c = parse(
      with({{"gradient_clipping", "auto"},
            {"steps_per_print", "auto"},
            {"fp16", {{"enabled", "auto"}, {"loss_scale_window", "auto"}}},
            {"zero_optimization", {{"stage", 3}, {"overlap_comm", "auto"}}},
            {"optimizer",
             {{"type", "AdamW"},
              {"params", {{"lr", 3e-4}, {"betas", "auto"}, {"eps", "auto"}, {"weight_decay", "auto"}}}}},
            {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", "auto"}, {"warmup_min_lr", "auto"}}}}}}),
      1, 768);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_TRUE(c.zero.overlap_comm);  // stage 3's default
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-4);  // the optimizer's lr, as the Trainer fills it
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(DsConfigAuto, TotalNumStepsIsTheRunsStepCount) {
  for (const char* type : {"WarmupDecayLR", "WarmupCosineLR"}) {
    SCOPED_TRACE(type);
    const json config = with({{"scheduler", {{"type", type}, {"params", {{"total_num_steps", "auto"}}}}}});
    EXPECT_EQ(parse(config, 1, 0, 300).scheduler.total_num_steps, 300);
    EXPECT_EQ(error_of(config),
              "config.json: scheduler.params.total_num_steps is \"auto\" and the run's step count "
              "is not known here: give it as a number");
  }
}

TEST(DsConfigAuto, WarmupMaxLrIsTheOptimizersLrNotDeepSpeedsDefault) {
  // Unset, WarmupDecayLR's peak is DeepSpeed's 0.001; "auto" is the Trainer's learning rate.
  const DsConfig c =
      parse(with({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 6e-4}}}}},
                  {"scheduler",
                   {{"type", "WarmupDecayLR"}, {"params", {{"warmup_max_lr", "auto"}, {"total_num_steps", "auto"}}}}}}),
            1, 0, 50);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 6e-4);
  EXPECT_EQ(c.scheduler.total_num_steps, 50);
}

TEST(DsConfigAuto, ValuesOnlyTheTrainerKnowsAreRefused) {
  // The Trainer's own defaults differ from shardkit's here, so no default could stand in for them.
  EXPECT_EQ(error_of(with({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}}}}}})),
            "config.json: optimizer.params.lr is \"auto\", which only Hugging Face's Trainer fills in: give the "
            "learning rate as a number, or with --lr");
  EXPECT_EQ(error_of(with({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", "auto"}}}}}})),
            "config.json: scheduler.params.warmup_num_steps is \"auto\", which only Hugging Face's Trainer fills in: "
            "give the number of warmup steps, or with --warmup-steps");
}

// --lr and --warmup-steps stand in for the Trainer's arguments: they fill "auto", and a config number
// that disagrees with them is an error (the Trainer raises one too).
TEST(DsConfigAuto, CommandLineValuesFillAutoAndMustAgreeWithNumbers) {
  AutoContext context{0, 100, 3e-4, 20};
  const json scheduler = {
      {"type", "WarmupDecayLR"},
      {"params", {{"warmup_num_steps", "auto"}, {"warmup_max_lr", "auto"}, {"total_num_steps", 100}}}};
  DsConfig c = parse_ds_config(
      with({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}}}}}, {"scheduler", scheduler}}), 1, context,
      kWhere);
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 20);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 3e-4);
  // Without an optimizer section, --lr is the learning rate; the same numbers in the config are fine.
  EXPECT_EQ(parse_ds_config(with(), 1, {0, 0, 3e-4, {}}, kWhere).optimizer.lr, 3e-4);
  EXPECT_NO_THROW(parse_ds_config(with({{"optimizer", {{"params", {{"lr", 3e-4}}}}}}), 1, {0, 0, 3e-4, {}}, kWhere));
  // Different numbers.
  try {
    parse_ds_config(with({{"optimizer", {{"params", {{"lr", 1e-3}}}}}}), 1, {0, 0, 3e-4, {}}, kWhere);
    FAIL() << "a disagreeing --lr accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "config.json: optimizer.params.lr is 0.001 but --lr is 0.0003: give one of them");
  }
  try {
    parse_ds_config(with({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 5}}}}}}), 1,
                    {0, 0, {}, 20}, kWhere);
    FAIL() << "a disagreeing --warmup-steps accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "config.json: scheduler.params.warmup_num_steps is 5 but --warmup-steps is 20: give one of them");
  }
  // --warmup-steps without a scheduler would do nothing: refused.
  try {
    parse_ds_config(with(), 1, {0, 0, {}, 20}, kWhere);
    FAIL() << "--warmup-steps without a scheduler accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "--warmup-steps 20 needs a scheduler in the config")) << e.what();
  }
}

TEST(DsConfigPrecision, Fp16FieldsAndTheirDefaults) {
  const Fp16Config defaults = parse(with({{"fp16", {{"enabled", true}}}})).fp16;
  EXPECT_EQ(fields(defaults), fields(Fp16Config{true, 0, 16, 1000, 2, false, 1}));
  const Fp16Config given = parse(with({{"fp16",
                                        {{"enabled", true},
                                         {"loss_scale", 128},
                                         {"initial_scale_power", 12},
                                         {"loss_scale_window", 200},
                                         {"hysteresis", 1},
                                         {"consecutive_hysteresis", true},
                                         {"min_loss_scale", 0.25}}}}))
                               .fp16;
  EXPECT_EQ(fields(given), fields(Fp16Config{true, 128, 12, 200, 1, true, 0.25}));
  EXPECT_TRUE(Contains(error_of(with({{"fp16", {{"min_loss_scale", 0}}}})), "fp16.min_loss_scale is 0"));
  EXPECT_TRUE(Contains(error_of(with({{"fp16", {{"initial_scale_power", -1}}}})), "fp16.initial_scale_power is -1"));
}

TEST(DsConfigPrecision, Fp16AndBf16TogetherAreRejected) {
  for (const char* bf16_key : {"bf16", "bfloat16"}) {
    EXPECT_EQ(error_of(with({{"fp16", {{"enabled", true}}}, {bf16_key, {{"enabled", true}}}})),
              "config.json: fp16.enabled and bf16.enabled are both true");
  }
  // Present but not both enabled: fine.
  EXPECT_TRUE(parse(with({{"fp16", {{"enabled", false}}}, {"bf16", {{"enabled", true}}}})).bf16);
}

TEST(DsConfigPrecision, BfloatIsAnAliasOfBf16) {
  const DsConfig alias = parse(with({{"bfloat16", {{"enabled", true}}}}));
  EXPECT_TRUE(alias.bf16);
  EXPECT_TRUE(alias.warnings.empty());
  EXPECT_FALSE(parse(with()).bf16);
  // With both spellings DeepSpeed reads "bf16".
  const DsConfig both = parse(with({{"bf16", {{"enabled", false}}}, {"bfloat16", {{"enabled", true}}}}));
  EXPECT_FALSE(both.bf16);
  EXPECT_EQ(both.warnings, std::vector<std::string>{"bfloat16 ignored: bf16 is given"});
}

TEST(DsConfigPrecision, CommunicationDataTypeIsReadAsDeepSpeedSpellsIt) {
  EXPECT_EQ(parse(with()).communication_data_type, std::nullopt);
  EXPECT_EQ(comm_dtype(parse(with({{"bf16", {{"enabled", true}}}}))), ckpt::DType::kF32);  // fp32 unless given
  const std::vector<std::pair<const char*, ckpt::DType>> spellings = {{"fp32", ckpt::DType::kF32},
                                                                      {"fp16", ckpt::DType::kF16},
                                                                      {"bf16", ckpt::DType::kBF16},
                                                                      {"BF16", ckpt::DType::kBF16}};
  for (const auto& [name, type] : spellings) {
    const DsConfig c = parse(with({{"communication_data_type", name}}));
    EXPECT_EQ(c.communication_data_type, type) << name;
    EXPECT_TRUE(c.warnings.empty());
  }
  EXPECT_EQ(
      parse(with({{"bf16", {{"enabled", true}}}, {"communication_data_type", "fp16"}})).warnings,
      std::vector<std::string>{"communication_data_type fp16 with bf16 training: gradient sums above 65504 overflow"});
  EXPECT_EQ(error_of(with({{"communication_data_type", "int8"}})),
            "config.json: communication_data_type is \"int8\", must be \"fp32\", \"fp16\" or \"bf16\"");
  EXPECT_TRUE(Contains(error_of(with({{"communication_data_type", 16}})),
                       "config.json: communication_data_type must be a string, got 16"));
}

TEST(DsConfigZero, OverlapCommDefaultsToTrueOnlyAtStage3) {
  for (const int stage : {0, 1, 2, 3}) {
    EXPECT_EQ(parse(with({{"zero_optimization", {{"stage", stage}}}})).zero.overlap_comm, stage == 3)
        << "stage " << stage;
  }
  EXPECT_FALSE(parse(with({{"zero_optimization", {{"stage", 3}, {"overlap_comm", false}}}})).zero.overlap_comm);
  EXPECT_TRUE(parse(with({{"zero_optimization", {{"stage", 1}, {"overlap_comm", true}}}})).zero.overlap_comm);
  EXPECT_FALSE(parse(with()).zero.overlap_comm);
}

TEST(DsConfigZero, ReadsEveryField) {
  const DsConfig c = parse(with({{"zero_optimization",
                                  {{"stage", 1},
                                   {"contiguous_gradients", false},
                                   {"reduce_scatter", false},
                                   {"overlap_comm", true},
                                   {"allgather_partitions", false},
                                   {"reduce_bucket_size", 1000},
                                   {"allgather_bucket_size", 2e3},
                                   {"stage3_prefetch_bucket_size", 3000},
                                   {"stage3_param_persistence_threshold", 4000},
                                   {"stage3_max_live_parameters", 5000},
                                   {"stage3_max_reuse_distance", 6000},
                                   {"sub_group_size", 7000},
                                   {"round_robin_gradients", true},
                                   {"offload_optimizer", {{"device", "cpu"}, {"pin_memory", true}}},
                                   {"offload_param", {{"device", "nvme"}, {"nvme_path", "/nvme"}}}}}}));
  ZeroConfig expected;
  expected.stage = 1;
  expected.contiguous_gradients = false;
  expected.reduce_scatter = false;
  expected.overlap_comm = true;
  expected.allgather_partitions = false;
  expected.reduce_bucket_size = 1000;
  expected.allgather_bucket_size = 2000;
  expected.stage3_prefetch_bucket_size = 3000;
  expected.stage3_param_persistence_threshold = 4000;
  expected.stage3_max_live_parameters = 5000;
  expected.stage3_max_reuse_distance = 6000;
  expected.sub_group_size = 7000;
  expected.round_robin_gradients = true;
  EXPECT_EQ(fields(c.zero), fields(expected));
  EXPECT_EQ(fields(c.zero.offload_optimizer), fields(OffloadConfig{OffloadDevice::kCpu, true}));
  EXPECT_EQ(fields(c.zero.offload_param), fields(OffloadConfig{OffloadDevice::kNvme, false, "/nvme"}));
  EXPECT_TRUE(c.warnings.empty());  // offload keys shardkit does not use are accepted silently
}

// ZeRO-Infinity's optimizer offload as DeepSpeed's docs write it: the swapper's keys and the aio block
// are read (and round-trip through to_json); keys of DeepSpeed's swapper that shardkit's has no
// counterpart for are accepted silently.
TEST(DsConfigZero, NvmeOffloadAndTheAioBlockAreRead) {
  const DsConfig c = parse(with({{"zero_optimization",
                                  {{"stage", 3},
                                   {"offload_optimizer",
                                    {{"device", "nvme"},
                                     {"nvme_path", "/local_nvme"},
                                     {"pin_memory", true},
                                     {"buffer_count", 5},
                                     {"fast_init", true},
                                     {"ratio", 1.0}}}}},
                                 {"aio",
                                  {{"block_size", 262144},
                                   {"queue_depth", 32},
                                   {"thread_count", 2},
                                   {"single_submit", true},
                                   {"overlap_events", false}}}}));
  OffloadConfig expected{OffloadDevice::kNvme, true, "/local_nvme"};
  expected.buffer_count = 5;
  expected.fast_init = true;
  EXPECT_EQ(fields(c.zero.offload_optimizer), fields(expected));
  EXPECT_EQ(fields(c.aio), fields(AioConfig{262144, 32, 2, true, false, false}));
  EXPECT_TRUE(c.warnings.empty());
  const DsConfig again = parse(to_json(c));
  EXPECT_EQ(fields(again.zero.offload_optimizer), fields(expected));
  EXPECT_EQ(fields(again.aio), fields(c.aio));
}

TEST(DsConfigZero, NvmeOffloadNeedsAPathAndAioBlocksAlignedForDirectIo) {
  EXPECT_EQ(error_of(with({{"zero_optimization", {{"offload_optimizer", {{"device", "nvme"}}}}}})),
            "config.json: zero_optimization.offload_optimizer.nvme_path must be given for device nvme (the folder of "
            "the swap files)");
  EXPECT_EQ(error_of(with({{"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "nvme"}}}}}})),
            "config.json: zero_optimization.offload_param.nvme_path must be given for device nvme (the folder of "
            "the swap files)");
  EXPECT_EQ(error_of(with({{"aio", {{"block_size", 10000}}}})),
            "config.json: aio.block_size is 10000, must be a multiple of 4096 (O_DIRECT)");
  EXPECT_TRUE(Contains(error_of(with({{"aio", {{"queue_depth", 0}}}})), "aio.queue_depth is 0, must be in [1, 4096]"));
  EXPECT_TRUE(Contains(error_of(with({{"aio", {{"thread_count", 1}, {"intra_op_parallelism", 1}}}})),
                       "aio.thread_count and aio.intra_op_parallelism are the same setting"));
  EXPECT_TRUE(Contains(
      error_of(with({{"zero_optimization",
                      {{"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/n"}, {"buffer_count", 0}}}}}})),
      "zero_optimization.offload_optimizer.buffer_count is 0, must be in [1, "));
}

TEST(DsConfigZero, RejectsBadStageOddAllgatherBucketAndUnknownDevice) {
  EXPECT_EQ(error_of(with({{"zero_optimization", {{"stage", 4}}}})),
            "config.json: zero_optimization.stage is 4, must be in [0, 3]");
  EXPECT_TRUE(Contains(error_of(with({{"zero_optimization", {{"stage", -1}}}})), "zero_optimization.stage is -1"));
  EXPECT_EQ(error_of(with({{"zero_optimization", {{"allgather_bucket_size", 500'000'001}}}})),
            "config.json: zero_optimization.allgather_bucket_size is 500000001, must be even");
  EXPECT_EQ(error_of(with({{"zero_optimization", {{"reduce_bucket_size", -1}}}})),
            "config.json: zero_optimization.reduce_bucket_size is -1, must be >= 0");
  EXPECT_TRUE(Contains(error_of(with({{"zero_optimization", {{"offload_param", {{"device", "gpu"}}}}}})),
                       "zero_optimization.offload_param.device is 'gpu', must be none, cpu or nvme"));
}

TEST(DsConfigZero, SizesOfZeroAreAcceptedAsDeepSpeedAcceptsThem) {
  const DsConfig c = parse(with({{"zero_optimization",
                                  {{"reduce_bucket_size", 0},
                                   {"allgather_bucket_size", 0},
                                   {"sub_group_size", 0},
                                   {"stage3_prefetch_bucket_size", 0}}}}));
  EXPECT_EQ(std::tuple(c.zero.reduce_bucket_size, c.zero.allgather_bucket_size, c.zero.sub_group_size,
                       c.zero.stage3_prefetch_bucket_size),
            std::tuple(0, 0, 0, 0));
}

TEST(DsConfigZero, Stage3SizesAlsoReadUnderTheirFieldNames) {
  const DsConfig c = parse(with({{"zero_optimization",
                                  {{"prefetch_bucket_size", 11},
                                   {"param_persistence_threshold", 12},
                                   {"max_live_parameters", 13},
                                   {"max_reuse_distance", 14}}}}));
  EXPECT_EQ(std::tuple(c.zero.stage3_prefetch_bucket_size, c.zero.stage3_param_persistence_threshold,
                       c.zero.stage3_max_live_parameters, c.zero.stage3_max_reuse_distance),
            std::tuple(11, 12, 13, 14));
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(error_of(with({{"zero_optimization", {{"prefetch_bucket_size", 1}, {"stage3_prefetch_bucket_size", 2}}}})),
            "config.json: zero_optimization.prefetch_bucket_size and zero_optimization.stage3_prefetch_bucket_size "
            "are the same setting: give one of them");
}

TEST(DsConfigZero, DeprecatedCpuOffloadMeansOptimizerOffloadToCpu) {
  const DsConfig c = parse(with({{"zero_optimization", {{"stage", 2}, {"cpu_offload", true}}}}));
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(Contains(c.warnings[0], "zero_optimization.cpu_offload is deprecated"));
  EXPECT_EQ(parse(with({{"zero_optimization", {{"cpu_offload", false}}}})).zero.offload_optimizer.device,
            OffloadDevice::kNone);
  EXPECT_TRUE(Contains(
      error_of(with({{"zero_optimization", {{"cpu_offload", true}, {"offload_optimizer", {{"device", "cpu"}}}}}})),
      "zero_optimization.cpu_offload is deprecated and cannot be given together with offload_optimizer"));
}

TEST(DsConfigOptimizer, AdamMeansAdamWUnlessAdamWModeIsFalse) {
  const auto optimizer = [](const json& section) { return parse(with({{"optimizer", section}})); };
  const DsConfig adam = optimizer({{"type", "Adam"}});
  EXPECT_EQ(adam.optimizer.type, "Adam");
  EXPECT_TRUE(adam.optimizer.adam_w_mode);
  EXPECT_TRUE(adam.optimizer.given);

  const DsConfig classic = optimizer({{"type", "adam"}, {"params", {{"adam_w_mode", false}}}});
  EXPECT_EQ(classic.optimizer.type, "Adam");
  EXPECT_FALSE(classic.optimizer.adam_w_mode);

  const DsConfig adamw = optimizer({{"type", "ADAMW"}, {"params", {{"adam_w_mode", false}}}});
  EXPECT_EQ(adamw.optimizer.type, "AdamW");
  EXPECT_TRUE(adamw.optimizer.adam_w_mode);
  EXPECT_EQ(adamw.warnings, std::vector<std::string>{
                                "optimizer.params.adam_w_mode false ignored: AdamW always decouples weight decay"});
}

TEST(DsConfigOptimizer, ReadsParamsAndDefaultsWithoutASection) {
  const DsConfig c = parse(with({{"optimizer",
                                  {{"type", "AdamW"},
                                   {"params",
                                    {{"lr", 3e-4},
                                     {"betas", {0.8, 0.95}},
                                     {"eps", 1e-6},
                                     {"weight_decay", 0.1},
                                     {"bias_correction", false},
                                     {"torch_adam", true}}}}}}));
  EXPECT_EQ(fields(c.optimizer),
            fields(OptimizerConfig{"AdamW", OptimizerKind::kAdamW, 3e-4, 0.8, 0.95, 1e-6, 0.1, true, false, true}));
  EXPECT_TRUE(c.warnings.empty());

  const OptimizerConfig defaults = parse(with()).optimizer;
  EXPECT_EQ(fields(defaults),
            fields(OptimizerConfig{"AdamW", OptimizerKind::kAdamW, 1e-3, 0.9, 0.999, 1e-8, 0.0, true, true, false}));
}

TEST(DsConfigOptimizer, RejectsUnsupportedTypesMaxGradNormAndBadBetas) {
  for (const char* type : {"SGD", "Lamb", "OneBitAdam"}) {
    const std::string message = error_of(with({{"optimizer", {{"type", type}}}}));
    EXPECT_TRUE(Contains(message, std::string("optimizer.type '") + type + "' is not supported"));
    EXPECT_TRUE(Contains(message, "supported: Adam, AdamW, Lion"));
  }
  const std::string clip = error_of(with({{"optimizer", {{"type", "Adam"}, {"params", {{"max_grad_norm", 1.0}}}}}}));
  EXPECT_TRUE(Contains(clip, "optimizer.params.max_grad_norm"));
  EXPECT_TRUE(Contains(clip, "gradient_clipping"));
  for (const json& betas : {json{0.9}, json{0.9, 1.0}, json{0.9, "x"}, json(0.9)}) {
    EXPECT_TRUE(Contains(error_of(with({{"optimizer", {{"params", {{"betas", betas}}}}}})), "optimizer.params.betas"))
        << betas.dump();
  }
}

// DeepSpeed's "Lion" (any case): lr, betas and weight_decay; the settings only Adam has are refused, as
// DeepSpeed's Lion constructor would refuse them.
TEST(DsConfigOptimizer, ReadsLionWithItsOwnParams) {
  const DsConfig c = parse(with(
      {{"optimizer", {{"type", "lion"}, {"params", {{"lr", 1e-4}, {"betas", {0.95, 0.98}}, {"weight_decay", 1.0}}}}}}));
  EXPECT_EQ(c.optimizer.type, "Lion");
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kLion);
  EXPECT_EQ(c.optimizer.lr, 1e-4);
  EXPECT_EQ(c.optimizer.beta1, 0.95);
  EXPECT_EQ(c.optimizer.beta2, 0.98);
  EXPECT_EQ(c.optimizer.weight_decay, 1.0);
  EXPECT_TRUE(c.warnings.empty());
  for (const char* key : {"eps", "adam_w_mode", "bias_correction", "amsgrad"}) {
    const json value = std::string(key) == "eps" ? json(1e-8) : json(true);
    const std::string message = error_of(with({{"optimizer", {{"type", "Lion"}, {"params", {{key, value}}}}}}));
    EXPECT_TRUE(Contains(message, std::string("optimizer.params.") + key)) << message;
    EXPECT_TRUE(Contains(message, "Lion takes lr, betas and weight_decay")) << message;
  }
  EXPECT_EQ(parse(with({{"optimizer", {{"type", "AdamW"}}}})).optimizer.kind, OptimizerKind::kAdamW);
  EXPECT_EQ(parse(with({{"optimizer", {{"type", "Adam"}}}})).optimizer.kind, OptimizerKind::kAdamW);
}

TEST(DsConfigScheduler, ReadsEachTypeWithItsParams) {
  EXPECT_EQ(parse(with()).scheduler.type, SchedulerType::kNone);

  const SchedulerConfig warmup = parse(with({{"scheduler",
                                              {{"type", "WarmupLR"},
                                               {"params",
                                                {{"warmup_min_lr", 1e-5},
                                                 {"warmup_max_lr", 3e-4},
                                                 {"warmup_num_steps", 100},
                                                 {"warmup_type", "linear"}}}}}}))
                                     .scheduler;
  EXPECT_EQ(warmup.type, SchedulerType::kWarmupLR);
  EXPECT_EQ(warmup.warmup_min_lr, 1e-5);
  EXPECT_EQ(warmup.warmup_max_lr, 3e-4);
  EXPECT_EQ(warmup.warmup_num_steps, 100);
  EXPECT_EQ(warmup.warmup_type, "linear");

  const SchedulerConfig decay =
      parse(with({{"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 1000}}}}}})).scheduler;
  EXPECT_EQ(decay.type, SchedulerType::kWarmupDecayLR);
  EXPECT_EQ(decay.total_num_steps, 1000);
  EXPECT_FALSE(decay.warmup_max_lr.has_value());
  EXPECT_EQ(decay.warmup_type, "log");

  const SchedulerConfig cosine = parse(with({{"scheduler",
                                              {{"type", "WarmupCosineLR"},
                                               {"params",
                                                {{"total_num_steps", 500},
                                                 {"warmup_min_ratio", 0.1},
                                                 {"cos_min_ratio", 0.01},
                                                 {"warmup_num_steps", 50}}}}}}))
                                     .scheduler;
  EXPECT_EQ(cosine.type, SchedulerType::kWarmupCosineLR);
  EXPECT_EQ(cosine.total_num_steps, 500);
  EXPECT_EQ(cosine.warmup_min_ratio, 0.1);
  EXPECT_EQ(cosine.cos_min_ratio, 0.01);
  EXPECT_EQ(cosine.warmup_num_steps, 50);
}

TEST(DsConfigScheduler, RejectsUnknownTypesMissingTotalAndBadWarmupType) {
  for (const char* type : {"OneCycle", "warmuplr"}) {  // DeepSpeed matches scheduler names exactly
    const std::string message = error_of(with({{"scheduler", {{"type", type}}}}));
    EXPECT_TRUE(Contains(message, std::string("scheduler.type '") + type + "' is not supported"));
    EXPECT_TRUE(Contains(message, "supported: WarmupLR, WarmupDecayLR, WarmupCosineLR"));
  }
  for (const char* type : {"WarmupDecayLR", "WarmupCosineLR"}) {
    EXPECT_EQ(error_of(with({{"scheduler", {{"type", type}}}})),
              std::string("config.json: scheduler.params.total_num_steps is required for ") + type);
  }
  EXPECT_EQ(error_of(with({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_type", "exp"}}}}}})),
            "config.json: scheduler.params.warmup_type is 'exp', must be log or linear");
}

TEST(DsConfigScalars, DefaultsAndBounds) {
  const DsConfig defaults = parse(with({{"steps_per_print", nullptr}}));
  EXPECT_EQ(defaults.gradient_clipping, 1.0);
  EXPECT_EQ(defaults.steps_per_print, 10);
  EXPECT_FALSE(defaults.wall_clock_breakdown);

  const DsConfig given =
      parse(with({{"gradient_clipping", 0}, {"steps_per_print", 50}, {"wall_clock_breakdown", true}}));
  EXPECT_EQ(given.gradient_clipping, 0.0);
  EXPECT_EQ(given.steps_per_print, 50);
  EXPECT_TRUE(given.wall_clock_breakdown);

  EXPECT_EQ(error_of(with({{"gradient_clipping", -1.0}})), "config.json: gradient_clipping is -1.0, must be >= 0.0");
  EXPECT_EQ(error_of(with({{"steps_per_print", 0}})), "config.json: steps_per_print is 0, must be >= 1");
}

TEST(DsConfigKeys, UnknownKeysWarnWithTheirPath) {
  DsConfig c = parse(with({{"foo", 1},
                           {"fp16", {{"bar", 1}}},
                           {"bf16", {{"baz", 1}}},
                           {"zero_optimization", {{"qux", 1}}},
                           {"optimizer", {{"type", "Adam"}, {"extra", 1}, {"params", {{"amsgrad2", false}}}}},
                           {"scheduler", {{"type", "WarmupLR"}, {"x", 1}, {"params", {{"total_num_steps", 9}}}}}}));
  std::vector<std::string> expected = {
      "unknown key 'foo' ignored",
      "unknown key 'fp16.bar' ignored",
      "unknown key 'bf16.baz' ignored",
      "unknown key 'zero_optimization.qux' ignored",
      "unknown key 'optimizer.extra' ignored",
      "unknown key 'optimizer.params.amsgrad2' ignored",
      "unknown key 'scheduler.x' ignored",
      "unknown key 'scheduler.params.total_num_steps' ignored",  // WarmupLR has no total
  };
  std::sort(c.warnings.begin(), c.warnings.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(c.warnings, expected);
}

TEST(DsConfigKeys, KnownButUnusedKeysAreSilent) {
  json config = with({{"fp16", {{"auto_cast", false}}},
                      {"bf16", {{"check_grad_overflow", true}}},
                      {"zero_optimization", {{"stage3_gather_16bit_weights_on_model_save", true}}},
                      {"optimizer", {{"type", "Adam"}, {"params", {{"torch_adam", false}}}}},
                      {"scheduler", {{"type", "WarmupLR"}, {"params", {{"last_batch_iteration", -1}}}}}});
  for (const char* key :
       {"zero_allow_untested_optimizer", "dump_state", "memory_breakdown", "sparse_gradients", "checkpoint",
        "data_types", "flops_profiler", "tensorboard", "wandb", "csv_monitor", "aio", "comms_logger"}) {
    config[key] = json::object();
  }
  config["prescale_gradients"] = false;
  config["gradient_predivide_factor"] = 1.0;
  EXPECT_EQ(parse(config).warnings, std::vector<std::string>{});
}

// The section turns the recomputation on (shardkit owns the model code that DeepSpeed leaves to the
// caller); cpu_checkpointing is kept; DeepSpeed's other keys are read, the ones that change nothing
// here say so when set, and the resolved config writes the section back.
TEST(DsConfigActivationCheckpointing, TheSectionTurnsItOnAndItsKeysAreRead) {
  EXPECT_FALSE(parse(with()).activation_checkpointing.enabled);
  EXPECT_FALSE(parse(with({{"activation_checkpointing", nullptr}})).activation_checkpointing.enabled);
  const DsConfig empty = parse(with({{"activation_checkpointing", json::object()}}));
  EXPECT_TRUE(empty.activation_checkpointing.enabled);
  EXPECT_FALSE(empty.activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(empty.warnings, std::vector<std::string>{});

  // DeepSpeed's documented section, as its examples write it.
  const DsConfig quiet = parse(with({{"activation_checkpointing",
                                      {{"partition_activations", false},
                                       {"cpu_checkpointing", true},
                                       {"contiguous_memory_optimization", true},
                                       {"number_checkpoints", 32},
                                       {"synchronize_checkpoint_boundary", false},
                                       {"profile", false}}}}));
  EXPECT_TRUE(quiet.activation_checkpointing.enabled);
  EXPECT_TRUE(quiet.activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(quiet.warnings, std::vector<std::string>{});
  const DsConfig back = parse(with({{"activation_checkpointing", to_json(quiet)["activation_checkpointing"]}}));
  EXPECT_TRUE(back.activation_checkpointing.enabled);
  EXPECT_TRUE(back.activation_checkpointing.cpu_checkpointing);
  EXPECT_FALSE(to_json(parse(with())).contains("activation_checkpointing"));

  const DsConfig noted = parse(with({{"activation_checkpointing",
                                      {{"partition_activations", true},
                                       {"synchronize_checkpoint_boundary", true},
                                       {"profile", true},
                                       {"number_checkpoints", nullptr},
                                       {"checkpoint_in_cpu", true}}}}));
  const std::vector<std::string> expected = {
      "activation_checkpointing.partition_activations ignored: it splits each checkpoint across model-parallel "
      "ranks, and shardkit has none: every rank keeps its own blocks' inputs",
      "activation_checkpointing.synchronize_checkpoint_boundary ignored: the recomputation is ordered on the GPU's "
      "stream, without host waits",
      "activation_checkpointing.profile ignored: wall_clock_breakdown times the passes (each block's recomputation "
      "counts in the backward pass)",
      "unknown key 'activation_checkpointing.checkpoint_in_cpu' ignored"};
  EXPECT_EQ(noted.warnings, expected);

  EXPECT_TRUE(Contains(error_of(with({{"activation_checkpointing", {{"cpu_checkpointing", "yes"}}}})),
                       "activation_checkpointing.cpu_checkpointing must be true or false"));
  EXPECT_TRUE(Contains(error_of(with({{"activation_checkpointing", {{"number_checkpoints", 0}}}})),
                       "activation_checkpointing.number_checkpoints is 0, must be >= 1"));
  EXPECT_TRUE(
      Contains(error_of(with({{"activation_checkpointing", true}})), "activation_checkpointing must be an object"));
}

TEST(DsConfigKeys, KeysDeepSpeedReadsAreNotUnknown) {
  // Keys of real configs that DeepSpeed 0.19's config classes read, each with a value that changes
  // nothing shardkit trains.
  const json config = with({{"disable_allgather", false},
                            {"compile", {{"deepcompile", false}}},
                            {"sequence_parallel_size", 1},
                            {"torch_autocast", {{"enabled", false}}},
                            {"progressive_layer_drop", {{"enabled", false}, {"theta", 0.5}}},
                            {"tensor_parallel", {{"autotp_size", 1}}},
                            {"comet", {{"enabled", false}}},
                            {"timers", {{"throughput", {{"enabled", true}}}}},
                            {"compression_training", {{"weight_quantization", {{"shared_parameters", {}}}}}},
                            {"data_efficiency", {{"enabled", false}}},
                            {"optimizer", {{"type", "AdamW"}, {"legacy_fusion", false}}},
                            {"zero_optimization",
                             {{"stage", 3},
                              {"gather_16bit_weights_on_model_save", true},
                              {"stage3_module_granularity_threshold", 0},
                              {"zero_quantized_weights", false},
                              {"zenflow", nullptr}}}});
  EXPECT_EQ(parse(config).warnings, std::vector<std::string>{});
}

TEST(DsConfigKeys, EnabledSettingsShardkitDoesNotImplementWarn) {
  const json config = with(
      {{"fp16", {{"enabled", true}, {"auto_cast", true}}},
       {"zero_optimization", {{"stage", 2}, {"zero_quantized_gradients", true}, {"zenflow", {{"topk_ratio", 0.1}}}}},
       {"amp", {{"enabled", true}}},
       {"progressive_layer_drop", {{"enabled", true}}},
       {"curriculum_learning", {{"enabled", true}}},
       {"data_efficiency", {{"enabled", true}}},
       {"compression_training",
        {{"weight_quantization", {{"shared_parameters", {{"enabled", true}}}}},
         {"sparse_pruning", {{"shared_parameters", {{"enabled", false}}}}},
         {"layer_reduction", {{"enabled", true}}}}}});
  std::vector<std::string> warnings = parse(config).warnings;
  std::vector<std::string> expected = {
      "fp16.auto_cast ignored: the model's inputs are token ids, never cast",
      "zero_optimization.zero_quantized_gradients ignored: gradients travel unquantized",
      "zero_optimization.zenflow ignored: every step updates every parameter",
      "amp.enabled ignored: Apex mixed precision is not implemented (fp16 and bf16 are)",
      "progressive_layer_drop.enabled ignored: every layer runs at every step",
      "curriculum_learning.enabled ignored: every sequence is trained at its full length",
      "data_efficiency.enabled ignored: no curriculum sampling or random layer-token drop; data is read in "
      "shardkit's order",
      "compression_training.weight_quantization ignored: the model trains uncompressed",
      "compression_training.layer_reduction ignored: the model trains uncompressed",
  };
  std::sort(warnings.begin(), warnings.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(warnings, expected);

  const DsConfig bf16 = parse(with(
      {{"bf16", {{"enabled", true}, {"bf16_master_weights_and_grads", true}}}, {"zero_optimization", {{"stage", 1}}}}));
  EXPECT_EQ(bf16.warnings, std::vector<std::string>{"bf16.bf16_master_weights_and_grads ignored: master weights and "
                                                    "gradients stay fp32"});
}

// What DeepSpeed prints or logs and shardkit does not, when enabled: a warning that says where
// shardkit's own figures are; the gradient accumulation type other than fp32: a warning that it stays
// fp32. The same sections disabled, or fp32, are silent.
TEST(DsConfigKeys, DiagnosticsShardkitDoesNotPrintWarnWhereItsOwnAre) {
  const json config = with({{"flops_profiler", {{"enabled", true}, {"profile_step", 1}, {"module_depth", -1}}},
                            {"comms_logger", {{"enabled", true}, {"verbose", false}}},
                            {"memory_breakdown", true},
                            {"autotuning", {{"enabled", true}}},
                            {"data_types", {{"grad_accum_dtype", "bf16"}}}});
  std::vector<std::string> warnings = parse(config).warnings;
  std::vector<std::string> expected = {
      "flops_profiler.enabled ignored: no FLOPs profile is printed; each step's line gives tokens/s, and on GPUs "
      "`train --profile-step N` puts one step in the CUDA profiler's range",
      "comms_logger.enabled ignored: collectives are not logged one by one; wall_clock_breakdown adds each step's "
      "reduction time to its line",
      "memory_breakdown ignored: the start-up lines give each rank's parameters, gradients, optimizer states and "
      "activations",
      "autotuning.enabled ignored: the batch and ZeRO settings run as the config gives them",
      "data_types.grad_accum_dtype ignored: gradients accumulate in fp32, not bf16",
  };
  std::sort(warnings.begin(), warnings.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(warnings, expected);

  const json quiet = with({{"flops_profiler", {{"enabled", false}}},
                           {"comms_logger", {{"enabled", false}}},
                           {"memory_breakdown", false},
                           {"autotuning", {{"enabled", false}}},
                           {"data_types", {{"grad_accum_dtype", "fp32"}}}});
  EXPECT_EQ(parse(quiet).warnings, std::vector<std::string>{});
  EXPECT_THROW(parse(with({{"data_types", {{"grad_accum_dtype", 16}}}})), Error);
}

TEST(DsConfigKeys, ModelParallelismIsRefused) {
  // Ignored, each rank would take a batch of its own: the batch keys would mean something else.
  EXPECT_EQ(error_of(with({{"sequence_parallel_size", 2}})),
            "config.json: sequence_parallel_size is 2, must be at most 1: shardkit parallelises over data only");
  EXPECT_EQ(error_of(with({{"tensor_parallel", {{"autotp_size", 4}}}})),
            "config.json: tensor_parallel.autotp_size is 4, must be at most 1: shardkit parallelises over data only");
}

TEST(DsConfigKeys, WrongTypesNameTheKey) {
  const std::vector<std::pair<json, std::string>> cases = {
      {with({{"train_batch_size", "32"}}), "config.json: train_batch_size must be an integer, got \"32\""},
      {with({{"zero_optimization", {{"stage", "2"}}}}), "config.json: zero_optimization.stage must be an integer"},
      {with({{"fp16", {{"enabled", 1}}}}), "config.json: fp16.enabled must be true or false, got 1"},
      {with({{"optimizer", {{"params", {{"lr", "fast"}}}}}}), "config.json: optimizer.params.lr must be a number"},
      {with({{"zero_optimization", {1, 2}}}), "config.json: zero_optimization must be an object, got array"},
      {with({{"scheduler", {{"type", 3}}}}), "config.json: scheduler.type must be a string, got 3"},
      {with({{"gradient_clipping", true}}), "config.json: gradient_clipping must be a number, got true"},
      {with({{"zero_optimization", {{"offload_optimizer", {{"pin_memory", "yes"}}}}}}),
       "config.json: zero_optimization.offload_optimizer.pin_memory must be true or false"},
      {json::array({1}), "config.json: the config must be an object, got array"},
  };
  for (const auto& [config, message] : cases) EXPECT_TRUE(Contains(error_of(config), message));
}

TEST(DsConfigRoundTrip, ParseOfToJsonGivesTheSameConfig) {
  const std::vector<json> configs = {
      json::parse(kSeedFp16),
      json::parse(kSeedAuto),
      with(
          {{"fp16",
            {{"enabled", true}, {"loss_scale", 1024.5}, {"consecutive_hysteresis", true}, {"min_loss_scale", 0.5}}},
           {"zero_optimization",
            {{"stage", 3},
             {"reduce_bucket_size", "auto"},
             {"sub_group_size", 1e6},
             {"offload_optimizer", {{"device", "cpu"}, {"pin_memory", true}}},
             {"offload_param", {{"device", "nvme"}, {"nvme_path", "/nvme"}}}}},
           {"optimizer",
            {{"type", "adam"}, {"params", {{"lr", 6e-4}, {"adam_w_mode", false}, {"betas", {0.9, 0.95}}}}}},
           {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 5000}, {"warmup_max_lr", 6e-4}}}}},
           {"gradient_clipping", 0.3},
           {"communication_data_type", "fp16"},
           {"steps_per_print", 7},
           {"wall_clock_breakdown", true}}),
      with({{"bf16", {{"enabled", true}}},
            {"communication_data_type", "bf16"},
            {"optimizer", {{"type", "AdamW"}}},
            {"scheduler",
             {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 100}, {"cos_min_ratio", 0.1}}}}}}),
      with({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_type", "linear"}}}}}}),
      with({{"activation_checkpointing", {{"cpu_checkpointing", true}, {"contiguous_memory_optimization", true}}}}),
  };
  for (const json& config : configs) {
    SCOPED_TRACE(config.dump());
    const DsConfig c = parse(config, 2, 64);
    const json out = to_json(c);
    const DsConfig back = parse(json::parse(out.dump()), 2, 64);  // through text, as a manifest stores it
    expect_same(c, back);
    EXPECT_TRUE(back.warnings.empty());
    EXPECT_EQ(to_json(back), out);
  }
}

TEST(DsConfigRoundTrip, ToJsonIsShapedLikeADeepSpeedConfig) {
  const json out = to_json(parse(json::parse(kSeedFp16), 2));
  EXPECT_EQ(out["train_batch_size"], 32);
  EXPECT_EQ(out["train_micro_batch_size_per_gpu"], 4);
  EXPECT_EQ(out["gradient_accumulation_steps"], 4);
  EXPECT_EQ(out["fp16"]["initial_scale_power"], 16);
  EXPECT_EQ(out["bf16"], (json{{"enabled", false}}));
  EXPECT_EQ(out["zero_optimization"]["stage3_prefetch_bucket_size"], 50'000'000);
  EXPECT_EQ(out["zero_optimization"]["offload_param"], (json{{"device", "none"}, {"pin_memory", false}}));
  EXPECT_EQ(out["gradient_clipping"], 1.0);
  EXPECT_EQ(out["steps_per_print"], 10);
  EXPECT_FALSE(out.contains("optimizer"));  // not given: left out, so that it reads back as not given
  EXPECT_FALSE(out.contains("scheduler"));

  const json adam = to_json(parse(with({{"optimizer", {{"type", "Adam"}}}, {"scheduler", {{"type", "WarmupLR"}}}})));
  EXPECT_EQ(adam["optimizer"]["type"], "Adam");
  EXPECT_EQ(adam["optimizer"]["params"]["betas"], json::array({0.9, 0.999}));
  EXPECT_EQ(adam["optimizer"]["params"]["adam_w_mode"], true);
  EXPECT_EQ(adam["scheduler"]["type"], "WarmupLR");
  EXPECT_FALSE(adam["scheduler"]["params"].contains("warmup_max_lr"));  // unset: the optimizer's lr
}

TEST(DsConfigLoad, ReadsAFileWithComments) {
  const TempDir dir;
  const std::filesystem::path file = dir.write("ds_config.json", R"(// ZeRO-1 on two ranks
{
  "train_batch_size": 16,  // global batch
  /* a block comment */
  "zero_optimization": {"stage": 1}
})");
  const DsConfig c = load_ds_config(file, 2, {});
  EXPECT_EQ(c.micro_batch_per_gpu, 8);
  EXPECT_EQ(c.zero.stage, 1);

  try {
    load_ds_config(file, 3, {});
    FAIL() << "inconsistent world size accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with(file.string() + ": train_batch_size 16 != ")) << e.what();
  }
}

TEST(DsConfigLoad, TrailingCommasAreAllowedAsDeepSpeedAllowsThem) {
  const DsConfig c = parse_ds_config_text(R"({
    "train_batch_size": 8, // a comment, then a trailing comma
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95,],},},
    "wandb": {"project": "a,}"},
  })",
                                          1, {}, kWhere);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_TRUE(c.warnings.empty());
  // Only a comma after a value trails; an empty element stays an error.
  for (const char* text : {R"({"train_batch_size": 8, "x": [,]})", R"({,})", R"({"train_batch_size": 8,,})"}) {
    SCOPED_TRACE(text);
    EXPECT_THROW(parse_ds_config_text(text, 1, {}, kWhere), Error);
  }
}

// DeepSpeed refuses a config whose object repeats a key; parsers disagree on which value would win.
TEST(DsConfigLoad, ADuplicateKeyIsRefusedNamingIt) {
  try {
    parse_ds_config_text(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 1e-4, "lr": 1e-3}}})", 1, {},
                         kWhere);
    FAIL() << "duplicate key accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_EQ(std::string(e.what()), std::string(kWhere) + ": duplicate key 'lr' in one object");
  }
  // The same key in two objects is no duplicate.
  EXPECT_NO_THROW(parse_ds_config_text(R"({"train_batch_size": 8, "a": {"enabled": true}, "b": {"enabled": true}})", 1,
                                       {}, kWhere));
}

TEST(DsConfigOptimizer, AmsgradIsRefusedAndPrescalingWarns) {
  EXPECT_TRUE(Contains(error_of(with({{"optimizer", {{"type", "Adam"}, {"params", {{"amsgrad", true}}}}}})),
                       "optimizer.params.amsgrad is true: AMSGrad is not implemented"));
  EXPECT_TRUE(parse(with({{"optimizer", {{"type", "Adam"}, {"params", {{"amsgrad", false}}}}}})).warnings.empty());
  const DsConfig c = parse(with({{"prescale_gradients", true}, {"gradient_predivide_factor", 2.0}}));
  EXPECT_EQ(c.warnings, (std::vector<std::string>{
                            "prescale_gradients ignored: gradients are averaged after their reduction",
                            "gradient_predivide_factor ignored: gradients are averaged after their reduction"}));
}

TEST(DsConfigLoad, MissingOrInvalidFilesAreInputErrors) {
  const TempDir dir;
  const std::vector<std::pair<std::filesystem::path, std::string>> cases = {
      {dir.path() / "absent.json", ": no such file"},
      {dir.write("broken.json", "{\n  \"train_batch_size\": 8\n  \"fp16\": {}\n}"),
       ": not valid JSON (syntax error at line 3, column 8, byte 34)"},
      {dir.write("empty.json", ""), ": not valid JSON (syntax error at line 1, column 1, byte 1)"},
      {dir.path(), ": not a regular file (a directory)"},
  };
  for (const auto& [file, suffix] : cases) {
    try {
      load_ds_config(file, 1, {});
      ADD_FAILURE() << file << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_EQ(e.what(), file.string() + suffix);
    }
  }
}

TEST(DsConfigLoad, SampleFilesHoldTheSeedConfigs) {
  struct Sample {
    const char* file;
    const char* text;
    int64_t train_batch_at_world_size_4;
  };
  // tests/trainer/ -> the repository root.
  const std::filesystem::path samples =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "samples" / "configs";
  for (const Sample& sample :
       {Sample{"seed_zero2_fp16.json", kSeedFp16, 32}, Sample{"seed_zero2_auto.json", kSeedAuto, 8}}) {
    SCOPED_TRACE(sample.file);
    std::ifstream in(samples / sample.file);
    ASSERT_TRUE(in) << "cannot open " << samples / sample.file;
    EXPECT_EQ(json::parse(in), json::parse(sample.text));
    EXPECT_EQ(load_ds_config(samples / sample.file, 4, {}).train_batch_size, sample.train_batch_at_world_size_4);
  }
}

TEST(DsConfigMonitor, SectionsAreReadWithDeepSpeedsDefaults) {
  const DsConfig none = parse(with());
  EXPECT_FALSE(none.monitor.tensorboard.enabled);
  EXPECT_FALSE(none.monitor.csv_monitor.enabled);
  EXPECT_EQ(none.monitor.tensorboard.folder(), "DeepSpeedJobName") << "output_path \"\": the working directory";
  const DsConfig c = parse(with({{"tensorboard", {{"enabled", true}, {"output_path", "runs/tb"}, {"job_name", "j"}}},
                                 {"csv_monitor", {{"enabled", true}}},
                                 {"wandb", {{"enabled", true}, {"project", "p"}, {"team", "t"}, {"group", "g"}}},
                                 {"comet", {{"enabled", false}, {"api_key", "k"}, {"samples_log_interval", 10}}}}));
  EXPECT_TRUE(c.monitor.tensorboard.enabled);
  EXPECT_EQ(c.monitor.tensorboard.folder(), std::filesystem::path("runs/tb/j"));
  EXPECT_TRUE(c.monitor.csv_monitor.enabled);
  EXPECT_EQ(c.monitor.csv_monitor.folder(), std::filesystem::path("DeepSpeedJobName"));
  EXPECT_TRUE(c.monitor.wandb);
  EXPECT_FALSE(c.monitor.comet);
  EXPECT_EQ(c.warnings, std::vector<std::string>{}) << "their services' settings are known keys";
  // Enabled outputs are part of the resolved config and read back the same.
  const DsConfig back = parse(to_json(c));
  EXPECT_EQ(back.monitor.tensorboard.folder(), c.monitor.tensorboard.folder());
  EXPECT_TRUE(back.monitor.csv_monitor.enabled);
}

TEST(DsConfigMonitor, WrongTypesAndUnknownKeysNameTheKey) {
  EXPECT_TRUE(Contains(error_of(with({{"tensorboard", {{"enabled", "yes"}}}})),
                       "config.json: tensorboard.enabled must be true or false, got \"yes\""));
  EXPECT_TRUE(Contains(error_of(with({{"csv_monitor", {{"enabled", true}, {"output_path", 5}}}})),
                       "config.json: csv_monitor.output_path must be a string, got 5"));
  EXPECT_TRUE(Contains(error_of(with({{"wandb", true}})), "config.json: wandb must be an object, got true"));
  EXPECT_EQ(parse(with({{"tensorboard", {{"enabled", false}, {"path", "x"}}}})).warnings,
            std::vector<std::string>{"unknown key 'tensorboard.path' ignored"});
}

}  // namespace
}  // namespace shardkit::trainer
