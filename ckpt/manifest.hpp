// The manifest: manifest.json in a step directory, written last. Its presence means "committed".
// It holds the tensor table, the layout inputs, the shard list with sizes and digests, and the
// trainer state, model and training config (opaque JSON to this library), and carries a digest of
// its own canonical form so that an edited or damaged manifest is recognised.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/layout.hpp"
#include "ckpt/shard_writer.hpp"
#include "ckpt/tensor_table.hpp"

namespace shardkit::ckpt {

struct Manifest {
  int format_version = 0;
  std::string checkpoint_uid;
  int64_t step = 0;
  std::string created;  // ISO 8601 UTC
  std::string writer;   // "shardkit <version>"
  TensorTable tensors;
  LayoutSpec layout;
  std::vector<std::string> states;
  int64_t chunk_elems = 0;
  int compression_level = 0;        // 0 = none, else zstd level
  std::vector<ShardRecord> shards;  // one per rank, in rank order
  nlohmann::json trainer_state = nlohmann::json::object();
  nlohmann::json model = nlohmann::json::object();
  nlohmann::json config = nlohmann::json::object();

  int64_t total_bytes() const noexcept;
};

// JSON with "manifest_digest" (XXH64 of the canonical dump of everything else).
nlohmann::json manifest_to_json(const Manifest& manifest);
// Parses and validates: format name and version, digest, types and bounds of every field, shard
// names and ranks. Throws Error(kCorrupt) with `where` in the message.
Manifest parse_manifest(const std::string& text, const std::string& where);
// Reads `dir`/manifest.json (bounded size) and parses it.
Manifest read_manifest(const std::filesystem::path& step_dir);
// Writes `dir`/manifest.json atomically (temp file, rename), with `durable` fsyncing the file and the
// directory.
void write_manifest(const std::filesystem::path& step_dir, const Manifest& manifest, bool durable = true);

// A fresh 128-bit random identifier in hex.
std::string make_checkpoint_uid();
// Current time as "2026-11-30T09:44:04Z".
std::string utc_timestamp();

}  // namespace shardkit::ckpt
