#include "ckpt/manifest.hpp"

#include <gtest/gtest.h>

#include <functional>

#include "base/xxh64.hpp"

#include "base/error.hpp"
#include "ckpt/shard_format.hpp"

namespace shardkit::ckpt {
namespace {

Manifest sample() {
  Manifest m;
  m.format_version = kFormatVersion;
  m.checkpoint_uid = make_checkpoint_uid();
  m.step = 42;
  m.created = utc_timestamp();
  m.writer = "shardkit test";
  m.tensors = TensorTable({{"w", {4, 3}, DType::kF32}, {"b", {3}, DType::kBF16}});
  m.layout = {2, 3, 16};
  m.states = {"fp32", "exp_avg", "exp_avg_sq"};
  m.chunk_elems = 1024;
  m.compression_level = 3;
  for (int r = 0; r < 2; ++r)
    m.shards.push_back({r, shard_file_name(r, 2), 1000 + r, 0x1234u + static_cast<uint64_t>(r)});
  m.trainer_state = {{"step", 42}, {"loss_scale", 65536.0}, {"lr", 3e-4}};
  m.model = {{"n_layer", 2}};
  m.config = {{"train_batch_size", 8}};
  return m;
}

std::string text(const Manifest& m) {
  return manifest_to_json(m).dump(2);
}

TEST(Manifest, RoundTripsEveryField) {
  const Manifest m = sample();
  const Manifest back = parse_manifest(text(m), "manifest.json");
  EXPECT_EQ(back.checkpoint_uid, m.checkpoint_uid);
  EXPECT_EQ(back.step, 42);
  EXPECT_EQ(back.tensors, m.tensors);
  EXPECT_EQ(back.layout, m.layout);
  EXPECT_EQ(back.states, m.states);
  EXPECT_EQ(back.chunk_elems, 1024);
  EXPECT_EQ(back.compression_level, 3);
  ASSERT_EQ(back.shards.size(), 2u);
  EXPECT_EQ(back.shards[1].digest, 0x1235u);
  EXPECT_EQ(back.shards[1].bytes, 1001);
  EXPECT_EQ(back.trainer_state, m.trainer_state);
  EXPECT_EQ(back.total_bytes(), 2001);
}

TEST(Manifest, DigestCatchesAnyEditButNotReformatting) {
  const std::string original = text(sample());
  // Reformatting (compact form) keeps the content: still valid.
  EXPECT_NO_THROW(parse_manifest(nlohmann::json::parse(original).dump(), "m"));
  std::string edited = original;
  edited.replace(edited.find("\"step\": 42"), 10, "\"step\": 43");
  try {
    parse_manifest(edited, "run/step-1/manifest.json");
    FAIL() << "edited manifest accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("run/step-1/manifest.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("digest"), std::string::npos);
  }
}

// Rewrites one field and re-signs, so that validation (not the digest) must catch it.
std::string with(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = manifest_to_json(sample());
  j.erase("manifest_digest");
  edit(j);
  j["manifest_digest"] = to_hex(xxh64(j.dump().data(), j.dump().size()));
  return j.dump();
}

TEST(Manifest, ValidatesFieldsEvenWithAValidDigest) {
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> cases = {
      {"format", [](nlohmann::json& j) { j["format"] = "something-else"; }},
      {"version", [](nlohmann::json& j) { j["format_version"] = 2; }},
      {"world size", [](nlohmann::json& j) { j["layout"]["world_size"] = 0; }},
      {"stage", [](nlohmann::json& j) { j["layout"]["stage"] = 4; }},
      {"shard count", [](nlohmann::json& j) { j["shards"].erase(1); }},
      {"shard name", [](nlohmann::json& j) { j["shards"][1]["file"] = "../../etc/passwd"; }},
      {"shard rank", [](nlohmann::json& j) { j["shards"][1]["rank"] = 0; }},
      {"negative size", [](nlohmann::json& j) { j["shards"][0]["bytes"] = -5; }},
      {"tensor name", [](nlohmann::json& j) { j["tensors"][0]["name"] = "/abs"; }},
      {"state name", [](nlohmann::json& j) { j["states"][0] = "a/b"; }},
      {"chunk size", [](nlohmann::json& j) { j["storage"]["chunk_elems"] = 0; }},
      {"codec", [](nlohmann::json& j) { j["storage"]["compression"] = "lz4"; }},
      {"missing field", [](nlohmann::json& j) { j.erase("tensors"); }},
      {"wrong type", [](nlohmann::json& j) { j["step"] = "forty-two"; }},
  };
  for (const auto& [what, edit] : cases) {
    EXPECT_THROW(parse_manifest(with(edit), "m"), Error) << what;
  }
}

TEST(Manifest, GarbageIsACleanError) {
  for (const char* bad : {"", "{", "[]", "null", "\x89HDF\r\n", "{\"format\": 1}"}) {
    EXPECT_THROW(parse_manifest(bad, "m"), Error) << bad;
  }
}

TEST(StepDirNames, FormatAndParse) {
  EXPECT_EQ(step_dir_name(1000), "step-00001000");
  EXPECT_EQ(step_dir_name(123456789012), "step-123456789012");
  EXPECT_EQ(parse_step_dir_name("step-00001000"), 1000);
  EXPECT_EQ(parse_step_dir_name("step-"), -1);
  EXPECT_EQ(parse_step_dir_name("step-12a"), -1);
  EXPECT_EQ(parse_step_dir_name("../step-1"), -1);
  EXPECT_EQ(shard_file_name(3, 8), "shard-00003-of-00008.h5");
}

}  // namespace
}  // namespace shardkit::ckpt
