// The DeepSpeed-style JSON training config, accepted as DeepSpeed accepts it (the keys and defaults
// of DeepSpeed 0.19's config classes; where DeepSpeed versions differ, shardkit follows 0.19 and says
// so in README's compatibility table).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/tensor_table.hpp"
#include "trainer/optimizer.hpp"

namespace shardkit::trainer {

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;  // 0 = dynamic; > 0 = static scale
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
};

// Where offload_optimizer / offload_param put their states: parsed once from the config's "device".
enum class OffloadDevice { kNone, kCpu, kNvme };
// "none", "cpu", "nvme": the config's words, for messages and the resolved config. Inline: the CUDA
// module's memory plan names them without linking the config parser.
constexpr const char* offload_device_name(OffloadDevice device) noexcept {
  return device == OffloadDevice::kCpu ? "cpu" : device == OffloadDevice::kNvme ? "nvme" : "none";
}

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;
  bool pin_memory = false;
  // Device "nvme" (ZeRO-Infinity): the folder of the swap files, the swapper's bounce buffers, and
  // DeepSpeed's lazy initialisation of the swap (accepted; shardkit allocates the file up front).
  std::string nvme_path{};
  int64_t buffer_count = 4;
  bool fast_init = false;
};

// DeepSpeed's "aio" block: how the NVMe swap does its I/O. block_size (bytes, a multiple of 4096 for
// O_DIRECT) is the size of every request and of the swapper's chunks; queue_depth the requests in
// flight. The rest tune DeepSpeed's own thread pool and event handling, which io_uring replaces.
struct AioConfig {
  int64_t block_size = 1'048'576;
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;  // "thread_count" in older DeepSpeed versions
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  bool overlap_comm = false;  // resolved: true for stage 3, false otherwise, unless given
  bool allgather_partitions = true;
  int64_t reduce_bucket_size = 500'000'000;  // elements
  int64_t allgather_bucket_size = 500'000'000;
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  int64_t sub_group_size = 1'000'000'000;
  bool round_robin_gradients = false;
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;
};

struct OptimizerConfig {
  std::string type = "AdamW";                  // canonical: "Adam", "AdamW" or "Lion"
  OptimizerKind kind = OptimizerKind::kAdamW;  // Adam and AdamW: kAdamW
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;  // Adam and AdamW only, as the next three
  double weight_decay = 0.0;
  bool adam_w_mode = true;  // decoupled weight decay; "Adam" means AdamW unless adam_w_mode is false
  bool bias_correction = true;
  bool given = false;  // false when the config has no "optimizer" section (defaults are used)
};

enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };

struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr;  // WarmupLR/WarmupDecayLR; unset = the optimizer's lr
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" | "linear"
  int64_t total_num_steps = 0;      // WarmupDecayLR, WarmupCosineLR (required there)
  double warmup_min_ratio = 0.0;    // WarmupCosineLR
  double cos_min_ratio = 1e-4;      // WarmupCosineLR
};

// DeepSpeed's "tensorboard" and "csv_monitor" sections: the monitor writes into output_path/job_name,
// a folder relative to the working directory when output_path is empty (DeepSpeed's defaults).
struct MonitorOutputConfig {
  bool enabled = false;
  std::string output_path{};
  std::string job_name = "DeepSpeedJobName";
  std::filesystem::path folder() const { return std::filesystem::path(output_path) / job_name; }
};

// The monitor sections (trainer/monitor/ writes them). wandb and comet report to network services
// that shardkit does not talk to: only whether they were asked for is kept, to say so.
struct MonitorConfig {
  MonitorOutputConfig tensorboard;
  MonitorOutputConfig csv_monitor;
  bool wandb = false;
  bool comet = false;
};

// DeepSpeed's "activation_checkpointing" section. In DeepSpeed it configures deepspeed.checkpointing,
// which the model's code then calls (or not); shardkit's models are its own, so the section present
// turns the recomputation on (train --activation-checkpointing does so without one): each transformer
// block's input is kept and the block's forward pass rerun before its backward pass
// (model::ActivationPlan). Of the other keys only cpu_checkpointing changes anything.
struct ActivationCheckpointingConfig {
  bool enabled = false;
  bool cpu_checkpointing = false;  // GPUs: the kept block inputs in page-locked host memory
};

struct DsConfig {
  // Batch sizes after DeepSpeed's resolution rule: train = micro * gas * world_size.
  int64_t train_batch_size = 0;
  int64_t micro_batch_per_gpu = 0;  // at most INT_MAX: the trainer counts its rows in an int
  int64_t gradient_accumulation_steps = 0;
  Fp16Config fp16;
  bool bf16 = false;
  ZeroConfig zero;
  AioConfig aio;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  double gradient_clipping = 1.0;  // 0 disables
  // communication_data_type: the type gradients travel in between ranks (fp32, or bf16/fp16 for half
  // the bytes, rounded before and after each reduction). Unset means fp32 here, where DeepSpeed takes
  // the compute type (README's compatibility table says why); comm_dtype() resolves it.
  std::optional<ckpt::DType> communication_data_type;
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  MonitorConfig monitor;
  ActivationCheckpointingConfig activation_checkpointing;
  // One line per unknown or ignored key, e.g. "unknown key 'foo' ignored" (rank 0 prints them).
  std::vector<std::string> warnings;
};

inline ckpt::DType comm_dtype(const DsConfig& c) noexcept {
  return c.communication_data_type.value_or(ckpt::DType::kF32);
}
// DeepSpeed's name of a communication type: "fp32", "fp16" or "bf16".
const char* comm_dtype_name(ckpt::DType type) noexcept;

// What "auto" values resolve from, as Hugging Face's Trainer integration does.
struct AutoContext {
  int64_t hidden_size = 0;  // n_embd of the model: reduce_bucket_size = h*h, etc.
  int64_t total_steps = 0;  // the run's optimizer steps (--steps): scheduler total_num_steps; 0 = unknown
  // The command line's --lr and --warmup-steps, which stand in for the Trainer's arguments: they fill
  // optimizer.params.lr and scheduler.params.warmup_num_steps where the config says "auto" (or leaves
  // the optimizer out); a number in the config that differs is an error, as the Trainer makes it.
  std::optional<double> lr;
  std::optional<int64_t> warmup_steps;
};

// Parses and validates `config`; `where` (a file name) starts every error message. Errors are
// Error(kInvalidInput), one line, naming the key and the numbers (e.g. "train_batch_size 32 !=
// train_micro_batch_size_per_gpu 2 * gradient_accumulation_steps 4 * world size 3").
DsConfig parse_ds_config(const nlohmann::json& config, int world_size, const AutoContext& context,
                         const std::string& where);

// Reads a JSON file (comments and trailing commas allowed, as DeepSpeed's hjson reader allows them)
// and parses it.
DsConfig load_ds_config(const std::filesystem::path& file, int world_size, const AutoContext& context);
// The same for the file's text.
DsConfig parse_ds_config_text(std::string_view text, int world_size, const AutoContext& context,
                              const std::string& where);

// The resolved configuration as JSON (every field above, "auto" replaced), for manifests and logs.
nlohmann::json to_json(const DsConfig& config);

}  // namespace shardkit::trainer
