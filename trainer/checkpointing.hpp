// The trainer's side of checkpoints: snapshot-then-write saves through ckpt's save protocol, retention
// (--keep-last), and resume with load-time resharding (each rank reads only the ranges its own
// partition needs, whatever layout the checkpoint was written in).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/shard_writer.hpp"
#include "ckpt/tensor_table.hpp"
#include "comm/mpi.hpp"
#include "trainer/backend.hpp"

namespace shardkit::trainer {

struct SaveOutcome {
  std::filesystem::path path;
  int64_t bytes = 0;
  double stall_ms = 0;  // the training loop was blocked this long
  double write_ms = 0;  // until the checkpoint was committed and durable
};

class Checkpointer {
 public:
  Checkpointer(comm::MpiCollective& comm, std::filesystem::path save_dir, int keep_last, ckpt::ShardOptions shard);

  // Copies the backend's states into host buffers allocated once (the snapshot), then writes them:
  // every rank its shard, rank 0 the manifest. Collective.
  SaveOutcome save(int64_t step, const ckpt::TensorTable& table, Backend& backend, const nlohmann::json& trainer_state,
                   const nlohmann::json& model, const nlohmann::json& config);

 private:
  void prune();

  comm::MpiCollective& comm_;
  std::filesystem::path save_dir_;
  int keep_last_;
  ckpt::ShardOptions shard_;
  std::vector<float> snapshot_[3];
};

// Which checkpoint --resume selects: "none" -> nothing; "auto" -> save_dir's latest if there is one;
// anything else is a step or run directory that must exist.
std::optional<std::filesystem::path> resolve_resume(const std::string& resume, const std::filesystem::path& save_dir);

// Restores the backend's master weights and Adam moments from `path` (any world size and stage) and
// returns the manifest's trainer_state. Error(kInvalidInput) when the checkpoint holds another model.
// Collective (every rank reads its part).
nlohmann::json load_checkpoint(const std::filesystem::path& path, const ckpt::TensorTable& table, Backend& backend);

}  // namespace shardkit::trainer
