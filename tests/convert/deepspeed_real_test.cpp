// `convert import-deepspeed` against checkpoints that real DeepSpeed wrote (tests/data/deepspeed/, made
// by write_deepspeed_fixtures.py; its README says with which versions): every fixture comes in at its own
// world size and stage and at others, every value of every state (AdamW's, or Lion's for the -lion
// cases) bit for bit equal to what the live engine held when it saved (expected.safetensors), and the counters as
// DeepSpeed kept them (expected.json). GPT-2 and Llama fixtures name their model with the model.json beside them; the
// fixtures of a model no family knows are imported without a model, the tensor table taken from the
// checkpoint's param_shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/safetensors.hpp"
#include "convert/export_deepspeed.hpp"
#include "convert/import_checkpoint.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

using testing::TempDir;

const std::filesystem::path kDataDir = std::filesystem::path(SHARDKIT_TEST_DATA_DIR) / "deepspeed";

// The fixture folders (those holding expected.json), sorted; empty when the data folder is missing.
std::vector<std::string> fixture_names() {
  return testing::fixture_folders(kDataDir);
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

struct Parameter {
  std::string name;
  std::vector<int64_t> shape;
};

class DeepSpeedReal : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    folder_ = kDataDir / GetParam();
    expected_ = read_json(folder_ / "expected.json");
    for (const nlohmann::json& p : expected_.at("params")) {
      params_.push_back({p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>()});
    }
  }

  // The model to name: the fixture's model file, or none (the table comes from the checkpoint).
  std::string model() const {
    return expected_.at("model_file").is_null() ? std::string()
                                                : (folder_ / expected_.at("model_file").get<std::string>()).string();
  }

  static convert::ConvertOptions options() {
    convert::ConvertOptions o;
    o.threads = 2;
    o.piece_elems = 1000;  // pieces that cross the sources' partition and sub-group boundaries
    return o;
  }

  // Imports the fixture (or `source`, a DeepSpeed folder holding its values) at `world` ranks and
  // `stage` (the source's when empty) and checks the result. Returns the result's trainer_state.
  nlohmann::json import_and_compare(std::optional<int> world, std::optional<int> stage,
                                    const std::filesystem::path& source = {}) {
    const int want_world = world.value_or(expected_.at("world_size").get<int>());
    const int want_stage = stage.value_or(expected_.at("stage").get<int>());
    SCOPED_TRACE(GetParam() + " imported at " + std::to_string(want_world) + " rank(s), stage " +
                 std::to_string(want_stage) + (source.empty() ? "" : " from " + source.string()));
    convert::CheckpointImportRequest r;
    r.source = source.empty() ? folder_ : source;
    r.output = work_.path() / ("w" + std::to_string(want_world) + "s" + std::to_string(want_stage) +
                               (source.empty() ? "" : "-" + source.filename().string()));
    r.model = model();
    r.world_size = world;
    r.stage = stage;
    const convert::CheckpointImportResult result = convert::import_checkpoint(r, options());
    EXPECT_EQ(result.world_size, want_world);
    EXPECT_EQ(result.stage, want_stage);

    ckpt::CheckpointReader reader(result.step_dir);
    EXPECT_TRUE(reader.verify().ok());
    EXPECT_EQ(reader.layout().spec().world_size, want_world);
    EXPECT_EQ(reader.layout().spec().stage, want_stage);
    check_counters(reader.manifest());
    check_table(reader.tensors());
    testing::expect_states_equal_bitwise(reader, folder_ / "expected.safetensors");
    return reader.manifest().trainer_state;
  }

  void check_counters(const ckpt::Manifest& manifest) const {
    const nlohmann::json& c = expected_.at("counters");
    const nlohmann::json& ts = manifest.trainer_state;
    const int64_t steps = c.at("global_steps").get<int64_t>();
    EXPECT_EQ(manifest.step, steps);
    EXPECT_EQ(ts.at("step"), steps);
    EXPECT_EQ(ts.at("consumed_samples"), c.at("global_samples"));
    EXPECT_EQ(ts.at("skipped_steps"), c.at("skipped_steps"));
    EXPECT_EQ(ts.at("optimizer_steps"), c.at("adam_step"));
    // Without a DeepSpeed scheduler the checkpoint holds none, and the schedule continues from the step.
    const nlohmann::json& last = c.at("last_batch_iteration");
    EXPECT_EQ(ts.at("lr_scheduler").at("last_batch_iteration"), last.is_null() ? nlohmann::json(steps - 1) : last);
  }

  // A model family's table lists the parameters in the module's order; a table taken from the
  // checkpoint has the same names and shapes, in an order of its own.
  void check_table(const ckpt::TensorTable& table) const {
    ASSERT_EQ(table.size(), params_.size());
    std::map<std::string, std::vector<int64_t>> got;
    for (size_t i = 0; i < table.size(); ++i) {
      got[table[i].name] = table[i].shape;
      if (!model().empty()) {
        EXPECT_EQ(table[i].name, params_[i].name) << "tensor " << i;
      }
    }
    for (const Parameter& p : params_) {
      const auto it = got.find(p.name);
      ASSERT_NE(it, got.end()) << p.name << " is not in the imported table";
      EXPECT_EQ(it->second, p.shape) << p.name;
    }
  }

  std::filesystem::path folder_;
  nlohmann::json expected_;
  std::vector<Parameter> params_;
  TempDir work_;
};

TEST_P(DeepSpeedReal, ComesInBitForBitAtItsOwnWorldSizeAndStage) {
  import_and_compare({}, {});
}

TEST_P(DeepSpeedReal, ComesInBitForBitAtOtherWorldSizesAndStages) {
  import_and_compare(3, 1);
  import_and_compare(1, 3);
  import_and_compare(2, 0);
}

// DeepSpeed -> DeepSpeed at other world sizes and stages (and stage 3 with many sub-groups): what the
// export writes reads back bit for bit, with the same counters and the same parameter groups,
// hyperparameters, tied parameters and scheduler state (which DeepSpeed's load_checkpoint takes from
// the files). tests/interop/deepspeed_roundtrip.py loads such files in real DeepSpeed.
TEST_P(DeepSpeedReal, ExportedForOtherWorldSizesAndStagesReadsBackTheSame) {
  const nlohmann::json direct = import_and_compare({}, {});
  struct Target {
    int world;
    int stage;
    int64_t sub_group_size;
  };
  for (const Target& t : {Target{3, 1, 0}, Target{1, 3, 0}, Target{2, 2, 0}, Target{4, 3, 40}}) {
    convert::DeepSpeedExportRequest e;
    e.source = folder_;
    e.output = work_.path() / ("ds-w" + std::to_string(t.world) + "s" + std::to_string(t.stage));
    e.world_size = t.world;
    e.stage = t.stage;
    if (t.sub_group_size) e.sub_group_size = t.sub_group_size;
    const convert::DeepSpeedExportResult result = convert::export_deepspeed(e, options());
    EXPECT_EQ(result.world_size, t.world);
    EXPECT_EQ(result.stage, t.stage);
    EXPECT_EQ(result.tag_dir, e.output / expected_.at("tag").get<std::string>());
    const nlohmann::json back = import_and_compare(t.world, t.stage, e.output);
    EXPECT_EQ(back.at("deepspeed"), direct.at("deepspeed")) << "the run's groups, options or scheduler changed";
  }
  // ds_to_universal's layout, for load_universal: every tensor whole, one file per state.
  convert::DeepSpeedExportRequest e;
  e.source = folder_;
  e.output = work_.path() / "universal";
  e.world_size = 2;
  e.stage = 2;
  e.universal = true;
  const convert::DeepSpeedExportResult result = convert::export_deepspeed(e, options());
  EXPECT_EQ(result.tag_dir, e.output / (expected_.at("tag").get<std::string>() + "_universal"));
  EXPECT_TRUE(std::filesystem::is_regular_file(e.output / "latest_universal"));
  import_and_compare(1, 0, e.output);
  e.stage = 3;
  e.output = work_.path() / "universal-3";
  EXPECT_THROW(convert::export_deepspeed(e, options()), Error);
  EXPECT_FALSE(std::filesystem::exists(e.output));
}

// The fixtures' own bookkeeping: what the tests above rely on.
TEST_P(DeepSpeedReal, FixtureIsComplete) {
  const std::string tag = expected_.at("tag");
  std::ifstream latest(folder_ / "latest");
  const std::string pointer((std::istreambuf_iterator<char>(latest)), {});
  EXPECT_EQ(pointer, tag);
  const bool bf16 = expected_.at("dtype") == "bf16";
  const int world = expected_.at("world_size");
  for (int r = 0; r < world; ++r) {
    const std::string optim =
        std::string(bf16 ? "bf16_" : "") + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt";
    EXPECT_TRUE(std::filesystem::is_regular_file(folder_ / tag / optim)) << optim;
  }
  EXPECT_EQ(expected_.at("model_file").is_null(), expected_.at("model") == "net");
  // fp32 and the optimizer's moments: AdamW's two, Lion's one (a client Lion's or DeepSpeed's FusedLion).
  const size_t states = expected_.value("optimizer", std::string("adamw")) == "adamw" ? 3 : 2;
  const ckpt::safetensors::Reader values(folder_ / "expected.safetensors");
  EXPECT_EQ(values.header().tensors.size(), states * params_.size());
}

const std::vector<std::string> kFixtures = fixture_names();

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepSpeedReal, ::testing::ValuesIn(kFixtures),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeepSpeedReal);

// Without the data folder the tests above have no instances; this says so instead of passing quietly.
TEST(DeepSpeedRealData, FixturesArePresent) {
  if (kFixtures.empty()) {
    GTEST_SKIP() << "no DeepSpeed fixtures in " << kDataDir
                 << " (tests/data/deepspeed/ of the source tree; write_deepspeed_fixtures.py makes them)";
  }
  EXPECT_GE(kFixtures.size(), 12u);
}

// A folder whose ranks saved two optimizers' states (rank 1's file from the Lion run of the same model,
// stage, dtype and world size) is refused naming that file, and nothing is written.
TEST(DeepSpeedRealData, RanksHoldingAnotherOptimizersStatesAreRefusedByFile) {
  const std::filesystem::path adam = kDataDir / "gpt2-s2-bf16-w2", lion = kDataDir / "gpt2-s2-bf16-w2-lion";
  if (!std::filesystem::exists(adam) || !std::filesystem::exists(lion)) GTEST_SKIP() << "no fixtures in " << kDataDir;
  TempDir tmp;
  const std::filesystem::path mixed = tmp / "mixed";
  std::filesystem::copy(adam, mixed, std::filesystem::copy_options::recursive);
  const std::string rank1 = "global_step3/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt";
  std::filesystem::copy_file(lion / rank1, mixed / rank1, std::filesystem::copy_options::overwrite_existing);
  convert::CheckpointImportRequest r;
  r.source = mixed;
  r.output = tmp / "out";
  r.model = (adam / "model.json").string();
  try {
    convert::import_checkpoint(r, convert::ConvertOptions{});
    ADD_FAILURE() << "imported";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"), std::string::npos) << what;
    EXPECT_NE(what.find("holds 1 optimizer moment(s) where the first holds 2"), std::string::npos) << what;
  }
  EXPECT_FALSE(std::filesystem::exists(r.output));
}

}  // namespace
}  // namespace shardkit
