#include "trainer/monitor/monitors.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <utility>

#include "base/error.hpp"
#include "base/write_target.hpp"
#include "trainer/monitor/csv_files.hpp"
#include "trainer/monitor/event_file.hpp"

namespace shardkit::trainer::monitor {

std::vector<Scalar> step_scalars(const StepRecord& r, const StepContext& c) {
  // DeepSpeed writes the loss in backward(), before the step counts its samples, and the rest after
  // the optimizer step: its scheduler has advanced by then, so "lr" is the next step's rate.
  std::vector<Scalar> out = {{"Train/Samples/train_loss", r.loss, c.samples_before},
                             {"Train/Samples/lr", c.next_lr, c.samples_after}};
  if (c.loss_scale) out.push_back({"Train/Samples/loss_scale", *c.loss_scale, c.samples_after});
  if (c.wall_clock_breakdown) {
    // DeepSpeed's backward timer spans the whole backward call, its gradient all-reduce included; the
    // inner one the backward pass alone.
    out.push_back({"Train/Samples/elapsed_time_ms_forward", r.forward_ms, c.samples_after});
    out.push_back({"Train/Samples/elapsed_time_ms_backward", r.backward_ms + r.reduce_ms, c.samples_after});
    out.push_back({"Train/Samples/elapsed_time_ms_backward_inner", r.backward_ms, c.samples_after});
    out.push_back({"Train/Samples/elapsed_time_ms_backward_allreduce", r.reduce_ms, c.samples_after});
    out.push_back({"Train/Samples/elapsed_time_ms_step", r.optimizer_ms, c.samples_after});
  }
  out.push_back({"Train/Samples/tokens_per_s", r.tokens_per_s, c.samples_after});
  if (!r.skipped) out.push_back({"Train/Samples/grad_norm", r.grad_norm, c.samples_after});
  return out;
}

Scalar checkpoint_scalar(double training_lost_ms, int64_t samples) {
  return {"Train/Samples/checkpoint_training_lost_ms", training_lost_ms, samples};
}

Monitors::Monitors(const MonitorConfig& config, const std::string& where, Log log) : log_(std::move(log)) {
  const auto open = [&](const MonitorOutputConfig& output, const std::string& key, const auto& make) {
    if (!output.enabled) return;
    const std::filesystem::path folder = output.folder();
    try {
      make_real_directory(folder);
      // Checked now rather than at the first CSV file: a folder that cannot be written is a mistake in
      // the config, to be told before training starts.
      if (::access(folder.c_str(), W_OK | X_OK) != 0) fail_errno(folder.string(), errno);
      sinks_.push_back(make(folder));
    } catch (const Error& e) {
      fail(ErrorKind::kInvalidInput, where + ": " + key + ".output_path / " + key + ".job_name: " + e.what() +
                                         " (expected a folder shardkit can write)");
    }
  };
  open(config.tensorboard, "tensorboard", [](const std::filesystem::path& folder) -> std::unique_ptr<Sink> {
    return std::make_unique<EventFileSink>(folder);
  });
  open(config.csv_monitor, "csv_monitor",
       [](const std::filesystem::path& folder) -> std::unique_ptr<Sink> { return std::make_unique<CsvSink>(folder); });
}

Monitors::~Monitors() = default;

std::vector<std::string> Monitors::describe() const {
  std::vector<std::string> out;
  for (const auto& sink : sinks_) out.push_back(sink->describe());
  return out;
}

void Monitors::write(std::span<const Scalar> scalars) {
  for (auto it = sinks_.begin(); it != sinks_.end();) {
    try {
      (*it)->write(scalars);
      ++it;
    } catch (const std::exception& e) {
      log_("warning: " + (*it)->describe() + " stopped: " + e.what() +
           " -- training goes on, without this monitor for the rest of the run");
      it = sinks_.erase(it);
    }
  }
}

std::vector<std::string> network_monitor_notes(const MonitorConfig& config, const std::filesystem::path& metrics,
                                               const std::vector<std::string>& outputs) {
  std::string instead;
  if (!metrics.empty()) instead = "--metrics " + metrics.string() + " (`shardkit report` charts it)";
  for (const std::string& output : outputs) instead += (instead.empty() ? "" : "; ") + output;
  const std::string where = instead.empty() ? "nothing records the metrics: give --metrics FILE, or enable "
                                              "tensorboard or csv_monitor in the config"
                                            : "the metrics go to " + instead;
  std::vector<std::string> notes;
  const auto note = [&](const char* key, const char* service) {
    notes.push_back(std::string(key) + ".enabled ignored: " + service +
                    " is a network service that shardkit does not talk to; " + where);
  };
  if (config.wandb) note("wandb", "Weights & Biases");
  if (config.comet) note("comet", "Comet");
  return notes;
}

}  // namespace shardkit::trainer::monitor
