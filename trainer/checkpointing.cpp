#include "trainer/checkpointing.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include "base/clock.hpp"
#include "base/error.hpp"
#include "base/fault.hpp"
#include "base/json_input.hpp"
#include "base/thread_pool.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/run_dir.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_format.hpp"
#include "model/registry.hpp"

namespace shardkit::trainer {

// The save being written in the background: the worker thread sets `done` last, after `outcome` or
// `error` (a failure outside the save protocol, which only this rank may have seen: fatal), so the
// training thread may read them once it sees `done` (or after join).
struct Checkpointer::InFlight {
  Backend* backend = nullptr;  // asked, once the save is done, how long training waited for the snapshot
  std::thread worker;
  std::atomic<bool> done{false};
  SaveOutcome outcome;
  std::exception_ptr error;
};

Checkpointer::Checkpointer(comm::MpiCollective& comm, std::filesystem::path save_dir, int keep_last,
                           ckpt::ShardOptions shard, SaveMode mode,
                           const std::function<void(const std::string&)>& log_notice)
    : comm_(comm), save_dir_(std::move(save_dir)), keep_last_(keep_last), shard_(shard), mode_(mode) {
  if (mode_ == SaveMode::kAsync && !comm::threads_may_communicate()) {
    mode_ = SaveMode::kSync;
    log_notice("notice: MPI runs without MPI_THREAD_MULTIPLE, so checkpoints are saved synchronously");
  }
  if (mode_ == SaveMode::kAsync) {
    background_comm_ = std::make_unique<comm::DuplicateCommunicator>(comm_.comm());
    background_ = std::make_unique<comm::MpiCollective>(background_comm_->get());
  }
}

Checkpointer::~Checkpointer() {
  if (in_flight_ && in_flight_->worker.joinable()) in_flight_->worker.join();
}

SaveOutcome Checkpointer::write(comm::MpiCollective& group, const ckpt::SaveRequest& request, Clock::time_point start) {
  SaveOutcome outcome;
  outcome.step = request.meta.step;
  try {
    const ckpt::SaveResult result = ckpt::save_checkpoint(group, request);
    outcome.path = result.step_dir;
    outcome.bytes = result.bytes;
  } catch (const std::exception& e) {
    outcome.path = request.run_dir / ckpt::step_dir_name(request.meta.step);
    outcome.error = e.what();
    return outcome;  // nothing new to prune
  }
  outcome.write_ms = ms_since(start);
  // Removing a predecessor of tens of gigabytes can take seconds (extents freed, discards issued):
  // that is not the save's write, and a figure that compares the write with dd must not include it.
  const auto pruning = Clock::now();
  if (group.rank() == 0) {
    if (fault_armed("slow-prune", 0, request.meta.step)) fault_delay();
    prune();
  }
  group.barrier();  // pruning is finished before any rank looks at the directory again
  outcome.prune_ms = ms_since(pruning);
  return outcome;
}

void Checkpointer::save(int64_t step, const ckpt::TensorTable& table, Backend& backend,
                        const nlohmann::json& trainer_state, const nlohmann::json& model,
                        const nlohmann::json& config) {
  const auto requested = Clock::now();
  collect(true);                    // one save at a time: the snapshot buffers are the previous save's source
  const auto start = Clock::now();  // the write's clock starts once the previous save is out of the way
  // Snapshot: a consistent copy of this step's states, taken between optimizer steps. The write reads
  // only the snapshot, so training may go on while it runs.
  {
    const FaultScope fault(comm_.rank(), step);  // "slow-snapshot"
    backend.begin_snapshot();
  }

  ckpt::SaveRequest request;
  request.run_dir = save_dir_;
  request.meta.step = step;
  request.meta.table = &table;
  request.meta.layout = backend.layout().spec();
  request.meta.states = backend.optimizer().state_names();
  request.meta.shard = shard_;
  request.meta.trainer_state = trainer_state;
  request.meta.model = model;
  request.meta.config = config;
  request.stream = [&backend](size_t state, const std::function<void(std::span<const float>)>& sink) {
    backend.stream_snapshot(static_cast<int>(state), sink);
  };

  if (mode_ == SaveMode::kSync) {
    backend.wait_snapshot();
    SaveOutcome outcome = write(comm_, request, start);
    backend.end_snapshot();
    outcome.loop_blocked_ms = ms_since(requested);
    outcome.device_wait_ms = backend.snapshot_wait_ms();  // 0: the copy was done before save() returned
    completed_.push_back(std::move(outcome));
    return;
  }
  in_flight_ = std::make_unique<InFlight>();
  InFlight* job = in_flight_.get();
  job->backend = &backend;
  job->outcome.loop_blocked_ms = ms_since(requested);
  job->worker = std::thread([this, job, &backend, request = std::move(request), start] {
    try {
      backend.wait_snapshot();  // a GPU's copy to host memory overlaps the next micro-batches
      const double blocked_ms = job->outcome.loop_blocked_ms;
      job->outcome = write(*background_, request, start);
      job->outcome.loop_blocked_ms = blocked_ms;
    } catch (...) {
      job->error = std::current_exception();
    }
    backend.end_snapshot();  // the training thread's next optimizer step may change the states again
    job->done.store(true, std::memory_order_release);
  });
}

void Checkpointer::collect(bool wait) {
  if (!in_flight_) return;  // alike on every rank: saves start at the same step everywhere
  // A save is collected only once it is done on every rank, so that all ranks see its outcome at the
  // same step and act on it alike (a failed save with --on-save-error stop ends the run on all of
  // them; ranks that went on alone would wait forever in the next collective).
  if (!wait && comm_.allreduce_max(in_flight_->done.load(std::memory_order_acquire) ? 0.0 : 1.0) > 0.0) return;
  in_flight_->worker.join();
  std::unique_ptr<InFlight> job = std::move(in_flight_);
  if (job->error) std::rethrow_exception(job->error);
  // The snapshot was released before the write began: a step that waited for it has done so, and no
  // later one will.
  job->outcome.device_wait_ms = job->backend->snapshot_wait_ms();
  completed_.push_back(std::move(job->outcome));
}

std::vector<SaveOutcome> Checkpointer::poll() {
  collect(false);
  return std::exchange(completed_, {});
}

std::vector<SaveOutcome> Checkpointer::finish() {
  collect(true);
  return std::exchange(completed_, {});
}

void Checkpointer::prune() {
  if (keep_last_ > 0) ckpt::prune_committed(save_dir_, keep_last_);
}

ResumeCandidates resume_candidates(const std::string& resume, const std::filesystem::path& save_dir) {
  if (resume == "none") return {};
  if (resume != "auto") return {{ckpt::resolve_checkpoint(resume)}, {}};
  std::error_code ec;
  if (save_dir.empty() || !std::filesystem::is_directory(save_dir, ec)) return {};
  ResumeCandidates out;
  for (const auto& c : ckpt::list_checkpoints(save_dir)) {
    if (c.committed) {
      out.paths.push_back(save_dir / c.name);
    } else if (std::filesystem::exists(save_dir / c.name / ckpt::kManifestFileName, ec)) {
      out.damaged.push_back({save_dir / c.name, c.problem});
    }
  }
  std::reverse(out.paths.begin(), out.paths.end());
  return out;
}

nlohmann::json load_checkpoint(const std::filesystem::path& path, const model::Model& model, Backend& backend) {
  // Every chunk is read, decoded and checked on several threads, in file order: a resume reads at the
  // disk's speed.
  ckpt::CheckpointReader reader(path, ThreadPool::default_threads(0) + 1);
  const std::string where = reader.step_dir().string();
  const ckpt::TensorTable& table = model.table();
  if (!(reader.tensors() == table)) {
    fail(ErrorKind::kInvalidInput, where + " holds another model (" + std::to_string(reader.tensors().size()) +
                                       " tensors; this model has " + std::to_string(table.size()) +
                                       " or different shapes)");
  }
  // The same tensors can belong to another function of them (another rotary base, norm epsilon or
  // family): what the manifest says the model is must be this one.
  std::shared_ptr<const model::Model> saved;
  try {
    saved = model::model_from_manifest(reader.manifest().model, where);
  } catch (const Error&) {
    // No model the registry knows (a checkpoint written by a tool other than `train` or `import`):
    // the tensor table above is all there is to compare.
  }
  if (saved && saved->architecture() != model.architecture()) {
    fail(ErrorKind::kInvalidInput,
         where + " holds model " + saved->architecture().dump() + ", not " + model.architecture().dump());
  }
  // The run's optimizer reads its own states: a checkpoint of another optimizer (Lion's one moment,
  // AdamW's two) is refused with both lists, not resumed with moments it never had.
  const Optimizer& optimizer = backend.optimizer();
  const std::vector<std::string> wanted = optimizer.state_names();
  const std::vector<std::string>& held = reader.manifest().states;
  const auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
    return out;
  };
  if (!std::is_permutation(wanted.begin(), wanted.end(), held.begin(), held.end())) {
    fail(ErrorKind::kInvalidInput, where + " holds the optimizer states [" + list(held) + "], but this run's " +
                                       std::string(optimizer.name) + " keeps [" + list(wanted) +
                                       "]: resume it with the optimizer that wrote it");
  }
  std::vector<int> states;
  for (const std::string& name : wanted) states.push_back(reader.find_state(name));
  // A read that fails (damage in the part this rank reads) must not skip the collectives that the
  // backend's load runs after reading: the error is kept and thrown once the load is through, so that
  // every rank reaches the caller, which decides with the others (see Trainer's resume).
  std::optional<Error> failure;
  backend.load([&](std::span<const ckpt::ReadRequest> requests) {
    if (failure) return;
    std::vector<ckpt::ReadRequest> mapped(requests.begin(), requests.end());
    for (ckpt::ReadRequest& r : mapped) r.state = states[static_cast<size_t>(r.state)];
    try {
      reader.read(mapped);
    } catch (const Error& e) {
      failure = e;
    }
  });
  if (failure) throw *failure;
  // Inside the damage check of the caller: a trainer state that contradicts its checkpoint (a step
  // other than the one the manifest and the directory name carry) is a damaged checkpoint.
  const ckpt::Manifest& manifest = reader.manifest();
  const int64_t step =
      integer_field(manifest.trainer_state, "step", where + ": trainer_state", 0, ckpt::kMaxStep, ErrorKind::kCorrupt);
  if (step != manifest.step) {
    fail(ErrorKind::kCorrupt, where + ": trainer_state.step is " + std::to_string(step) +
                                  ", but the checkpoint is of step " + std::to_string(manifest.step));
  }
  return manifest.trainer_state;
}

}  // namespace shardkit::trainer
