// The save protocol: every rank writes its own shard in parallel, nothing is gathered but a few
// bytes of metadata, and the checkpoint appears atomically.
//
//   1. rank 0 checks the step directory (not already committed), creates it and broadcasts a fresh
//      checkpoint uid;
//   2. every rank writes shard-RRRRR-of-WWWWW.h5.tmp, fsyncs it, renames it, fsyncs the directory;
//   3. the ranks' shard records (or errors) are gathered to rank 0;
//   4. rank 0 writes manifest.json the same durable way, then replaces `latest`;
//   5. rank 0 broadcasts the outcome, so every rank returns or throws the same error.
// A crash at any instant leaves the previous committed checkpoint and `latest` intact: a step
// directory without a manifest is never treated as a checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/collective.hpp"
#include "ckpt/layout.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/shard_writer.hpp"
#include "ckpt/tensor_table.hpp"

namespace shardkit::ckpt {

// What a checkpoint is, apart from the numbers: shared by every shard and the manifest.
struct CheckpointMeta {
  int64_t step = 0;
  const TensorTable* table = nullptr;
  LayoutSpec layout;
  std::vector<std::string> states;  // names of the flat buffers, e.g. fp32, exp_avg, exp_avg_sq
  ShardOptions shard;
  nlohmann::json trainer_state = nlohmann::json::object();
  nlohmann::json model = nlohmann::json::object();
  nlohmann::json config = nlohmann::json::object();
};

// Hands this rank's flat buffer of state `state` (an index into meta.states) to `sink` in flat order,
// in pieces of any size (all of it at once, or chunk by chunk from a swap file).
using StateStream = std::function<void(size_t state, const std::function<void(std::span<const float>)>& sink)>;

struct SaveRequest {
  std::filesystem::path run_dir;
  CheckpointMeta meta;                          // meta.layout.world_size must equal the group's size
  std::vector<std::span<const float>> buffers;  // this rank's flat buffer of each of meta.states ...
  StateStream stream;                           // ... or, when set, the states streamed (buffers empty)
  bool update_latest = true;
};

struct SaveResult {
  std::filesystem::path step_dir;
  int64_t bytes = 0;  // all shards together
};

// Runs the protocol above; collective over `group`. Throws Error on every rank when any rank fails.
SaveResult save_checkpoint(Collective& group, const SaveRequest& request);

// Building blocks for writers that produce all shards in one process (the converters):
// prepares an empty step directory (Error(kInvalidInput) if it holds a committed checkpoint or is a
// symbolic link) ...
void prepare_step_dir(const std::filesystem::path& step_dir);
// ... builds the manifest from the shards' records (in rank order) ...
Manifest build_manifest(const CheckpointMeta& meta, const std::string& checkpoint_uid, std::vector<ShardRecord> shards);
// ... and, once every shard is committed, writes the manifest and (optionally) points `latest` at it,
// durably unless the shards were not (ShardOptions::durable).
void commit_checkpoint(const std::filesystem::path& step_dir, const Manifest& manifest, bool update_latest,
                       bool durable = true);

// The version string written into manifests ("shardkit 0.1.0").
std::string writer_version();

}  // namespace shardkit::ckpt
