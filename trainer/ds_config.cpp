// Reads a DeepSpeed JSON config the way DeepSpeed 0.19 does: batch-size resolution,
// fp16/bf16, zero_optimization, optimizer, scheduler and the few scalar keys the trainer uses, with
// Hugging Face's "auto" values resolved where shardkit knows what the Trainer would fill in. Keys
// DeepSpeed knows but shardkit does not use are accepted silently, unless enabling them changes what
// is trained (a warning); unknown keys become warnings; anything the trainer cannot run with, or
// could only run differently from DeepSpeed without a word, is an error.
#include "trainer/ds_config.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <utility>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"

namespace shardkit::trainer {
namespace {

using nlohmann::json;

// Upper bound of every unbounded integer key: far beyond any real value, and exact as a double, so
// that integral floats (5e8) can be range-checked before the conversion.
constexpr int64_t kMaxInteger = int64_t{1} << 62;
constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr double kNoLimit = std::numeric_limits<double>::infinity();
// h * h * 9 (the "auto" prefetch bucket) must fit in an int64.
constexpr int64_t kMaxHiddenSize = int64_t{1} << 24;

// Keys DeepSpeed 0.19 reads (its config classes) that shardkit does not use: accepted without an
// "unknown" warning. Those among them that change what is trained get a warning of
// their own when enabled (warn_unimplemented), or an error where ignoring them would make the run
// wrong.
constexpr const char* kUnusedTopLevelKeys[] = {"zero_allow_untested_optimizer",
                                               "zero_force_ds_cpu_optimizer",
                                               "prescale_gradients",
                                               "gradient_predivide_factor",
                                               "dump_state",
                                               "disable_allgather",
                                               "memory_breakdown",
                                               "sparse_gradients",
                                               "dataloader_drop_last",
                                               "checkpoint",
                                               "data_types",
                                               "flops_profiler",
                                               "comms_logger",
                                               "nebula",
                                               "amp",
                                               "torch_autocast",
                                               "autotuning",
                                               "elasticity",
                                               "pipeline",
                                               "compile",
                                               "timers",
                                               "graph_harvesting",
                                               "eigenvalue",
                                               "hybrid_engine",
                                               "use_data_before_expert_parallel_",
                                               "weight_quantization",
                                               "sparse_attention",
                                               "sequence_parallel_size",
                                               "seq_parallel_communication_data_type",
                                               "tensor_parallel",
                                               "progressive_layer_drop",
                                               "quantize_training",
                                               "compression_training",
                                               "curriculum_learning",
                                               "data_efficiency",
                                               "vocabulary_size"};
constexpr const char* kUnusedFp16Keys[] = {"auto_cast", "fp16_master_weights_and_grads"};
constexpr const char* kUnusedBf16Keys[] = {"check_grad_overflow", "immediate_grad_update",
                                           "bf16_master_weights_and_grads", "bf16_optimizer_states"};
constexpr const char* kUnusedZeroKeys[] = {"use_multi_rank_bucket_allreduce",
                                           "load_from_fp32_weights",
                                           "elastic_checkpoint",
                                           "stage3_model_persistence_threshold",
                                           "model_persistence_threshold",
                                           "stage3_gather_16bit_weights_on_model_save",
                                           "gather_16bit_weights_on_model_save",
                                           "stage3_gather_fp16_weights_on_model_save",
                                           "stage3_module_granularity_threshold",
                                           "module_granularity_threshold",
                                           "stage3_use_all_reduce_for_fetch_params",
                                           "use_all_reduce_for_fetch_params",
                                           "ignore_unused_parameters",
                                           "legacy_stage1",
                                           "mics_shard_size",
                                           "mics_hierarchical_params_gather",
                                           "memory_efficient_linear",
                                           "pipeline_loading_checkpoint",
                                           "override_module_apply",
                                           "log_trace_cache_warnings",
                                           "enable_sanity_checks",
                                           "leaf_module",
                                           "zero_hpz_partition_size",
                                           "zero_quantized_weights",
                                           "zero_quantized_nontrainable_weights",
                                           "zero_quantized_gradients",
                                           "zeropp_loco_param",
                                           "zenflow"};
// legacy_fusion picks between two implementations of the same update.
constexpr const char* kUnusedOptimizerKeys[] = {"legacy_fusion"};
// torch_adam picks torch's Adam over DeepSpeed's fused one: the same update.
constexpr const char* kUnusedAdamParams[] = {"torch_adam"};
// Settings of the network services behind wandb and comet, which shardkit does not talk to.
constexpr const char* kWandbKeys[] = {"group", "team", "project"};
constexpr const char* kCometKeys[] = {"samples_log_interval", "project",        "workspace", "api_key",
                                      "experiment_name",      "experiment_key", "online",    "mode"};
// The resume position comes from the checkpoint instead.
constexpr const char* kUnusedSchedulerParams[] = {"last_batch_iteration"};

// Where errors and warnings go: the file name that starts every error, and the config's warnings.
struct Report {
  const std::string& where;
  std::vector<std::string>& warnings;
};

// "must be >= 1" or "must be in [0, 3]", with the numbers formatted as JSON writes them.
template <typename T>
std::string range_text(T lo, T hi, T unbounded) {
  if (hi == unbounded) return "must be >= " + json(lo).dump();
  return "must be in [" + json(lo).dump() + ", " + json(hi).dump() + "]";
}

// One JSON object of the config (the top level or a section such as "zero_optimization"): typed
// access to its keys, errors naming "<file>: <section>.<key>", and a record of the keys looked at so
// that the others can be reported as unknown. Absent keys, null and "auto" all mean "use the
// default": every accessor returns std::nullopt for them (refuse_auto marks where "auto" cannot).
class Section {
 public:
  Section(const json& object, std::string path, Report& report)
      : object_(object), path_(std::move(path)), report_(report) {
    const std::string what = path_.empty() ? "the config" : path_;
    if (!object_.is_object()) reject(what + " must be an object, got " + value_excerpt(object_));
  }

  std::string name(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  [[noreturn]] void bad(const std::string& key, const std::string& what) const { reject(name(key) + " " + what); }

  // An error about the section as a whole (or about several of its keys).
  [[noreturn]] void reject(const std::string& what) const {
    fail(ErrorKind::kInvalidInput, report_.where + ": " + what);
  }

  void warn(const std::string& line) { report_.warnings.push_back(line); }

  // The value of `key`, or nullptr when it is absent, null or "auto". Marks the key as known.
  const json* find(const std::string& key) {
    known_.insert(key);
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null() || *it == "auto") return nullptr;
    return &*it;
  }

  bool has(const std::string& key) { return find(key) != nullptr; }

  bool is_auto(const std::string& key) {
    known_.insert(key);
    const auto it = object_.find(key);
    return it != object_.end() && *it == "auto";
  }

  // "auto" where the default is not what Hugging Face's Trainer would fill in and shardkit cannot
  // know that value: an error that says so and how to give the value instead.
  void refuse_auto(const std::string& key, const std::string& how) {
    if (is_auto(key)) bad(key, "is \"auto\", which only Hugging Face's Trainer fills in: " + how);
  }

  // An integer in [lo, hi]; integral floats such as 5e8 count as integers (Python reads 5e8 as a float
  // and DeepSpeed's pydantic models accept it for an int field), 2.5 does not.
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) bad(key, "must be an integer, got " + value_excerpt(*v));
    if (v->is_number_float()) {
      const double x = v->get<double>();
      if (x != std::floor(x)) bad(key, "is " + v->dump() + ", must be an integer");
      if (!(x >= static_cast<double>(lo) && x <= static_cast<double>(hi))) out_of_range(key, *v, lo, hi);
      return static_cast<int64_t>(x);
    }
    const bool too_large = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kMaxInteger);
    if (too_large || v->get<int64_t>() < lo || v->get<int64_t>() > hi) out_of_range(key, *v, lo, hi);
    return v->get<int64_t>();
  }

  std::optional<double> number(const std::string& key, double lo, double hi) {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) bad(key, "must be a number, got " + value_excerpt(*v));
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) bad(key, "is " + v->dump() + ", " + range_text(lo, hi, kNoLimit));
    return x;
  }

  std::optional<bool> flag(const std::string& key) {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) bad(key, "must be true or false, got " + value_excerpt(*v));
    return v->get<bool>();
  }

  std::optional<std::string> text(const std::string& key) {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) bad(key, "must be a string, got " + value_excerpt(*v));
    return v->get<std::string>();
  }

  // The object at `key` as a section; an empty one when the key is absent, null or "auto".
  Section child(const std::string& key) {
    static const json kEmpty = json::object();
    const json* v = find(key);
    return Section(v != nullptr ? *v : kEmpty, name(key), report_);
  }

  // Keys DeepSpeed knows that shardkit does not use: accepted without a warning.
  void accept(std::span<const char* const> keys) { known_.insert(keys.begin(), keys.end()); }

  void warn_unknown() {
    for (const auto& [key, value] : object_.items()) {
      if (!known_.contains(key)) warn("unknown key '" + name(key) + "' ignored");
    }
  }

 private:
  [[noreturn]] void out_of_range(const std::string& key, const json& value, int64_t lo, int64_t hi) const {
    bad(key, "is " + value.dump() + ", " + range_text(lo, hi, kMaxInteger));
  }

  const json& object_;
  std::string path_;
  Report& report_;
  std::set<std::string> known_;
};

// Stores a value that the config gives and keeps the default otherwise; returns whether it was given.
template <typename T, typename U>
bool set_if(const std::optional<T>& value, U& out) {
  if (value) out = static_cast<U>(*value);
  return value.has_value();
}

// Whether the boolean `key` of `section` is given and true.
bool is_true(Section& section, const std::string& key) {
  return section.flag(key).value_or(false);
}

// A warning for a setting that shardkit reads and does not honour, and what happens instead.
void warn_ignored(Section& section, const std::string& key, const std::string& consequence) {
  section.warn(section.name(key) + " ignored: " + consequence);
}

// "train_micro_batch_size_per_gpu 2 * gradient_accumulation_steps 4 * world size 3"
std::string batch_factors(int64_t micro, int64_t gas, int64_t world_size) {
  return "train_micro_batch_size_per_gpu " + std::to_string(micro) + " * gradient_accumulation_steps " +
         std::to_string(gas) + " * world size " + std::to_string(world_size);
}

// Train, micro and accumulation batch sizes by DeepSpeed's resolution rule.
void resolve_batch(Section& top, int64_t world_size, DsConfig& c) {
  const std::optional<int64_t> train = top.integer("train_batch_size", 1, kMaxInteger);
  // The trainer counts a micro-batch's rows in an int.
  const std::optional<int64_t> micro = top.integer("train_micro_batch_size_per_gpu", 1, kMaxInt);
  const std::optional<int64_t> gas = top.integer("gradient_accumulation_steps", 1, kMaxInteger);
  if (!train && !micro) {
    // "auto" (from a Hugging Face Trainer config) means the Trainer's own batch arguments, which
    // shardkit does not have; with one of the two sizes given, the rule below resolves the others.
    if (top.is_auto("train_batch_size") || top.is_auto("train_micro_batch_size_per_gpu")) {
      top.reject(
          "train_batch_size and train_micro_batch_size_per_gpu are \"auto\" or absent: \"auto\" is filled in by "
          "Hugging Face's Trainer only; give train_micro_batch_size_per_gpu (or train_batch_size) as a number");
    }
    top.reject("either train_batch_size or train_micro_batch_size_per_gpu must be given");
  }
  // The six cases of §2.1 in two lines: a missing gas is train / micro / ws when both are given and 1
  // otherwise; a missing micro is train / ws / gas (train is given then).
  // (Each quotient is checked before it divides: train_batch_size 12 with a micro-batch of 2 at world
  // size 8 leaves no accumulation step, and dividing by that zero killed the process with SIGFPE.)
  c.gradient_accumulation_steps = gas ? *gas : train && micro ? *train / *micro / world_size : 1;
  if (c.gradient_accumulation_steps < 1) {
    top.reject("train_batch_size " + std::to_string(*train) + " is smaller than train_micro_batch_size_per_gpu " +
               std::to_string(*micro) + " * world size " + std::to_string(world_size));
  }
  c.micro_batch_per_gpu = micro ? *micro : *train / world_size / c.gradient_accumulation_steps;
  if (c.micro_batch_per_gpu < 1) {
    top.reject("train_batch_size " + std::to_string(*train) + " is smaller than gradient_accumulation_steps " +
               std::to_string(c.gradient_accumulation_steps) + " * world size " + std::to_string(world_size));
  }
  if (c.micro_batch_per_gpu > kMaxInt) {
    top.reject("train_batch_size " + std::to_string(*train) + " gives a micro-batch of " +
               std::to_string(c.micro_batch_per_gpu) + " per rank, more than " + std::to_string(kMaxInt));
  }
  const std::string factors = batch_factors(c.micro_batch_per_gpu, c.gradient_accumulation_steps, world_size);
  // Checked in floating point first: given micro and gas sizes can make the int64 product overflow.
  const double approximate = static_cast<double>(c.micro_batch_per_gpu) * c.gradient_accumulation_steps * world_size;
  if (approximate > static_cast<double>(kMaxInteger)) top.reject(factors + " is too large");
  const int64_t product = c.micro_batch_per_gpu * c.gradient_accumulation_steps * world_size;
  c.train_batch_size = train.value_or(product);
  // Given sizes are positive, so a product equal to the train size has positive factors.
  if (c.train_batch_size != product) {
    top.reject("train_batch_size " + std::to_string(c.train_batch_size) + " != " + factors);
  }
}

Fp16Config parse_fp16(Section fp16) {
  Fp16Config out;
  set_if(fp16.flag("enabled"), out.enabled);
  set_if(fp16.number("loss_scale", 0, kNoLimit), out.loss_scale);
  // 2^127 is the largest power of two a float32 holds.
  set_if(fp16.integer("initial_scale_power", 0, 127), out.initial_scale_power);
  set_if(fp16.integer("loss_scale_window", 1, kMaxInteger), out.loss_scale_window);
  set_if(fp16.integer("hysteresis", 1, kMaxInt), out.hysteresis);
  set_if(fp16.flag("consecutive_hysteresis"), out.consecutive_hysteresis);
  // A zero floor would let the dynamic scale halve down to 0 and zero every gradient.
  if (set_if(fp16.number("min_loss_scale", 0, kNoLimit), out.min_loss_scale) && out.min_loss_scale == 0) {
    fp16.bad("min_loss_scale", "is 0, must be positive");
  }
  // DeepSpeed casts floating-point model inputs; the inputs here are token ids, which it leaves alone.
  if (is_true(fp16, "auto_cast")) warn_ignored(fp16, "auto_cast", "the model's inputs are token ids, never cast");
  if (is_true(fp16, "fp16_master_weights_and_grads")) {
    warn_ignored(fp16, "fp16_master_weights_and_grads", "master weights and gradients stay fp32");
  }
  fp16.accept(kUnusedFp16Keys);
  fp16.warn_unknown();
  return out;
}

// "bf16" or its older spelling "bfloat16"; DeepSpeed reads "bf16" when both are given.
bool parse_bf16(Section& top) {
  const bool has_new = top.has("bf16");
  if (has_new && top.has("bfloat16")) top.warn("bfloat16 ignored: bf16 is given");
  Section bf16 = top.child(has_new ? "bf16" : "bfloat16");
  bool enabled = false;
  set_if(bf16.flag("enabled"), enabled);
  if (is_true(bf16, "bf16_master_weights_and_grads")) {
    warn_ignored(bf16, "bf16_master_weights_and_grads", "master weights and gradients stay fp32");
  }
  if (is_true(bf16, "bf16_optimizer_states")) warn_ignored(bf16, "bf16_optimizer_states", "optimizer states stay fp32");
  bf16.accept(kUnusedBf16Keys);
  bf16.warn_unknown();
  return enabled;
}

// offload_optimizer / offload_param, or the deprecated boolean that stood for {"device": "cpu"}.
OffloadConfig parse_offload(Section& zero, const std::string& key, const std::string& deprecated_key) {
  OffloadConfig out;
  if (const std::optional<bool> legacy = zero.flag(deprecated_key)) {
    if (zero.has(key)) zero.bad(deprecated_key, "is deprecated and cannot be given together with " + key);
    zero.warn(zero.name(deprecated_key) + " is deprecated (use " + zero.name(key) + ")");
    if (*legacy) out.device = OffloadDevice::kCpu;
    return out;
  }
  // The other keys (ratio, buffer_size, max_in_cpu, ...) tune parts of DeepSpeed's swapper that
  // shardkit does not have: they are accepted without a warning.
  Section offload = zero.child(key);
  if (const std::optional<std::string> device = offload.text("device")) {
    if (*device == "cpu") {
      out.device = OffloadDevice::kCpu;
    } else if (*device == "nvme") {
      out.device = OffloadDevice::kNvme;
    } else if (*device != "none") {
      offload.bad("device", "is '" + *device + "', must be none, cpu or nvme");
    }
  }
  set_if(offload.flag("pin_memory"), out.pin_memory);
  set_if(offload.text("nvme_path"), out.nvme_path);
  if (out.device == OffloadDevice::kNvme && out.nvme_path.empty()) {
    offload.bad("nvme_path", "must be given for device nvme (the folder of the swap files)");
  }
  set_if(offload.integer("buffer_count", 1, kMaxInt), out.buffer_count);
  set_if(offload.flag("fast_init"), out.fast_init);
  return out;
}

// DeepSpeed's "aio" block (its AioConfig): thread_count is the older name of intra_op_parallelism.
AioConfig parse_aio(Section aio) {
  AioConfig out;
  constexpr int64_t kAlignment = 4096;  // O_DIRECT's transfers are multiples of the block size
  if (set_if(aio.integer("block_size", kAlignment, int64_t{1} << 30), out.block_size) &&
      out.block_size % kAlignment != 0) {
    aio.bad("block_size", "is " + std::to_string(out.block_size) + ", must be a multiple of 4096 (O_DIRECT)");
  }
  set_if(aio.integer("queue_depth", 1, 4096), out.queue_depth);
  if (aio.has("thread_count") && aio.has("intra_op_parallelism")) {
    aio.bad("thread_count", "and " + aio.name("intra_op_parallelism") + " are the same setting: give one of them");
  }
  set_if(aio.integer(aio.has("thread_count") ? "thread_count" : "intra_op_parallelism", 1, kMaxInt),
         out.intra_op_parallelism);
  set_if(aio.flag("single_submit"), out.single_submit);
  set_if(aio.flag("overlap_events"), out.overlap_events);
  set_if(aio.flag("use_gds"), out.use_gds);
  aio.warn_unknown();
  return out;
}

// "auto" bucket sizes as Hugging Face's Trainer fills them from the model's hidden size. The Trainer
// fills the two stage3_ keys only at stage 3; they are unused below stage 3, so filling them always
// changes nothing there and keeps the rule simple.
void resolve_auto_sizes(Section& zero, int64_t hidden_size, ZeroConfig& out) {
  if (hidden_size == 0) return;  // no model size known: "auto" keeps the defaults
  const int64_t h = hidden_size;
  if (zero.is_auto("reduce_bucket_size")) out.reduce_bucket_size = h * h;
  if (zero.is_auto("stage3_prefetch_bucket_size")) out.stage3_prefetch_bucket_size = h * h * 9 / 10;  // 0.9 h², down
  if (zero.is_auto("stage3_param_persistence_threshold")) out.stage3_param_persistence_threshold = 10 * h;
}

// A stage-3 size under its "stage3_" name or under the field name that DeepSpeed's config class
// accepts as well (prefetch_bucket_size, ...).
std::optional<int64_t> stage3_size(Section& zero, const std::string& key) {
  const std::string field = key.substr(std::string_view("stage3_").size());
  const bool by_field = zero.has(field);
  if (by_field && zero.has(key)) zero.bad(field, "and " + zero.name(key) + " are the same setting: give one of them");
  return zero.integer(by_field ? field : key, 0, kMaxInteger);
}

ZeroConfig parse_zero(Section zero, int64_t hidden_size) {
  ZeroConfig out;
  set_if(zero.integer("stage", 0, 3), out.stage);
  set_if(zero.flag("contiguous_gradients"), out.contiguous_gradients);
  set_if(zero.flag("reduce_scatter"), out.reduce_scatter);
  if (!set_if(zero.flag("overlap_comm"), out.overlap_comm)) out.overlap_comm = out.stage == 3;
  set_if(zero.flag("allgather_partitions"), out.allgather_partitions);
  // DeepSpeed's ranges: 0 is allowed for every size (a bucket of 0 holds one tensor, as in DeepSpeed).
  set_if(zero.integer("reduce_bucket_size", 0, kMaxInteger), out.reduce_bucket_size);
  set_if(zero.integer("allgather_bucket_size", 0, kMaxInteger), out.allgather_bucket_size);
  if (out.allgather_bucket_size % 2 != 0) {
    zero.bad("allgather_bucket_size", "is " + std::to_string(out.allgather_bucket_size) + ", must be even");
  }
  set_if(stage3_size(zero, "stage3_prefetch_bucket_size"), out.stage3_prefetch_bucket_size);
  set_if(stage3_size(zero, "stage3_param_persistence_threshold"), out.stage3_param_persistence_threshold);
  set_if(stage3_size(zero, "stage3_max_live_parameters"), out.stage3_max_live_parameters);
  set_if(stage3_size(zero, "stage3_max_reuse_distance"), out.stage3_max_reuse_distance);
  set_if(zero.integer("sub_group_size", 0, kMaxInteger), out.sub_group_size);
  set_if(zero.flag("round_robin_gradients"), out.round_robin_gradients);
  resolve_auto_sizes(zero, hidden_size, out);
  out.offload_optimizer = parse_offload(zero, "offload_optimizer", "cpu_offload");
  out.offload_param = parse_offload(zero, "offload_param", "cpu_offload_param");
  // DeepSpeed reads this deprecated key without applying it anywhere.
  if (zero.has("cpu_offload_use_pin_memory")) {
    zero.warn(zero.name("cpu_offload_use_pin_memory") + " is deprecated and ignored (use offload_*.pin_memory)");
  }
  if (is_true(zero, "zero_quantized_weights")) {
    warn_ignored(zero, "zero_quantized_weights", "weights travel unquantized");
  }
  if (is_true(zero, "zero_quantized_nontrainable_weights")) {
    warn_ignored(zero, "zero_quantized_nontrainable_weights", "weights are kept unquantized");
  }
  if (is_true(zero, "zero_quantized_gradients")) {
    warn_ignored(zero, "zero_quantized_gradients", "gradients travel unquantized");
  }
  if (zero.has("zenflow")) warn_ignored(zero, "zenflow", "every step updates every parameter");
  zero.accept(kUnusedZeroKeys);
  zero.warn_unknown();
  return out;
}

// "Adam", "AdamW" or "Lion" in any case (DeepSpeed compares them in lower case), as their canonical
// spelling.
std::string optimizer_type(Section& optimizer, const std::string& type) {
  std::string lower = type;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower == "adam") return "Adam";
  if (lower == "adamw") return "AdamW";
  if (lower == "lion") return "Lion";
  optimizer.bad("type", "'" + type + "' is not supported (supported: Adam, AdamW, Lion)");
}

// DeepSpeed hands optimizer.params to the optimizer's constructor, and Lion's takes no Adam settings:
// a config that gives one would not start under DeepSpeed either.
constexpr const char* kAdamOnlyParams[] = {"eps", "adam_w_mode", "bias_correction", "amsgrad", "torch_adam"};

// betas: [beta1, beta2], each in [0, 1) as torch.optim.Adam requires.
void parse_betas(Section& params, OptimizerConfig& out) {
  const json* betas = params.find("betas");
  if (betas == nullptr) return;
  const auto valid = [](const json& b) { return b.is_number() && b.get<double>() >= 0 && b.get<double>() < 1; };
  if (!betas->is_array() || betas->size() != 2 || !valid((*betas)[0]) || !valid((*betas)[1])) {
    params.bad("betas", "must be [beta1, beta2] with each in [0, 1), got " + value_excerpt(*betas));
  }
  out.beta1 = (*betas)[0].get<double>();
  out.beta2 = (*betas)[1].get<double>();
}

// A value the command line gives beside the config: it fills "auto"; a number that differs is an error.
template <typename T>
void check_command_line(Section& section, const std::string& key, const std::optional<T>& config_value,
                        const std::optional<T>& option, const std::string& option_name) {
  if (option && config_value && *config_value != *option) {
    section.bad(key, "is " + json(*config_value).dump() + " but " + option_name + " is " + json(*option).dump() +
                         ": give one of them");
  }
}

OptimizerConfig parse_optimizer(Section& top, const std::optional<double>& lr) {
  OptimizerConfig out;
  if (!top.has("optimizer")) {
    if (lr) out.lr = *lr;
    return out;
  }
  out.given = true;
  Section optimizer = top.child("optimizer");
  if (const std::optional<std::string> type = optimizer.text("type")) out.type = optimizer_type(optimizer, *type);
  out.kind = out.type == "Lion" ? OptimizerKind::kLion : OptimizerKind::kAdamW;
  Section params = optimizer.child("params");
  if (params.has("max_grad_norm")) params.bad("max_grad_norm", "is not supported: use gradient_clipping");
  // The Trainer's default learning rate (5e-5) is not shardkit's (1e-3): "auto" cannot mean either.
  if (!lr) params.refuse_auto("lr", "give the learning rate as a number, or with --lr");
  const std::optional<double> config_lr = params.number("lr", 0, kNoLimit);
  check_command_line(params, "lr", config_lr, lr, "--lr");
  set_if(config_lr, out.lr);
  set_if(lr, out.lr);
  parse_betas(params, out);
  set_if(params.number("weight_decay", 0, kNoLimit), out.weight_decay);
  if (out.kind == OptimizerKind::kLion) {
    for (const char* key : kAdamOnlyParams) {
      if (params.has(key)) params.bad(key, "is an Adam setting: Lion takes lr, betas and weight_decay");
    }
    params.warn_unknown();
    optimizer.accept(kUnusedOptimizerKeys);
    optimizer.warn_unknown();
    return out;
  }
  set_if(params.number("eps", 0, kNoLimit), out.eps);
  set_if(params.flag("adam_w_mode"), out.adam_w_mode);
  if (is_true(params, "amsgrad")) params.bad("amsgrad", "is true: AMSGrad is not implemented (Adam and AdamW are)");
  if (out.type == "AdamW" && !out.adam_w_mode) {
    params.warn(params.name("adam_w_mode") + " false ignored: AdamW always decouples weight decay");
    out.adam_w_mode = true;
  }
  set_if(params.flag("bias_correction"), out.bias_correction);
  params.accept(kUnusedAdamParams);
  params.warn_unknown();
  optimizer.accept(kUnusedOptimizerKeys);
  optimizer.warn_unknown();
  return out;
}

// "tensorboard" or "csv_monitor": enabled, output_path, job_name.
MonitorOutputConfig parse_monitor_output(Section section) {
  MonitorOutputConfig out;
  set_if(section.flag("enabled"), out.enabled);
  set_if(section.text("output_path"), out.output_path);
  set_if(section.text("job_name"), out.job_name);
  section.warn_unknown();
  return out;
}

// "wandb" or "comet": whether it is enabled; its other settings are accepted and unused.
bool parse_network_monitor(Section section, std::span<const char* const> settings) {
  bool enabled = false;
  set_if(section.flag("enabled"), enabled);
  section.accept(settings);
  section.warn_unknown();
  return enabled;
}

MonitorConfig parse_monitor(Section& top) {
  MonitorConfig out;
  out.tensorboard = parse_monitor_output(top.child("tensorboard"));
  out.csv_monitor = parse_monitor_output(top.child("csv_monitor"));
  out.wandb = parse_network_monitor(top.child("wandb"), kWandbKeys);
  out.comet = parse_network_monitor(top.child("comet"), kCometKeys);
  return out;
}

SchedulerType scheduler_type(Section& scheduler, const std::string& type) {
  if (type == "WarmupLR") return SchedulerType::kWarmupLR;
  if (type == "WarmupDecayLR") return SchedulerType::kWarmupDecayLR;
  if (type == "WarmupCosineLR") return SchedulerType::kWarmupCosineLR;
  scheduler.bad("type", "'" + type + "' is not supported (supported: WarmupLR, WarmupDecayLR, WarmupCosineLR)");
}

// The params each scheduler type takes; a param of another type is reported as an unknown key.
// `total_steps` and `optimizer_lr` stand for the "auto" values the Trainer would fill in.
void parse_scheduler_params(Section params, int64_t total_steps, double optimizer_lr,
                            const std::optional<int64_t>& warmup_steps, SchedulerConfig& out) {
  const bool cosine = out.type == SchedulerType::kWarmupCosineLR;
  if (!cosine) {
    set_if(params.number("warmup_min_lr", 0, kNoLimit), out.warmup_min_lr);
    // The Trainer fills in the optimizer's lr. Left unset, WarmupDecayLR would take DeepSpeed's 0.001.
    if (params.is_auto("warmup_max_lr")) {
      out.warmup_max_lr = optimizer_lr;
    } else if (const std::optional<double> max_lr = params.number("warmup_max_lr", 0, kNoLimit)) {
      out.warmup_max_lr = max_lr;
    }
  }
  // The Trainer fills it from its warmup_steps or warmup_ratio (default 0); shardkit's default is 1000.
  if (!warmup_steps) params.refuse_auto("warmup_num_steps", "give the number of warmup steps, or with --warmup-steps");
  const std::optional<int64_t> config_warmup = params.integer("warmup_num_steps", 0, kMaxInteger);
  check_command_line(params, "warmup_num_steps", config_warmup, warmup_steps, "--warmup-steps");
  set_if(config_warmup, out.warmup_num_steps);
  set_if(warmup_steps, out.warmup_num_steps);
  set_if(params.text("warmup_type"), out.warmup_type);
  if (out.warmup_type != "log" && out.warmup_type != "linear") {
    params.bad("warmup_type", "is '" + out.warmup_type + "', must be log or linear");
  }
  if (out.type != SchedulerType::kWarmupLR) {
    const char* type = cosine ? "WarmupCosineLR" : "WarmupDecayLR";
    if (params.is_auto("total_num_steps")) {
      // The Trainer fills in the run's length: here, the optimizer steps the run is given.
      if (total_steps < 1) {
        params.bad("total_num_steps", "is \"auto\" and the run's step count is not known here: give it as a number");
      }
      out.total_num_steps = total_steps;
    } else if (!set_if(params.integer("total_num_steps", 1, kMaxInteger), out.total_num_steps)) {
      params.bad("total_num_steps", std::string("is required for ") + type);
    }
  }
  if (cosine) {
    set_if(params.number("warmup_min_ratio", 0, 1), out.warmup_min_ratio);
    set_if(params.number("cos_min_ratio", 0, 1), out.cos_min_ratio);
  }
  params.accept(kUnusedSchedulerParams);
  params.warn_unknown();
}

SchedulerConfig parse_scheduler(Section& top, int64_t total_steps, double optimizer_lr,
                                const std::optional<int64_t>& warmup_steps) {
  SchedulerConfig out;
  Section scheduler = top.child("scheduler");
  const std::optional<std::string> type = scheduler.text("type");
  if (type) {
    out.type = scheduler_type(scheduler, *type);
    parse_scheduler_params(scheduler.child("params"), total_steps, optimizer_lr, warmup_steps, out);
  } else if (scheduler.has("params")) {
    // DeepSpeed builds no scheduler without a type; its params are then unused.
    scheduler.warn(scheduler.name("params") + " ignored: no scheduler type");
  }
  if (!type && warmup_steps) {
    top.reject("--warmup-steps " + std::to_string(*warmup_steps) +
               " needs a scheduler in the config (scheduler.type WarmupLR, WarmupDecayLR or WarmupCosineLR)");
  }
  scheduler.warn_unknown();
  return out;
}

// "activation_checkpointing": present, it turns the recomputation on (ds_config.hpp says why). What
// DeepSpeed's other keys do is either what shardkit always does or nothing a data-parallel run can
// use: contiguous_memory_optimization (DeepSpeed copies the checkpoints into one preallocated buffer of
// number_checkpoints entries, against fragmentation) is how shardkit keeps them anyway, in one buffer
// sized for every block; the rest get a line saying they have no effect.
ActivationCheckpointingConfig parse_activation_checkpointing(Section& top) {
  ActivationCheckpointingConfig out;
  if (!top.has("activation_checkpointing")) return out;
  Section section = top.child("activation_checkpointing");
  out.enabled = true;
  set_if(section.flag("cpu_checkpointing"), out.cpu_checkpointing);
  section.flag("contiguous_memory_optimization");
  section.integer("number_checkpoints", 1, kMaxInteger);
  if (is_true(section, "partition_activations")) {
    warn_ignored(section, "partition_activations",
                 "it splits each checkpoint across model-parallel ranks, and shardkit has none: every rank keeps its "
                 "own blocks' inputs");
  }
  if (is_true(section, "synchronize_checkpoint_boundary")) {
    warn_ignored(section, "synchronize_checkpoint_boundary",
                 "the recomputation is ordered on the GPU's stream, without host waits");
  }
  if (is_true(section, "profile")) {
    warn_ignored(section, "profile",
                 "wall_clock_breakdown times the passes (each block's recomputation counts in the backward pass)");
  }
  section.warn_unknown();
  return out;
}

// A top-level section and what happens instead when it is given with "enabled": true.
struct IgnoredSection {
  const char* key;
  const char* instead;
};

// A warning for each of `sections` that is enabled.
void warn_enabled(Section& top, std::span<const IgnoredSection> sections) {
  for (const auto& [key, instead] : sections) {
    if (!top.has(key)) continue;
    Section section = top.child(key);
    if (is_true(section, "enabled")) warn_ignored(top, std::string(key) + ".enabled", instead);
  }
}

// Sections of the top level that change what DeepSpeed trains and that shardkit does not implement:
// a warning each when enabled, an error where ignoring it would change what the batch keys mean.
void warn_unimplemented(Section& top) {
  const IgnoredSection switched[] = {
      {"amp", "Apex mixed precision is not implemented (fp16 and bf16 are)"},
      {"torch_autocast", "torch.autocast mixed precision is not implemented (fp16 and bf16 are)"},
      {"progressive_layer_drop", "every layer runs at every step"},
      {"curriculum_learning", "every sequence is trained at its full length"},
      {"data_efficiency", "no curriculum sampling or random layer-token drop; data is read in shardkit's order"},
      {"quantize_training", "weights are not quantized"},
      {"elasticity", "the batch sizes come from the batch keys"},
  };
  warn_enabled(top, switched);
  if (top.has("data_types")) {
    Section types = top.child("data_types");
    const std::optional<std::string> accumulate = types.text("grad_accum_dtype");
    if (accumulate && *accumulate != "fp32" && *accumulate != "float32" && *accumulate != "float" &&
        *accumulate != "torch.float32") {
      warn_ignored(types, "grad_accum_dtype", "gradients accumulate in fp32, not " + *accumulate);
    }
  }
  if (top.has("sparse_attention")) warn_ignored(top, "sparse_attention", "attention stays dense");
  // Dividing before the reduction instead of after: the same mean, rounded in another order.
  if (is_true(top, "prescale_gradients")) {
    warn_ignored(top, "prescale_gradients", "gradients are averaged after their reduction");
  }
  if (top.number("gradient_predivide_factor", 0, kNoLimit).value_or(1.0) != 1.0) {
    warn_ignored(top, "gradient_predivide_factor", "gradients are averaged after their reduction");
  }
  if (top.has("compression_training")) {
    Section compression = top.child("compression_training");
    // Each technique has shared_parameters.enabled; layer_reduction has enabled of its own.
    for (const char* technique : {"weight_quantization", "activation_quantization", "sparse_pruning", "row_pruning",
                                  "head_pruning", "channel_pruning"}) {
      if (!compression.has(technique)) continue;
      Section shared = compression.child(technique).child("shared_parameters");
      if (is_true(shared, "enabled")) warn_ignored(compression, technique, "the model trains uncompressed");
    }
    if (compression.has("layer_reduction")) {
      Section layer_reduction = compression.child("layer_reduction");
      if (is_true(layer_reduction, "enabled")) {
        warn_ignored(compression, "layer_reduction", "the model trains uncompressed");
      }
    }
  }
  // Both split the ranks into groups that share a batch: ignored, each rank would take a batch of its
  // own and train_batch_size would no longer hold.
  const auto refuse_above_1 = [](Section& section, const std::string& key, int64_t lo) {
    const int64_t size = section.integer(key, lo, kMaxInteger).value_or(1);
    if (size > 1)
      section.bad(key, "is " + std::to_string(size) + ", must be at most 1: shardkit parallelises over data only");
  };
  refuse_above_1(top, "sequence_parallel_size", 1);
  if (top.has("tensor_parallel")) {
    Section tensor_parallel = top.child("tensor_parallel");
    refuse_above_1(tensor_parallel, "autotp_size", 0);
  }
}

// Diagnostics DeepSpeed prints or logs and shardkit does not: a warning each when enabled, naming what
// shardkit reports instead, so that a config brought from DeepSpeed does not wait for output that
// never comes.
void warn_unreported(Section& top) {
  const IgnoredSection diagnostics[] = {
      {"flops_profiler",
       "no FLOPs profile is printed; each step's line gives tokens/s, and on GPUs `train --profile-step N` puts one "
       "step in the CUDA profiler's range"},
      {"comms_logger",
       "collectives are not logged one by one; wall_clock_breakdown adds each step's reduction time to its line"},
      {"autotuning", "the batch and ZeRO settings run as the config gives them"},
  };
  warn_enabled(top, diagnostics);
  // DeepSpeed reads it as a plain value (truthy or not); only true says that a breakdown is wanted.
  if (const json* breakdown = top.find("memory_breakdown"); breakdown != nullptr && *breakdown == true) {
    warn_ignored(top, "memory_breakdown",
                 "the start-up lines give each rank's parameters, gradients, optimizer states and activations");
  }
}

void check_context(int world_size, const AutoContext& context, const std::string& where) {
  if (world_size < 1) fail(ErrorKind::kInvalidInput, where + ": world size " + std::to_string(world_size) + " < 1");
  if (context.total_steps < 0) {
    fail(ErrorKind::kInvalidInput, where + ": total steps " + std::to_string(context.total_steps) + " < 0");
  }
  if (context.hidden_size < 0 || context.hidden_size > kMaxHiddenSize) {
    fail(ErrorKind::kInvalidInput, where + ": hidden size " + std::to_string(context.hidden_size) +
                                       " (for \"auto\" values) must be in [0, " + std::to_string(kMaxHiddenSize) + "]");
  }
}

json fp16_json(const Fp16Config& f) {
  return {{"enabled", f.enabled},
          {"loss_scale", f.loss_scale},
          {"initial_scale_power", f.initial_scale_power},
          {"loss_scale_window", f.loss_scale_window},
          {"hysteresis", f.hysteresis},
          {"consecutive_hysteresis", f.consecutive_hysteresis},
          {"min_loss_scale", f.min_loss_scale}};
}

json offload_json(const OffloadConfig& o) {
  json out = {{"device", offload_device_name(o.device)}, {"pin_memory", o.pin_memory}};
  if (o.device == OffloadDevice::kNvme) {
    out["nvme_path"] = o.nvme_path;
    out["buffer_count"] = o.buffer_count;
    out["fast_init"] = o.fast_init;
  }
  return out;
}

json aio_json(const AioConfig& a) {
  return {{"block_size", a.block_size},
          {"queue_depth", a.queue_depth},
          {"intra_op_parallelism", a.intra_op_parallelism},
          {"single_submit", a.single_submit},
          {"overlap_events", a.overlap_events},
          {"use_gds", a.use_gds}};
}

json zero_json(const ZeroConfig& z) {
  return {{"stage", z.stage},
          {"contiguous_gradients", z.contiguous_gradients},
          {"reduce_scatter", z.reduce_scatter},
          {"overlap_comm", z.overlap_comm},
          {"allgather_partitions", z.allgather_partitions},
          {"reduce_bucket_size", z.reduce_bucket_size},
          {"allgather_bucket_size", z.allgather_bucket_size},
          {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
          {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
          {"stage3_max_live_parameters", z.stage3_max_live_parameters},
          {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
          {"sub_group_size", z.sub_group_size},
          {"round_robin_gradients", z.round_robin_gradients},
          {"offload_optimizer", offload_json(z.offload_optimizer)},
          {"offload_param", offload_json(z.offload_param)}};
}

json monitor_output_json(const MonitorOutputConfig& m) {
  return {{"enabled", m.enabled}, {"output_path", m.output_path}, {"job_name", m.job_name}};
}

json optimizer_json(const OptimizerConfig& o) {
  if (o.kind == OptimizerKind::kLion) {
    return {{"type", o.type},
            {"params", {{"lr", o.lr}, {"betas", {o.beta1, o.beta2}}, {"weight_decay", o.weight_decay}}}};
  }
  return {{"type", o.type},
          {"params",
           {{"lr", o.lr},
            {"betas", {o.beta1, o.beta2}},
            {"eps", o.eps},
            {"weight_decay", o.weight_decay},
            {"adam_w_mode", o.adam_w_mode},
            {"bias_correction", o.bias_correction}}}};
}

const char* scheduler_name(SchedulerType type) {
  switch (type) {
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
    case SchedulerType::kNone:
      break;
  }
  return "none";
}

// Only the params of the configured type, so that the output reads back without warnings.
json scheduler_json(const SchedulerConfig& s) {
  json params = {{"warmup_num_steps", s.warmup_num_steps}, {"warmup_type", s.warmup_type}};
  if (s.type == SchedulerType::kWarmupCosineLR) {
    params["warmup_min_ratio"] = s.warmup_min_ratio;
    params["cos_min_ratio"] = s.cos_min_ratio;
  } else {
    params["warmup_min_lr"] = s.warmup_min_lr;
    if (s.warmup_max_lr) params["warmup_max_lr"] = *s.warmup_max_lr;  // unset: the optimizer's lr
  }
  if (s.type != SchedulerType::kWarmupLR) params["total_num_steps"] = s.total_num_steps;
  return {{"type", scheduler_name(s.type)}, {"params", params}};
}

// DeepSpeed's spellings, case-insensitive as DeepSpeed lower-cases them.
std::optional<ckpt::DType> parse_comm_dtype(Section& top) {
  const std::optional<std::string> given = top.text("communication_data_type");
  if (!given) return std::nullopt;
  std::string name = *given;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (name == "fp32") return ckpt::DType::kF32;
  if (name == "fp16") return ckpt::DType::kF16;
  if (name == "bf16") return ckpt::DType::kBF16;
  top.bad("communication_data_type", "is " + value_excerpt(json(*given)) + ", must be \"fp32\", \"fp16\" or \"bf16\"");
}

}  // namespace

DsConfig parse_ds_config(const nlohmann::json& config, int world_size, const AutoContext& context,
                         const std::string& where) {
  check_context(world_size, context, where);
  DsConfig c;
  Report report{where, c.warnings};
  Section top(config, "", report);
  resolve_batch(top, world_size, c);
  c.fp16 = parse_fp16(top.child("fp16"));
  c.bf16 = parse_bf16(top);
  if (c.fp16.enabled && c.bf16) top.reject("fp16.enabled and bf16.enabled are both true");
  c.zero = parse_zero(top.child("zero_optimization"), context.hidden_size);
  c.aio = parse_aio(top.child("aio"));
  c.optimizer = parse_optimizer(top, context.lr);
  c.scheduler = parse_scheduler(top, context.total_steps, c.optimizer.lr, context.warmup_steps);
  set_if(top.number("gradient_clipping", 0, kNoLimit), c.gradient_clipping);
  set_if(top.integer("steps_per_print", 1, kMaxInteger), c.steps_per_print);
  set_if(top.flag("wall_clock_breakdown"), c.wall_clock_breakdown);
  c.monitor = parse_monitor(top);
  c.communication_data_type = parse_comm_dtype(top);
  c.activation_checkpointing = parse_activation_checkpointing(top);
  if (c.bf16 && c.communication_data_type == ckpt::DType::kF16) {
    // bf16 has fp32's range and no loss scale: a gradient sum past 65504 becomes an infinity, and every
    // such step is skipped as an overflow.
    top.warn("communication_data_type fp16 with bf16 training: gradient sums above 65504 overflow");
  }
  warn_unimplemented(top);
  warn_unreported(top);
  top.accept(kUnusedTopLevelKeys);
  top.warn_unknown();
  return c;
}

DsConfig load_ds_config(const std::filesystem::path& file, int world_size, const AutoContext& context) {
  const std::string text = read_small_file(file, json_limits::kDsConfig.max_bytes, ErrorKind::kInvalidInput);
  return parse_ds_config_text(text, world_size, context, file.string());
}

DsConfig parse_ds_config_text(std::string_view text, int world_size, const AutoContext& context,
                              const std::string& where) {
  const json config = parse_untrusted_json(text, json_limits::kDsConfig, where, ErrorKind::kInvalidInput);
  return parse_ds_config(config, world_size, context, where);
}

const char* comm_dtype_name(ckpt::DType type) noexcept {
  return type == ckpt::DType::kF16 ? "fp16" : type == ckpt::DType::kBF16 ? "bf16" : "fp32";
}

nlohmann::json to_json(const DsConfig& c) {
  json j = {{"train_batch_size", c.train_batch_size},
            {"train_micro_batch_size_per_gpu", c.micro_batch_per_gpu},
            {"gradient_accumulation_steps", c.gradient_accumulation_steps},
            {"fp16", fp16_json(c.fp16)},
            {"bf16", {{"enabled", c.bf16}}},
            {"zero_optimization", zero_json(c.zero)},
            {"gradient_clipping", c.gradient_clipping},
            {"steps_per_print", c.steps_per_print},
            {"wall_clock_breakdown", c.wall_clock_breakdown}};
  // Both sections are left out when the config had none, so that the output reads back the same.
  if (c.optimizer.given) j["optimizer"] = optimizer_json(c.optimizer);
  if (c.scheduler.type != SchedulerType::kNone) j["scheduler"] = scheduler_json(c.scheduler);
  if (c.communication_data_type) j["communication_data_type"] = comm_dtype_name(*c.communication_data_type);
  if (c.monitor.tensorboard.enabled) j["tensorboard"] = monitor_output_json(c.monitor.tensorboard);
  if (c.monitor.csv_monitor.enabled) j["csv_monitor"] = monitor_output_json(c.monitor.csv_monitor);
  if (c.zero.offload_optimizer.device == OffloadDevice::kNvme || c.zero.offload_param.device == OffloadDevice::kNvme) {
    j["aio"] = aio_json(c.aio);
  }
  if (c.activation_checkpointing.enabled) {
    j["activation_checkpointing"] = {{"cpu_checkpointing", c.activation_checkpointing.cpu_checkpointing}};
  }
  return j;
}

}  // namespace shardkit::trainer
