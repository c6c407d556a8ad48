// The trainer's side of checkpoints: snapshot-then-write saves through ckpt's save protocol,
// asynchronous by default (the write and commit overlap training), retention (--keep-last), and
// resume with load-time resharding (each rank reads only the ranges its own partition needs,
// whatever layout the checkpoint was written in).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/clock.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_writer.hpp"
#include "ckpt/tensor_table.hpp"
#include "comm/mpi.hpp"
#include "trainer/backend.hpp"

namespace shardkit::trainer {

struct SaveOutcome {
  std::filesystem::path path;
  int64_t step = 0;
  int64_t bytes = 0;
  // What the save cost training: the time save() held the training loop (a previous save's wait, the
  // snapshot's start; on CPU ranks the whole copy), then the time the training stream sat idle for the
  // snapshot's copy to finish (GPUs: the next optimizer step waits for it on the device).
  double loop_blocked_ms = 0;
  double device_wait_ms = 0;
  double training_lost_ms() const noexcept { return loop_blocked_ms + device_wait_ms; }
  double write_ms = 0;  // from the snapshot (after any wait for the previous save) until committed and durable
  double prune_ms = 0;  // after the commit: removing the checkpoints beyond keep_last (not in write_ms)
  std::string error;    // non-empty: the save failed, alike on every rank, and left nothing behind
};

class Checkpointer {
 public:
  // Async needs MPI_THREAD_MULTIPLE; without it saves are synchronous (log_notice says so once).
  Checkpointer(comm::MpiCollective& comm, std::filesystem::path save_dir, int keep_last, ckpt::ShardOptions shard,
               SaveMode mode, const std::function<void(const std::string&)>& log_notice);
  ~Checkpointer();  // waits for a save still in flight
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Snapshots the backend's states into its host buffers, allocated once (a consistent copy, taken
  // between optimizer steps), then saves them through ckpt's protocol: every rank its shard, rank 0 the manifest.
  // Sync: returns when committed or failed. Async: first waits for a previous save still being written (the
  // wait counts as stall), then returns as soon as the snapshot is taken; a background thread writes,
  // syncs and commits on its own communicator. Collective.
  void save(int64_t step, const ckpt::TensorTable& table, Backend& backend, const nlohmann::json& trainer_state,
            const nlohmann::json& model, const nlohmann::json& config);

  // The saves completed on every rank since the last call, oldest first, failed ones included (with
  // `error`; the protocol makes every rank see the same outcome). Collective (a one-number all-reduce
  // while a save is in flight, so that every rank collects it at the same step); does not wait for
  // the save.
  std::vector<SaveOutcome> poll();
  // Waits for the save in flight, then as poll().
  std::vector<SaveOutcome> finish();

 private:
  struct InFlight;
  void prune();
  void collect(bool wait);
  // Writes and commits (write_ms counts from `start`), then prunes (prune_ms).
  SaveOutcome write(comm::MpiCollective& group, const ckpt::SaveRequest& request, Clock::time_point start);

  comm::MpiCollective& comm_;
  std::filesystem::path save_dir_;
  int keep_last_;
  ckpt::ShardOptions shard_;
  SaveMode mode_;
  std::unique_ptr<comm::DuplicateCommunicator> background_comm_;  // async: the commit's communicator
  std::unique_ptr<comm::MpiCollective> background_;
  std::unique_ptr<InFlight> in_flight_;
  std::vector<SaveOutcome> completed_;
};

// The checkpoints --resume may load, in the order to try them: "none" -> none; "auto" -> every
// committed checkpoint of save_dir (manifest present and valid), newest first -- the manifest is the
// commit point, so one committed after the last update of `latest` counts -- and, in `damaged`, each
// step directory whose manifest is there but broken; anything else -> that one step or run directory,
// which must exist.
struct ResumeCandidates {
  struct Damaged {
    std::filesystem::path dir;
    std::string problem;
  };
  std::vector<std::filesystem::path> paths;
  std::vector<Damaged> damaged;
};
ResumeCandidates resume_candidates(const std::string& resume, const std::filesystem::path& save_dir);

// Restores the backend's master weights and Adam moments from `path` (any world size and stage) and
// returns the manifest's trainer_state. Error(kInvalidInput) when the checkpoint holds another model (other
// tensors, or a manifest that describes another architecture);
// Error(kCorrupt) when this rank's part is damaged, thrown only after the backend's collectives, so
// that ranks whose parts are sound do not wait for it. Collective (every rank reads its part).
nlohmann::json load_checkpoint(const std::filesystem::path& path, const model::Model& model, Backend& backend);

}  // namespace shardkit::trainer
