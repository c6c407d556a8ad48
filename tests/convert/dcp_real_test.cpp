// PyTorch Distributed Checkpoint folders that real PyTorch wrote (tests/data/dcp/, made by
// write_dcp_fixtures.py with FSDP2 and AdamW; its README says with which versions) come in without
// Python: every weight and moment bit for bit equal to what the live run held (expected.safetensors), at
// the saving world size and at others, in both key layouts (get_state_dict's and torchtitan's), for a
// model shardkit knows and for one it does not; the step, the optimizer's parameter groups and the tied
// output projection as PyTorch kept them (expected.json). From there they chain to consolidated weights
// and to DeepSpeed's files. Damaged or crafted folders are refused naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/safetensors.hpp"
#include "convert/consolidate.hpp"
#include "convert/export_dcp.hpp"
#include "convert/export_deepspeed.hpp"
#include "convert/import_checkpoint.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

using testing::TempDir;

const std::filesystem::path kDataDir = std::filesystem::path(SHARDKIT_TEST_DATA_DIR) / "dcp";
// The GPT-2 the DCP fixtures trained is the DeepSpeed fixtures' (one model definition makes both).
const std::filesystem::path kGpt2Model =
    std::filesystem::path(SHARDKIT_TEST_DATA_DIR) / "deepspeed" / "gpt2-s1-fp32-w2" / "model.json";

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

convert::ConvertOptions options() {
  convert::ConvertOptions o;
  o.threads = 2;
  o.piece_elems = 100;  // pieces that cross the ranks' chunk boundaries
  return o;
}

class DcpReal : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    folder_ = kDataDir / GetParam();
    expected_ = read_json(folder_ / "expected.json");
  }
  std::filesystem::path dcp() const { return folder_ / "dcp"; }
  bool gpt2() const { return expected_.at("model") == "gpt2"; }

  // Imports `source` (the fixture's DCP folder by default) at `world` ranks and `stage` and checks every
  // value, the table and the counters. Returns the manifest's trainer_state.
  nlohmann::json import_and_compare(std::optional<int> world, std::optional<int> stage, const std::string& model = {},
                                    const std::filesystem::path& source = {},
                                    convert::SourceFormat format = convert::SourceFormat::kDcp) {
    const int want_world = world.value_or(expected_.at("world_size").get<int>());
    const int want_stage = stage.value_or(3);
    SCOPED_TRACE(GetParam() + " at " + std::to_string(want_world) + " rank(s), stage " + std::to_string(want_stage) +
                 (model.empty() ? "" : " as " + model) + (source.empty() ? "" : " from " + source.string()));
    convert::CheckpointImportRequest r;
    r.source = source.empty() ? dcp() : source;
    r.format = format;
    r.output = work_ / ("import-" + std::to_string(++imports_));
    r.model = model;
    r.world_size = world;
    r.stage = stage;
    const convert::CheckpointImportResult result = convert::import_checkpoint(r, options());
    EXPECT_EQ(result.world_size, want_world);
    EXPECT_EQ(result.stage, want_stage);
    EXPECT_EQ(result.step, expected_.at("adam_step").get<int64_t>());

    ckpt::CheckpointReader reader(result.step_dir);
    EXPECT_TRUE(reader.verify().ok());
    const nlohmann::json& ts = reader.manifest().trainer_state;
    EXPECT_EQ(ts.at("optimizer_steps"), expected_.at("adam_step"));
    // The parameters with the shapes PyTorch had; from DCP in the module's order (DeepSpeed's files
    // order them by parameter group).
    const ckpt::TensorTable& table = reader.tensors();
    const nlohmann::json& params = expected_.at("params");
    EXPECT_EQ(table.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string name = params[i].at("name").get<std::string>();
      const int t = table.find(name);
      EXPECT_GE(t, 0) << name << " is not in the imported table";
      if (t < 0) continue;
      if (format == convert::SourceFormat::kDcp) {
        EXPECT_EQ(t, static_cast<int>(i)) << name;
      }
      EXPECT_EQ(table[static_cast<size_t>(t)].shape, params[i].at("shape").get<std::vector<int64_t>>()) << name;
    }
    testing::expect_states_equal_bitwise(reader, folder_ / "expected.safetensors");
    return ts;
  }

  std::filesystem::path folder_;
  nlohmann::json expected_;
  TempDir work_;
  int imports_ = 0;
};

TEST_P(DcpReal, ComesInBitForBitAtItsOwnWorldSize) {
  import_and_compare({}, {});
}

TEST_P(DcpReal, ComesInBitForBitAtOtherWorldSizesAndStages) {
  import_and_compare(1, 0);
  import_and_compare(3, 1);
  import_and_compare(4, 2);
}

TEST_P(DcpReal, AModelShardkitKnowsChecksTheNames) {
  if (!gpt2()) GTEST_SKIP() << "a model of no family: see ComesInBitForBitAtItsOwnWorldSize";
  import_and_compare(2, 1, kGpt2Model.string());
  // A Llama is not what was trained.
  convert::CheckpointImportRequest r;
  r.source = dcp();
  r.format = convert::SourceFormat::kDcp;
  r.output = work_ / "llama";
  r.model = "llama-tiny";
  try {
    convert::import_checkpoint(r, options());
    ADD_FAILURE() << "imported GPT-2 as a Llama";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".metadata"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(r.output));
}

// The optimizer's parameter groups and hyperparameters, and the output projection GPT-2 ties to the
// token embedding, travel with the import (an export to DeepSpeed writes them back).
TEST_P(DcpReal, GroupsHyperparametersAndTiedNamesComeAlong) {
  const nlohmann::json ts = import_and_compare({}, {});
  const nlohmann::json& run = ts.at("deepspeed");
  const nlohmann::json& groups = run.at("param_groups");
  ASSERT_EQ(groups.size(), 2u);
  std::map<std::string, int> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& name : groups[g].at("params")) group_of[name.get<std::string>()] = static_cast<int>(g);
    EXPECT_EQ(groups[g].at("options").at("lr"), 3e-3);
    EXPECT_EQ(groups[g].at("options").at("betas"), nlohmann::json({0.9, 0.95}));
    EXPECT_EQ(groups[g].at("options").at("eps"), 1e-8);
    EXPECT_EQ(groups[g].at("options").at("weight_decay"), g == 0 ? 0.1 : 0.0);
  }
  for (const nlohmann::json& p : expected_.at("params")) {
    EXPECT_EQ(group_of[p.at("name").get<std::string>()], p.at("group").get<int>()) << p.at("name");
  }
  if (gpt2()) {
    EXPECT_EQ(run.at("shared_params"), nlohmann::json({{"lm_head.weight", "transformer.wte.weight"}}));
  } else {
    EXPECT_TRUE(run.at("shared_params").empty());
  }
}

// DCP -> consolidated safetensors in one pass, no import in between: the weights PyTorch had.
TEST_P(DcpReal, ConsolidatesStraightToSafetensors) {
  convert::ConsolidateRequest c;
  c.source = dcp();
  c.output = work_ / "hf";
  c.with_optimizer = true;
  convert::consolidate(c, options());
  const ckpt::safetensors::Reader got(c.output / "model.safetensors");
  const ckpt::safetensors::Reader want(folder_ / "expected.safetensors");
  for (const nlohmann::json& p : expected_.at("params")) {
    const std::string name = p.at("name").get<std::string>();
    for (const std::string& state : {std::string("fp32"), std::string("exp_avg"), std::string("exp_avg_sq")}) {
      const std::string key = state == "fp32" ? name : "optimizer." + state + "." + name;
      const ckpt::safetensors::TensorInfo* g = got.header().find(key);
      const ckpt::safetensors::TensorInfo* w = want.header().find(state + "/" + name);
      ASSERT_NE(g, nullptr) << key;
      ASSERT_NE(w, nullptr) << name;
      ASSERT_EQ(g->shape, w->shape) << key;
      std::vector<std::byte> a(g->size()), b(w->size());
      got.read(*g, 0, a);
      want.read(*w, 0, b);
      EXPECT_TRUE(a == b) << key << " differs";
    }
  }
}

// DCP -> DeepSpeed for one rank (ZeRO-2) and back: the same values, counters and groups.
TEST_P(DcpReal, ExportsToDeepSpeedAndReadsBackTheSame) {
  const nlohmann::json direct = import_and_compare({}, {});
  convert::DeepSpeedExportRequest e;
  e.source = dcp();
  e.output = work_ / "ds";
  e.world_size = 1;
  e.stage = 2;
  convert::export_deepspeed(e, options());
  const nlohmann::json back = import_and_compare(1, 2, {}, e.output, convert::SourceFormat::kDeepSpeed);
  EXPECT_EQ(back.at("deepspeed").at("param_groups"), direct.at("deepspeed").at("param_groups"));
  EXPECT_EQ(back.at("deepspeed").at("shared_params"), direct.at("deepspeed").at("shared_params"));
}

// DCP -> DCP for other world sizes (FSDP2's dim-0 chunks for each): the same values, step, groups
// and tied names read back. tests/interop/dcp_roundtrip.py loads such files in real PyTorch.
TEST_P(DcpReal, ExportedForOtherWorldSizesReadsBackTheSame) {
  const nlohmann::json direct = import_and_compare({}, {});
  for (int world : {1, 3, 4}) {
    convert::DcpExportRequest e;
    e.source = dcp();
    e.output = work_ / ("dcp-w" + std::to_string(world));
    e.world_size = world;
    const convert::DcpExportResult result = convert::export_dcp(e, options());
    EXPECT_EQ(result.world_size, world);
    EXPECT_EQ(result.step, expected_.at("adam_step").get<int64_t>());
    const nlohmann::json back = import_and_compare(world, {}, {}, e.output);
    EXPECT_EQ(back.at("deepspeed").at("param_groups"), direct.at("deepspeed").at("param_groups"));
    EXPECT_EQ(back.at("deepspeed").at("shared_params"), direct.at("deepspeed").at("shared_params"));
  }
}

std::vector<std::string> fixture_names() {
  return testing::fixture_folders(kDataDir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DcpReal, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// A copy of a fixture's DCP folder to damage.
std::filesystem::path copy_fixture(const TempDir& work, const std::string& name) {
  const std::filesystem::path to = work / name;
  std::filesystem::copy(kDataDir / name / "dcp", to, std::filesystem::copy_options::recursive);
  return to;
}

// Replaces the first `from` in `file` (every one with `all`) with `to`, of the same length.
void patch(const std::filesystem::path& file, const std::string& from, const std::string& to, bool all = false) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from << " is not in " << file;
  for (; at != std::string::npos; at = all ? bytes.find(from, at + to.size()) : std::string::npos) {
    bytes.replace(at, from.size(), to);
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

// Expects importing `folder` to fail with a message holding every one of `fragments`, leaving nothing.
void expect_refused(const TempDir& work, const std::filesystem::path& folder, std::vector<std::string> fragments) {
  convert::CheckpointImportRequest r;
  r.source = folder;
  r.format = convert::SourceFormat::kDcp;
  r.output = work / "out";
  try {
    convert::import_checkpoint(r, options());
    ADD_FAILURE() << "imported " << folder;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(r.output));
}

// PyTorch's writer with several threads writes __<rank>_<n>.distcp: the ranks, not the files, are the
// world size an import defaults to.
TEST(DcpFolder, TheFilesOfOneRankCountOnce) {
  if (fixture_names().empty()) GTEST_SKIP() << "no fixtures in " << kDataDir;
  TempDir work;
  const auto f = copy_fixture(work, "net-w2");
  std::filesystem::rename(f / "__1_0.distcp", f / "__0_1.distcp");
  patch(f / ".metadata", "__1_0.distcp", "__0_1.distcp", true);
  convert::CheckpointImportRequest r;
  r.source = f;
  r.format = convert::SourceFormat::kDcp;
  r.output = work / "out";
  EXPECT_EQ(convert::import_checkpoint(r, options()).world_size, 1);
}

// A checkpoint of the weights alone (here: the optimizer's entries renamed out of the way, as under
// torchtitan's train_state) imports as `convert import` makes a start: the weights, zero moments, step 0.
TEST(DcpFolder, WeightsAloneImportAsAStart) {
  if (fixture_names().empty()) GTEST_SKIP() << "no fixtures in " << kDataDir;
  TempDir work;
  const auto f = copy_fixture(work, "net-w2");
  patch(f / ".metadata", "optim.state.", "train_state.", true);
  convert::CheckpointImportRequest r;
  r.source = f;
  r.format = convert::SourceFormat::kDcp;
  r.output = work / "out";
  const convert::CheckpointImportResult result = convert::import_checkpoint(r, options());
  EXPECT_EQ(result.step, 0);
  ckpt::CheckpointReader reader(result.step_dir);
  EXPECT_EQ(reader.manifest().trainer_state.at("optimizer_steps"), 0);
  const ckpt::safetensors::Reader expected(kDataDir / "net-w2" / "expected.safetensors");
  ASSERT_EQ(reader.tensors().size(), read_json(kDataDir / "net-w2" / "expected.json").at("params").size());
  for (size_t t = 0; t < reader.tensors().size(); ++t) {
    const ckpt::TensorInfo& tensor = reader.tensors()[t];
    const ckpt::safetensors::TensorInfo* info = expected.header().find("fp32/" + tensor.name);
    ASSERT_NE(info, nullptr) << tensor.name;
    std::vector<float> want(static_cast<size_t>(tensor.numel())), got(want.size()), moment(want.size(), 1.0f);
    expected.read(*info, 0, std::as_writable_bytes(std::span<float>(want)));
    reader.read(static_cast<int>(t), reader.find_state("fp32"), 0, got);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << tensor.name;
    reader.read(static_cast<int>(t), reader.find_state("exp_avg"), 0, moment);
    EXPECT_TRUE(std::all_of(moment.begin(), moment.end(), [](float v) { return v == 0.0f; })) << tensor.name;
  }
}

TEST(DcpUntrusted, DamagedAndCraftedFoldersAreRefusedNamingTheFile) {
  if (fixture_names().empty()) GTEST_SKIP() << "no fixtures in " << kDataDir;
  TempDir work;
  {  // A rank's file missing.
    const auto f = copy_fixture(work, "net-w2");
    std::filesystem::remove(f / "__1_0.distcp");
    expect_refused(work, f, {"__1_0.distcp"});
    std::filesystem::remove_all(f);
  }
  {  // A rank's file cut short.
    const auto f = copy_fixture(work, "net-w2");
    std::filesystem::resize_file(f / "__0_0.distcp", 1000);
    expect_refused(work, f, {"__0_0.distcp", "truncated"});
    std::filesystem::remove_all(f);
  }
  {  // A global outside DCP's metadata classes.
    const auto f = copy_fixture(work, "net-w2");
    patch(f / ".metadata", "torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.metadatX");
    expect_refused(work, f,
                   {".metadata", "refused the Python global 'torch.distributed.checkpoint.metadatX.Metadata'"});
    std::filesystem::remove_all(f);
  }
  {  // A storage location leading out of the folder.
    const auto f = copy_fixture(work, "net-w2");
    patch(f / ".metadata", "__0_0.distcp", "../0_0.distc");
    expect_refused(work, f, {".metadata", "../0_0.distc"});
    std::filesystem::remove_all(f);
  }
  {  // No .metadata at all: not a DCP folder.
    const auto f = copy_fixture(work, "net-w2");
    std::filesystem::remove(f / ".metadata");
    expect_refused(work, f, {"no .metadata"});
    std::filesystem::remove_all(f);
  }
}

}  // namespace
}  // namespace shardkit
