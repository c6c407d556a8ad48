// DeepSpeed's monitors on rank 0: the "tensorboard" and "csv_monitor" sections of the config write the
// trainer's step and checkpoint scalars, with DeepSpeed's tags and x-axis (the samples consumed), into
// output_path/job_name; "wandb" and "comet" get a line saying that shardkit does not talk to their
// services and where the metrics go instead. docs/DEEPSPEED.md ("Monitors") describes what is written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trainer/ds_config.hpp"
#include "trainer/monitor/sink.hpp"
#include "trainer/trainer.hpp"

namespace shardkit::trainer::monitor {

// What DeepSpeed writes besides the step's own record, known after the step.
struct StepContext {
  int64_t samples_before = 0;         // samples consumed when the step began: the x of train_loss
  int64_t samples_after = 0;          // and once it ended: the x of every other scalar
  double next_lr = 0;                 // the rate once the scheduler has advanced, which DeepSpeed reads as "lr"
  std::optional<double> loss_scale;   // the scale after the step's update; set with fp16 only
  bool wall_clock_breakdown = false;  // adds the elapsed_time_ms_ scalars
};

// The scalars of one optimizer step, in DeepSpeed's order, then shardkit's own (tokens/s, and the
// gradient norm of a step that was not skipped).
std::vector<Scalar> step_scalars(const StepRecord& record, const StepContext& context);
// The scalar of a committed checkpoint: what it cost training, at the samples of its step.
Scalar checkpoint_scalar(double training_lost_ms, int64_t samples);

class Monitors {
 public:
  using Log = std::function<void(const std::string&)>;
  // Creates the folders of the enabled outputs and their files' first bytes; `where` (the config file)
  // starts errors, which are Error(kInvalidInput) naming the key: "cfg.json: tensorboard.output_path /
  // job_name: DIR: cannot create directory: Permission denied (expected a folder shardkit can write)".
  Monitors(const MonitorConfig& config, const std::string& where, Log log);
  ~Monitors();
  Monitors(const Monitors&) = delete;
  Monitors& operator=(const Monitors&) = delete;

  // One line per output: what it writes and where.
  std::vector<std::string> describe() const;
  // Writes `scalars` to every output. One that fails (a full disk, an I/O error) is reported through
  // the log once, with the error, and written to no more: a monitor never stops training or a save.
  void write(std::span<const Scalar> scalars);

 private:
  std::vector<std::unique_ptr<Sink>> sinks_;
  Log log_;
};

// The lines for wandb and comet when enabled: shardkit does not talk to their services; the metrics
// go to `metrics` (--metrics, may be empty) and to the `outputs` Monitors::describe() gave.
std::vector<std::string> network_monitor_notes(const MonitorConfig& config, const std::filesystem::path& metrics,
                                               const std::vector<std::string>& outputs);

}  // namespace shardkit::trainer::monitor
