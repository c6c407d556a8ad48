#include "trainer/checkpointing.hpp"

#include <algorithm>
#include <chrono>

#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/error.hpp"
#include "ckpt/run_dir.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_format.hpp"

namespace shardkit::trainer {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

const std::vector<std::string>& state_names() {
  static const std::vector<std::string> names = {std::string(ckpt::kMasterWeights), std::string(ckpt::kExpAvg),
                                                 std::string(ckpt::kExpAvgSq)};
  return names;
}

}  // namespace

Checkpointer::Checkpointer(comm::MpiCollective& comm, std::filesystem::path save_dir, int keep_last,
                           ckpt::ShardOptions shard)
    : comm_(comm), save_dir_(std::move(save_dir)), keep_last_(keep_last), shard_(shard) {}

SaveOutcome Checkpointer::save(int64_t step, const ckpt::TensorTable& table, Backend& backend,
                               const nlohmann::json& trainer_state, const nlohmann::json& model,
                               const nlohmann::json& config) {
  const auto start = Clock::now();
  // Snapshot: a consistent copy of this step's states, taken between optimizer steps. The write below
  // reads only the snapshot, so it could run while training continues.
  const size_t flat = static_cast<size_t>(backend.layout().flat_size());
  for (auto& buffer : snapshot_) buffer.resize(flat);
  backend.snapshot(snapshot_[0], snapshot_[1], snapshot_[2]);

  ckpt::SaveRequest request;
  request.run_dir = save_dir_;
  request.meta.step = step;
  request.meta.table = &table;
  request.meta.layout = backend.layout().spec();
  request.meta.states = state_names();
  request.meta.shard = shard_;
  request.meta.trainer_state = trainer_state;
  request.meta.model = model;
  request.meta.config = config;
  for (const auto& buffer : snapshot_) request.buffers.push_back(buffer);
  const ckpt::SaveResult result = ckpt::save_checkpoint(comm_, request);
  if (comm_.rank() == 0) prune();
  comm_.barrier();  // pruning finished before anyone looks at the directory again

  SaveOutcome outcome;
  outcome.path = result.step_dir;
  outcome.bytes = result.bytes;
  outcome.write_ms = ms_since(start);
  outcome.stall_ms = outcome.write_ms;  // synchronous: the loop waits for the whole save
  return outcome;
}

void Checkpointer::prune() {
  if (keep_last_ <= 0) return;
  std::vector<ckpt::CheckpointListing> committed;
  for (auto& c : ckpt::list_checkpoints(save_dir_)) {
    if (c.committed) committed.push_back(std::move(c));
  }
  const size_t keep = static_cast<size_t>(keep_last_);
  for (size_t i = 0; i + keep < committed.size(); ++i) {
    if (committed[i].latest) continue;
    std::error_code ec;
    std::filesystem::remove_all(save_dir_ / committed[i].name, ec);
  }
}

std::optional<std::filesystem::path> resolve_resume(const std::string& resume, const std::filesystem::path& save_dir) {
  if (resume == "none") return std::nullopt;
  if (resume == "auto") {
    std::error_code ec;
    if (save_dir.empty() || !std::filesystem::exists(save_dir / ckpt::kLatestFileName, ec)) return std::nullopt;
    return ckpt::resolve_checkpoint(save_dir);
  }
  return ckpt::resolve_checkpoint(resume);
}

nlohmann::json load_checkpoint(const std::filesystem::path& path, const ckpt::TensorTable& table, Backend& backend) {
  ckpt::CheckpointReader reader(path);
  const std::string where = reader.step_dir().string();
  if (!(reader.tensors() == table)) {
    fail(ErrorKind::kInvalidInput, where + " holds another model (" + std::to_string(reader.tensors().size()) +
                                       " tensors; this model has " + std::to_string(table.size()) +
                                       " or different shapes)");
  }
  int states[3];
  for (int s = 0; s < 3; ++s) {
    states[s] = reader.find_state(state_names()[static_cast<size_t>(s)]);
    if (states[s] < 0) {
      fail(ErrorKind::kInvalidInput, where + " has no '" + state_names()[static_cast<size_t>(s)] + "' state");
    }
  }
  backend.load([&](int tensor, int state, int64_t offset, std::span<float> out) {
    reader.read(tensor, states[state], offset, out);
  });
  return reader.manifest().trainer_state;
}

}  // namespace shardkit::trainer
