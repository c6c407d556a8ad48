#include "ckpt/save.hpp"

#include "base/error.hpp"
#include "base/fault.hpp"
#include "base/file_util.hpp"
#include "base/write_target.hpp"
#include "base/xxh64.hpp"
#include "ckpt/run_dir.hpp"
#include "ckpt/shard_format.hpp"

namespace shardkit::ckpt {
namespace {

using nlohmann::json;

// Messages between ranks are small JSON objects; "error" is empty on success, and "kind" carries
// the ErrorKind so that every rank throws what the failing rank threw.
std::string message(json body) {
  body["error"] = "";
  return body.dump();
}

std::string message(const std::exception& e, const std::string& prefix = "") {
  const auto* error = dynamic_cast<const Error*>(&e);
  const ErrorKind kind = error ? error->kind() : ErrorKind::kInternal;
  return json{{"error", prefix + e.what()}, {"kind", static_cast<int>(kind)}}.dump();
}

json parse_message(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("error")) {
    fail(ErrorKind::kInternal, "save protocol: malformed message between ranks");
  }
  return j;
}

void throw_if_error(const json& msg) {
  const std::string error = msg["error"].get<std::string>();
  if (!error.empty()) fail(static_cast<ErrorKind>(msg.value("kind", static_cast<int>(ErrorKind::kIo))), error);
}

}  // namespace

std::string writer_version() {
  return std::string("shardkit ") + SHARDKIT_VERSION;
}

void prepare_step_dir(const std::filesystem::path& step_dir) {
  make_real_directory(step_dir);
  std::error_code ec;
  if (std::filesystem::exists(step_dir / kManifestFileName, ec)) {
    fail(ErrorKind::kInvalidInput,
         step_dir.string() + " already holds a committed checkpoint; remove it or save into another directory");
  }
}

Manifest build_manifest(const CheckpointMeta& meta, const std::string& checkpoint_uid,
                        std::vector<ShardRecord> shards) {
  Manifest m;
  m.format_version = kFormatVersion;
  m.checkpoint_uid = checkpoint_uid;
  m.step = meta.step;
  m.created = utc_timestamp();
  m.writer = writer_version();
  m.tensors = *meta.table;
  m.layout = meta.layout;
  m.states = meta.states;
  m.chunk_elems = meta.shard.chunk_elems > 0 ? meta.shard.chunk_elems : kDefaultChunkElems;
  m.compression_level = meta.shard.compression_level;
  m.shards = std::move(shards);
  m.trainer_state = meta.trainer_state;
  m.model = meta.model;
  m.config = meta.config;
  return m;
}

void commit_checkpoint(const std::filesystem::path& step_dir, const Manifest& manifest, bool update_latest,
                       bool durable) {
  // Shards written without durability get none here either: on ext4 (data=ordered) one fsync of the
  // manifest would flush their data with it.
  write_manifest(step_dir, manifest, durable);
  if (update_latest) {
    const std::filesystem::path run_dir = step_dir.parent_path().empty() ? "." : step_dir.parent_path();
    write_file_atomic(run_dir / kLatestFileName, step_dir.filename().string() + "\n", durable);
  } else if (durable) {
    fsync_directory(step_dir.parent_path().empty() ? "." : step_dir.parent_path());
  }
}

SaveResult save_checkpoint(Collective& group, const SaveRequest& request) {
  const int rank = group.rank();
  const CheckpointMeta& meta = request.meta;
  if (meta.layout.world_size != group.size() || (!request.stream && request.buffers.size() != meta.states.size())) {
    fail(ErrorKind::kInternal, "save_checkpoint: layout world size " + std::to_string(meta.layout.world_size) +
                                   " or buffer count differs from the group size " + std::to_string(group.size()) +
                                   " or state count");
  }
  const std::filesystem::path step_dir = request.run_dir / step_dir_name(meta.step);
  const FaultScope faults(rank, meta.step);

  // 1. Rank 0 prepares the directory and names the checkpoint.
  std::string begin;
  if (rank == 0) {
    try {
      prepare_step_dir(step_dir);
      begin = message({{"uid", make_checkpoint_uid()}});
    } catch (const std::exception& e) {
      begin = message(e);
    }
  }
  const json start = parse_message(group.broadcast(begin));
  throw_if_error(start);
  const std::string uid = start["uid"].get<std::string>();
  crash_point("save-start");

  // 2. Every rank writes its shard.
  std::string record;
  try {
    make_real_directory(step_dir);  // visible already on a shared filesystem
    const Layout layout(*meta.table, meta.layout);
    const std::filesystem::path shard = step_dir / shard_file_name(rank, group.size());
    ShardWriter writer(shard, *meta.table, layout, {uid, meta.step, rank}, meta.states, meta.shard);
    for (size_t s = 0; s < meta.states.size(); ++s) {
      if (s == 1) {
        crash_point("shard-partial");
        if (fault_armed("enospc")) {
          fail(ErrorKind::kIo, shard.string() + ".tmp: write: No space left on device (SHARDKIT_FAULT=enospc)");
        }
      }
      if (request.stream) {
        writer.begin_state(meta.states[s]);
        request.stream(s, [&](std::span<const float> piece) { writer.append(piece); });
        writer.end_state();
      } else {
        writer.write_state(meta.states[s], request.buffers[s]);
      }
    }
    const ShardRecord r = writer.commit();
    crash_point("shard-written");
    record = message({{"rank", r.rank}, {"file", r.file}, {"bytes", r.bytes}, {"digest", to_hex(r.digest)}});
  } catch (const std::exception& e) {
    record = message(e, "rank " + std::to_string(rank) + ": ");
  }

  // 3-4. Rank 0 collects the records and commits.
  const std::vector<std::string> records = group.gather(record);
  std::string outcome;
  if (rank == 0) {
    try {
      std::vector<ShardRecord> shards;
      for (const std::string& text : records) {
        const json r = parse_message(text);
        throw_if_error(r);
        ShardRecord s;
        s.rank = r["rank"].get<int>();
        s.file = r["file"].get<std::string>();
        s.bytes = r["bytes"].get<int64_t>();
        from_hex(r["digest"].get<std::string>(), &s.digest);
        shards.push_back(std::move(s));
      }
      const Manifest m = build_manifest(meta, uid, std::move(shards));
      commit_checkpoint(step_dir, m, request.update_latest, meta.shard.durable);
      outcome = message({{"bytes", m.total_bytes()}});
    } catch (const std::exception& e) {
      outcome = message(e, "checkpoint " + step_dir.string() + " not committed: ");
    }
  }

  // 5. Everyone learns the outcome. A save that failed leaves nothing behind: its uncommitted step
  // directory would only hold disk space (which may be why it failed) until the next start.
  const json done = parse_message(group.broadcast(outcome));
  if (!done["error"].get<std::string>().empty() && rank == 0) remove_uncommitted(step_dir);
  throw_if_error(done);
  return {step_dir, done["bytes"].get<int64_t>()};
}

}  // namespace shardkit::ckpt
