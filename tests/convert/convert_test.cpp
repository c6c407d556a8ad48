// The converters: reshard chains keep every number bit for bit; consolidated safetensors follow the
// published byte layout with GPT-2's names, shapes and correctly rounded bf16/fp16; sharded output
// equals the single file; import then consolidate gives back the same bytes; bad input leaves nothing
// behind.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <fstream>
#include <functional>
#include <random>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/diff.hpp"
#include "ckpt/dtype_convert.hpp"
#include "ckpt/h5.hpp"
#include "ckpt/safetensors.hpp"
#include "ckpt/synthetic.hpp"
#include "convert/consolidate.hpp"
#include "convert/export_dcp.hpp"
#include "convert/export_deepspeed.hpp"
#include "convert/import.hpp"
#include "convert/import_checkpoint.hpp"
#include "convert/reshard.hpp"
#include "model/gpt2/config.hpp"
#include "model/gpt2/hf.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

namespace st = ckpt::safetensors;
using testing::TempDir;

constexpr uint64_t kSeed = 31;

convert::ConvertOptions small_pieces(int threads = 2) {
  convert::ConvertOptions o;
  o.threads = threads;
  o.piece_elems = 1000;  // many pieces per fragment: boundaries everywhere
  return o;
}

// A GPT-2 checkpoint of synthetic values (small custom config) laid out by `spec`.
model::gpt2::GptConfig small_gpt2() {
  model::gpt2::GptConfig c{2, 2, 32, 97, 24, "test"};
  return c;
}

std::filesystem::path gpt2_checkpoint(const std::filesystem::path& run_dir, const ckpt::LayoutSpec& spec,
                                      int compression = 0) {
  const model::gpt2::GptConfig c = small_gpt2();
  ckpt::ShardOptions options;
  options.chunk_elems = 333;
  options.compression_level = compression;
  return testing::write_synthetic_checkpoint(run_dir, model::gpt2::tensor_table(c), spec, options, kSeed, 7,
                                             model::gpt2::to_json(c));
}

void expect_identical(const std::filesystem::path& a, const std::filesystem::path& b) {
  ckpt::CheckpointReader ra(a), rb(b);
  const ckpt::DiffReport d = ckpt::diff_checkpoints(ra, rb);
  ASSERT_TRUE(d.within(0.0)) << a << " vs " << b;
  for (const auto& e : d.entries) ASSERT_EQ(e.differing, 0) << e.tensor << " " << e.state;
  EXPECT_EQ(ra.manifest().step, rb.manifest().step);
  EXPECT_EQ(ra.manifest().model, rb.manifest().model);
}

TEST(Reshard, ChainsOfWorldSizesAndStagesKeepEveryBit) {
  TempDir dir;
  const auto source = gpt2_checkpoint(dir / "src", {2, 2, 16});
  std::mt19937 rng(11);
  // The chain of the issue, then a random one.
  std::vector<std::pair<int, int>> chain = {{5, 3}, {1, 1}, {3, 0}};
  for (int i = 0; i < 5; ++i) chain.emplace_back(1 + static_cast<int>(rng() % 7), static_cast<int>(rng() % 4));
  std::filesystem::path previous = source;
  int hop = 0;
  for (const auto& [world, stage] : chain) {
    convert::ReshardRequest r;
    r.source = previous;
    r.output = dir / ("hop" + std::to_string(hop++));
    r.world_size = world;
    r.stage = stage;
    r.compression_level = hop % 2;  // alternate compressed and raw shards
    const auto step_dir = convert::reshard(r, small_pieces(hop % 3 + 1));
    ckpt::CheckpointReader reader(step_dir);
    EXPECT_EQ(reader.manifest().layout.world_size, world);
    EXPECT_EQ(reader.manifest().layout.stage, stage);
    EXPECT_TRUE(reader.verify().ok());
    expect_identical(source, step_dir);
    previous = r.output;  // a run directory: `latest` is followed
  }
}

TEST(Reshard, RefusesAnExistingOutputUnlessForcedAndLeavesNothingHalfWritten) {
  TempDir dir;
  const auto source = gpt2_checkpoint(dir / "src", {2, 1, 16});
  convert::ReshardRequest r;
  r.source = source;
  r.output = dir / "out";
  r.world_size = 3;
  std::filesystem::create_directories(r.output);
  std::ofstream(r.output / "keep.txt") << "mine";
  EXPECT_THROW(convert::reshard(r, small_pieces()), Error);
  EXPECT_TRUE(std::filesystem::exists(r.output / "keep.txt"));
  // A damaged source fails the conversion: the old output stays, no partial folder is left.
  const auto shard = source / "shard-00001-of-00002.h5";
  const auto chunk = testing::chunk_extent(shard, "exp_avg", 0);
  testing::flip_bit(shard, chunk.offset + 8);
  auto forced = small_pieces();
  forced.force = true;
  EXPECT_THROW(convert::reshard(r, forced), Error);
  EXPECT_TRUE(std::filesystem::exists(r.output / "keep.txt"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << e.path();
  }
}

// The tensors of a safetensors file, decoded by its header.
std::map<std::string, std::vector<std::byte>> tensor_bytes(const std::filesystem::path& file) {
  const st::Reader reader(file);
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& t : reader.header().tensors) {
    std::vector<std::byte> bytes(t.size());
    reader.read(t, 0, bytes);
    out[t.name] = std::move(bytes);
  }
  return out;
}

TEST(Consolidate, SafetensorsHaveGpt2NamesShapesAndCorrectlyRoundedValues) {
  TempDir dir;
  const auto source = gpt2_checkpoint(dir / "src", {3, 3, 16}, 2);
  const model::gpt2::GptConfig c = small_gpt2();
  const ckpt::TensorTable table = model::gpt2::tensor_table(c);
  for (auto dtype : {ckpt::DType::kF32, ckpt::DType::kBF16, ckpt::DType::kF16}) {
    convert::ConsolidateRequest r;
    r.source = source;
    r.output = dir / ("out" + std::to_string(static_cast<int>(dtype)));
    r.dtype = dtype;
    convert::consolidate(r, small_pieces());
    const st::Reader reader(r.output / "model.safetensors");  // parse_header validates the byte layout
    EXPECT_EQ(reader.header().metadata.at("format"), "pt");
    ASSERT_EQ(reader.header().tensors.size(), table.size()) << "lm_head (tied) must not be written";
    for (size_t t = 0; t < table.size(); ++t) {
      const st::TensorInfo* info = reader.header().find(table[t].name);
      ASSERT_NE(info, nullptr) << table[t].name;
      EXPECT_EQ(info->shape, table[t].shape);
      std::vector<std::byte> bytes(info->size());
      reader.read(*info, 0, bytes);
      for (int64_t i = 0; i < table[t].numel(); ++i) {
        const float want = ckpt::synthetic_value(kSeed, static_cast<int>(t), 0, i);
        if (dtype == ckpt::DType::kF32) {
          float got;
          std::memcpy(&got, bytes.data() + i * 4, 4);
          ASSERT_EQ(got, want);
        } else {
          uint16_t got;
          std::memcpy(&got, bytes.data() + i * 2, 2);
          ASSERT_EQ(got, dtype == ckpt::DType::kBF16 ? ckpt::fp32_to_bf16(want) : ckpt::fp32_to_fp16(want));
        }
      }
    }
    std::ifstream cfg(r.output / "config.json");
    const nlohmann::json config = nlohmann::json::parse(cfg);
    EXPECT_EQ(model::gpt2::config_from_hf(config, "config.json"), c);
    EXPECT_EQ(config["architectures"][0], "GPT2LMHeadModel");
  }
}

TEST(Consolidate, ShardedOutputMatchesTheSingleFile) {
  TempDir dir;
  const auto source = gpt2_checkpoint(dir / "src", {2, 1, 16});
  convert::ConsolidateRequest single;
  single.source = source;
  single.output = dir / "single";
  single.with_optimizer = true;
  convert::consolidate(single, small_pieces());
  convert::ConsolidateRequest sharded = single;
  sharded.output = dir / "sharded";
  sharded.max_shard_bytes = 20'000;
  const auto files = convert::consolidate(sharded, small_pieces());
  ASSERT_GT(files.size(), 3u);
  std::ifstream index_file(sharded.output / st::kIndexFileName);
  const nlohmann::json index = nlohmann::json::parse(index_file);
  const auto whole = tensor_bytes(single.output / st::kSingleFileName);
  std::map<std::string, std::vector<std::byte>> pieces;
  uint64_t total = 0;
  for (const auto& f : files) {
    if (f.find(".safetensors") == std::string::npos || f == st::kIndexFileName) continue;
    for (auto& [name, bytes] : tensor_bytes(sharded.output / f)) {
      EXPECT_EQ(index["weight_map"][name], f);
      total += bytes.size();
      pieces[name] = std::move(bytes);
    }
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(pieces, whole);
  // The optimizer's moments are there under their own names.
  const int t = model::gpt2::tensor_table(small_gpt2()).find("transformer.h.1.mlp.c_fc.weight");
  const auto& m = whole.at("optimizer.exp_avg.transformer.h.1.mlp.c_fc.weight");
  float v;
  std::memcpy(&v, m.data() + 4 * 5, 4);
  EXPECT_EQ(v, ckpt::synthetic_value(kSeed, t, 1, 5));
}

TEST(Import, ThenConsolidateGivesBackTheSameBytesAndResumesFromZeroMoments) {
  TempDir dir;
  const auto source = gpt2_checkpoint(dir / "src", {2, 2, 16});
  convert::ConsolidateRequest exported;
  exported.source = source;
  exported.output = dir / "hf";
  convert::consolidate(exported, small_pieces());
  convert::ImportRequest imp;
  imp.weights = exported.output;
  imp.output = dir / "imported";
  imp.world_size = 3;
  imp.stage = 3;
  const auto step_dir = convert::import_weights(imp, small_pieces(1));
  ckpt::CheckpointReader reader(step_dir);
  EXPECT_EQ(reader.manifest().step, 0);
  EXPECT_TRUE(reader.verify().ok());
  std::vector<float> x;
  for (size_t t = 0; t < reader.tensors().size(); ++t) {
    x.resize(static_cast<size_t>(reader.tensors()[t].numel()));
    reader.read(static_cast<int>(t), 0, 0, x);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(x[i], ckpt::synthetic_value(kSeed, static_cast<int>(t), 0, static_cast<int64_t>(i)));
    reader.read(static_cast<int>(t), 1, 0, x);
    for (float v : x) ASSERT_EQ(v, 0.0f);
  }
  convert::ConsolidateRequest again = exported;
  again.source = imp.output;
  again.output = dir / "hf2";
  convert::consolidate(again, small_pieces());
  for (const char* f : {"model.safetensors", "config.json"}) {
    std::ifstream a(exported.output / f, std::ios::binary), b(again.output / f, std::ios::binary);
    const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
    EXPECT_EQ(sa, sb) << f;
  }
}

TEST(Import, RejectsWhatIsNotGpt2) {
  TempDir dir;
  const model::gpt2::GptConfig c = small_gpt2();
  std::ofstream(dir / "config.json") << model::gpt2::hf_config_json(c, "float32").dump();
  auto import_file = [&](const std::vector<st::TensorSpec>& specs) {
    {
      st::Writer w(dir / "w.safetensors", specs, {{"format", "pt"}});
      w.finish();
    }
    convert::ImportRequest r;
    r.weights = dir / "w.safetensors";
    r.output = dir / "out";
    convert::import_weights(r, small_pieces());
  };
  std::vector<st::TensorSpec> good;
  for (const auto& t : model::gpt2::tensor_table(c)) good.push_back({t.name, "F32", t.shape});
  auto expect_error = [&](std::vector<st::TensorSpec> specs, const std::string& fragment) {
    try {
      import_file(specs);
      ADD_FAILURE() << "accepted: " << fragment;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  };
  auto extra = good;
  extra.push_back({"transformer.h.9.attn.c_attn.weight", "F32", {32, 96}});
  expect_error(extra, "is no tensor of gpt2");
  auto ints = good;
  ints[3].dtype = "I32";
  expect_error(ints, "dtype I32");
  auto shape = good;
  shape[0].shape = {96, 32};
  expect_error(shape, "wrong shape");
  auto missing = good;
  missing.pop_back();
  expect_error(missing, "is missing");
  // Hugging Face's own extras are accepted: un-prefixed names, the tied lm_head, mask buffers.
  auto hf = good;
  for (auto& s : hf) s.name = s.name.substr(std::string("transformer.").size());
  hf.push_back({"lm_head.weight", "F32", {97, 32}});
  hf.push_back({"h.0.attn.bias", "F32", {1, 1, 24, 24}});
  EXPECT_NO_THROW(import_file(hf));
  std::filesystem::remove(dir / "config.json");
  std::filesystem::remove_all(dir / "out");
  expect_error(good, "config.json");
}

TEST(Consolidate, Hdf5HoldsEveryTensorInItsShape) {
  TempDir dir;
  const auto source = gpt2_checkpoint(dir / "src", {3, 2, 16});
  convert::ConsolidateRequest r;
  r.source = source;
  r.output = dir / "h5";
  r.format = convert::ExportFormat::kHdf5;
  convert::consolidate(r, small_pieces());
  ckpt::h5::Id file = ckpt::h5::open_file(r.output / "model.h5");
  const ckpt::TensorTable table = model::gpt2::tensor_table(small_gpt2());
  for (size_t t = 0; t < table.size(); ++t) {
    ckpt::h5::Id ds = ckpt::h5::open_dataset(file.get(), ("model/" + table[t].name).c_str(), "model.h5");
    const auto dims = ckpt::h5::dataset_dims(ds.get(), "model.h5");
    ASSERT_EQ(std::vector<int64_t>(dims.begin(), dims.end()), table[t].shape);
    std::vector<float> x(static_cast<size_t>(table[t].numel()));
    ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()), 0);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(x[i], ckpt::synthetic_value(kSeed, static_cast<int>(t), 0, static_cast<int64_t>(i)));
  }
  // bf16 is not an HDF5 1.10 type: a clear refusal.
  r.output = dir / "h5b";
  r.dtype = ckpt::DType::kBF16;
  EXPECT_THROW(convert::consolidate(r, small_pieces()), Error);
  EXPECT_FALSE(std::filesystem::exists(r.output));
}

// A run shardkit trained goes out as PyTorch DCP for any world size (the groups derived from its model)
// and comes back with every value, in its own layout, unchanged.
// A run of another optimizer (Lion: fp32 and exp_avg) reshards into shardkit checkpoints with its own
// states; DeepSpeed's files (DeepSpeed's Lion keeps the same two, with Lion's group settings) and the
// consolidated export take them too; the DCP export, which writes AdamW's, is refused naming them,
// before any output exists.
TEST(Reshard, ARunOfAnotherOptimizerKeepsItsStatesAndAdamWExportsRefuseIt) {
  TempDir tmp;
  const model::gpt2::GptConfig c = small_gpt2();
  const std::vector<std::string> lion = {"fp32", "exp_avg"};
  ckpt::ShardOptions shard;
  shard.chunk_elems = 333;
  const auto source = testing::write_synthetic_checkpoint(tmp / "run", model::gpt2::tensor_table(c), {2, 1, 16}, shard,
                                                          kSeed, 7, model::gpt2::to_json(c), lion);
  convert::ReshardRequest r;
  r.source = source;
  r.output = tmp / "resharded";
  r.world_size = 3;
  r.stage = 3;
  const auto resharded = convert::reshard(r, small_pieces());
  EXPECT_EQ(ckpt::CheckpointReader(resharded).manifest().states, lion);
  expect_identical(source, resharded);

  const auto expect_refused = [&](const std::function<void()>& run, const std::filesystem::path& output) {
    try {
      run();
      ADD_FAILURE() << output << " written";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds the optimizer states [fp32, exp_avg]"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(output)) << output;
  };
  convert::DcpExportRequest dcp;
  dcp.source = source;
  dcp.output = tmp / "dcp";
  dcp.world_size = 2;
  expect_refused([&] { convert::export_dcp(dcp, small_pieces()); }, dcp.output);
  const std::filesystem::path model_file = tmp / "model.json";
  std::ofstream(model_file) << model::gpt2::to_json(c).dump();
  for (const int stage : {2, 3}) {
    convert::DeepSpeedExportRequest ds;
    ds.source = source;
    ds.output = tmp / ("ds-" + std::to_string(stage));
    ds.world_size = 2;
    ds.stage = stage;
    convert::export_deepspeed(ds, small_pieces());
    convert::CheckpointImportRequest back;
    back.source = ds.output;
    back.output = tmp / ("back-" + std::to_string(stage));
    back.model = model_file.string();
    const convert::CheckpointImportResult imported = convert::import_checkpoint(back, small_pieces());
    const ckpt::CheckpointReader reader(imported.step_dir);
    EXPECT_EQ(reader.manifest().states, lion);
    expect_identical(source, imported.step_dir);
    const nlohmann::json groups = reader.manifest().trainer_state.at("deepspeed").at("param_groups");
    ASSERT_EQ(groups.size(), 2u);
    for (const nlohmann::json& g : groups) {
      const nlohmann::json& o = g.at("options");
      EXPECT_TRUE(o.contains("betas") && o.contains("weight_decay") && !o.contains("eps")) << g.dump();
    }
  }
  // The consolidated export carries Lion's one moment as optimizer.exp_avg.<name>, every value as held.
  convert::ConsolidateRequest moments;
  moments.source = source;
  moments.output = tmp / "moments";
  moments.with_optimizer = true;
  convert::consolidate(moments, small_pieces());
  {
    const ckpt::safetensors::Reader file(moments.output / "model.safetensors");
    ckpt::CheckpointReader reader(source);
    const int exp_avg = reader.find_state("exp_avg");
    for (size_t t = 0; t < reader.tensors().size(); ++t) {
      const std::string& name = reader.tensors()[t].name;
      EXPECT_EQ(file.header().find("optimizer.exp_avg_sq." + name), nullptr) << name;
      const ckpt::safetensors::TensorInfo* info = file.header().find("optimizer.exp_avg." + name);
      ASSERT_NE(info, nullptr) << name;
      std::vector<float> got(static_cast<size_t>(reader.tensors()[t].numel())), want(got.size());
      file.read(*info, 0, std::as_writable_bytes(std::span<float>(got)));
      reader.read(static_cast<int>(t), exp_avg, 0, want);
      EXPECT_EQ(got, want) << name;
    }
  }
  // The weights alone go out of any run.
  convert::ConsolidateRequest weights = moments;
  weights.output = tmp / "weights";
  weights.with_optimizer = false;
  convert::consolidate(weights, small_pieces());
  EXPECT_TRUE(std::filesystem::exists(weights.output / "model.safetensors"));
}

TEST(ExportDcp, ARunShardkitTrainedGoesOutAndComesBackUnchanged) {
  TempDir tmp;
  const auto source = gpt2_checkpoint(tmp / "run", {2, 1, 16});
  const std::filesystem::path model_file = tmp / "model.json";
  std::ofstream(model_file) << model::gpt2::to_json(small_gpt2()).dump();
  for (int world : {1, 3, 5}) {
    convert::ConvertOptions o;
    o.piece_elems = 50;
    convert::DcpExportRequest e;
    e.source = source;
    e.output = tmp / ("dcp-" + std::to_string(world));
    e.world_size = world;
    const convert::DcpExportResult out = convert::export_dcp(e, o);
    EXPECT_EQ(out.step, 7);
    EXPECT_TRUE(out.optimizer);
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(e.output), {}), world + 1);
    convert::CheckpointImportRequest r;
    r.source = e.output;
    r.format = convert::SourceFormat::kDcp;
    r.output = tmp / ("back-" + std::to_string(world));
    r.model = model_file.string();
    r.world_size = 2;
    r.stage = 1;
    const convert::CheckpointImportResult back = convert::import_checkpoint(r, o);
    EXPECT_EQ(back.step, 7);
    expect_identical(source, back.step_dir);
    // The groups a Hugging Face Trainer would make, and the tied output projection, are in the files.
    const nlohmann::json run = ckpt::CheckpointReader(back.step_dir).manifest().trainer_state.at("deepspeed");
    EXPECT_EQ(run.at("param_groups").size(), 2u);
    EXPECT_EQ(run.at("shared_params"), nlohmann::json({{"lm_head.weight", "transformer.wte.weight"}}));
  }
}

}  // namespace
}  // namespace shardkit
