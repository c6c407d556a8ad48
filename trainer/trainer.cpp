#include "trainer/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include "base/clock.hpp"
#include "base/error.hpp"
#include "base/fault.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "base/text_format.hpp"
#include "base/write_target.hpp"
#include "ckpt/run_dir.hpp"
#include "ckpt/run_lock.hpp"
#include "ckpt/shard_format.hpp"
#include "model/cpu/gemm.hpp"
#include "model/hf_weights.hpp"
#include "model/registry.hpp"
#include "trainer/backend.hpp"
#include "trainer/checkpointing.hpp"
#include "trainer/data.hpp"
#include "trainer/ds_config.hpp"
#include "trainer/init.hpp"
#include "trainer/loss_scaler.hpp"
#include "trainer/lr_schedule.hpp"
#include "trainer/monitor/monitors.hpp"
#include "trainer/slow_phase.hpp"

namespace shardkit::trainer {
namespace {

// Ranks that share this node split its cores.
int default_threads(comm::MpiCollective& comm) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / comm.node_place().size);
}

}  // namespace

struct Trainer::State {
  comm::MpiCollective& comm;
  TrainOptions options;
  DsConfig config;
  std::shared_ptr<const model::Model> model;
  ckpt::TensorTable table;
  int seq_len = 0;  // tokens per sample: --seq-len, or the model's longest
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<TokenFile> tokens;
  std::unique_ptr<SampleOrder> order;
  std::unique_ptr<ckpt::RunLock> lock;  // rank 0, while saving into options.save_dir
  std::unique_ptr<Checkpointer> checkpointer;
  std::ofstream metrics;
  std::unique_ptr<monitor::Monitors> monitors;  // rank 0, when the config enables tensorboard or csv_monitor
  SlowPhases* phases = nullptr;                 // during start-up: long phases say what they do

  // Trainer state, saved in every checkpoint.
  int64_t step = 0;
  int64_t consumed_samples = 0;
  int64_t skipped_steps = 0;
  int64_t optimizer_steps = 0;        // the optimizer's step count (non-skipped steps)
  int64_t last_batch_iteration = -1;  // DeepSpeed scheduler counter
  uint64_t data_seed = 0;

  std::vector<int32_t> inputs, targets;

  State(comm::MpiCollective& c, const TrainOptions& o) : comm(c), options(o) {}
  bool root() const { return comm.rank() == 0; }
  void log(const std::string& line) const {
    if (root() && !options.quiet) print_line(stdout, "%s", line.c_str()), std::fflush(stdout);
  }
  nlohmann::json trainer_state() const;
  void restore(const nlohmann::json& state, const std::string& where);

  // Start-up, in order: the model and DeepSpeed config, with the notices they call for; what the
  // backend is built from; checkpointing (the save directory's lock, the snapshot buffers); the
  // parameters (resumed, read from --init-from, or initialised); the memory report; the metrics file.
  void configure();
  BackendOptions backend_options();
  void open_checkpointing(SlowPhases& phases);
  void initialize_parameters(SlowPhases& phases, const std::string& what);
  void report_memory();
  void report_device_use();
  void open_metrics();
  // Rank 0 opens the monitors the config enables; a folder it cannot write fails every rank alike.
  void open_monitors();

  // One optimizer step: the micro-batches' forward and backward passes, the reduction and overflow
  // check, the optimizer step (or a skipped step), the console line.
  StepRecord train_step();
  // Runs the micro-batches, adding their times to *fwd_ms and *bwd_ms; returns the sum of their losses.
  double accumulate_gradients(float grad_scale, double* fwd_ms, double* bwd_ms);
  // The optimizer over gradients of norm `norm` (unscaled), clipped as configured.
  void optimizer_step(double norm, double scale, double lr);
  void print_step(const StepRecord& r) const;
  void write_metrics(const nlohmann::json& record);
  // The step's scalars to the monitors (DeepSpeed's x-axis: the samples consumed).
  void write_monitors(const StepRecord& r);
  void save();
  void report(const std::vector<SaveOutcome>& saves);  // log lines and metrics events of completed saves
  // Rank 0 locks the save directory and clears what killed saves left there; every rank fails alike.
  void take_save_dir();
  // Loads the first of --resume's candidates that every rank reads without error, warning about each
  // one skipped; false when there is none to try.
  bool resume();
};

nlohmann::json Trainer::State::trainer_state() const {
  return {{"step", step},
          {"consumed_samples", consumed_samples},
          {"skipped_steps", skipped_steps},
          {"optimizer_steps", optimizer_steps},
          {"lr_scheduler", {{"last_batch_iteration", last_batch_iteration}}},
          {"loss_scaler", scaler->to_json()},
          {"data", {{"seed", data_seed}, {"seq_len", seq_len}, {"file", options.data.string()}}},
          {"world_size", comm.size()},
          {"zero_stage", config.zero.stage},
          {"train_batch_size", config.train_batch_size}};
}

void Trainer::State::restore(const nlohmann::json& s, const std::string& where) {
  // Each is range-checked before use: a negative or huge step would name step directories
  // "step--0000002" or run a trillion steps; the counters cannot exceed the steps taken.
  auto integer = [&](const nlohmann::json& j, const char* key, int64_t lo, int64_t hi) {
    return integer_field(j, key, where + ": trainer_state", lo, hi, ErrorKind::kCorrupt);
  };
  step = integer(s, "step", 0, ckpt::kMaxStep);
  consumed_samples = integer(s, "consumed_samples", 0, int64_t{1} << 62);  // sample indices add to it
  skipped_steps = integer(s, "skipped_steps", 0, step);
  optimizer_steps = integer(s, "optimizer_steps", 0, step);
  last_batch_iteration =
      integer(s.value("lr_scheduler", nlohmann::json::object()), "last_batch_iteration", -1, ckpt::kMaxStep);
  // A checkpoint made by `convert import` has not trained yet: its loss scaler and data order are this
  // run's own (from the config and --seed).
  if (s.contains("loss_scaler")) scaler->from_json(s["loss_scaler"], where);
  if (!s.contains("data")) return;
  const nlohmann::json& data = s["data"];
  if (!data.is_object() || !data.contains("seed") || !data["seed"].is_number_unsigned()) {
    fail(ErrorKind::kCorrupt, where + ": trainer_state.data.seed is missing or not an unsigned 64-bit integer");
  }
  data_seed = data["seed"].get<uint64_t>();
  if (data_seed != options.seed) {
    log("note: continuing the checkpoint's data order (seed " + std::to_string(data_seed) + "), not --seed " +
        std::to_string(options.seed));
  }
}

Trainer::Trainer(comm::MpiCollective& comm, const TrainOptions& options) : s_(std::make_unique<State>(comm, options)) {
  State& s = *s_;
  s.configure();
  const BackendOptions bo = s.backend_options();
  // Start-up work grows with the model: at billions of parameters allocating, initialising and loading
  // take seconds to minutes, and say so while they run.
  SlowPhases phases([&s](const std::string& line) { s.log(line); });
  s.phases = &phases;
  const std::string params = format_count(s.table.total_elements()) + " parameters";
  const bool cuda = options.device == ComputeDevice::kCuda;
  phases.run("allocating the model and ZeRO states (" + params + ", " + (cuda ? "cuda" : "cpu") + ")",
             [&] { s.backend = cuda ? make_cuda_backend(bo) : make_cpu_backend(bo); });
  s.schedule = std::make_unique<LrSchedule>(s.config.scheduler, s.config.optimizer.lr);
  s.scaler = std::make_unique<LossScaler>(s.config.fp16, s.config.bf16);
  s.tokens = std::make_unique<TokenFile>(options.data);
  s.inputs.resize(static_cast<size_t>(bo.micro_batch) * s.seq_len);
  s.targets.resize(static_cast<size_t>(bo.micro_batch) * s.seq_len);
  s.data_seed = options.seed;
  s.open_checkpointing(phases);
  s.initialize_parameters(phases, params);
  s.phases = nullptr;
  s.order = std::make_unique<SampleOrder>(*s.tokens, s.seq_len, s.data_seed);
  s.report_memory();
  s.open_metrics();
  s.open_monitors();
}

void Trainer::State::configure() {
  if (options.steps < 1) fail(ErrorKind::kInvalidInput, "--steps must be at least 1");
  model = model::resolve_model(options.model);
  config = load_ds_config(options.config, comm.size(),
                          {model->hidden_size(), options.steps, options.lr, options.warmup_steps});
  for (const std::string& w : config.warnings) log("warning: " + options.config.string() + ": " + w);
  const bool cpu = options.device == ComputeDevice::kCpu;
  if (cpu && (config.fp16.enabled || config.bf16)) {
    log(std::string("notice: ") + (config.bf16 ? "bf16" : "fp16") +
        " requested: on CPU ranks the arithmetic stays fp32; loss scaling and overflow checks run as configured");
  }
  if (cpu && (config.zero.offload_optimizer.device == OffloadDevice::kCpu ||
              config.zero.offload_param.device == OffloadDevice::kCpu)) {
    log("notice: offload_optimizer/offload_param device cpu have no effect on CPU ranks (the states are already in "
        "host memory)");
  }
  ActivationCheckpointingConfig& checkpointing = config.activation_checkpointing;
  if (checkpointing.enabled || options.activation_checkpointing) {
    log(std::string("activation checkpointing (") +
        (checkpointing.enabled ? "the config's activation_checkpointing section" : "--activation-checkpointing") +
        "): each block keeps only its input and reruns its forward pass in the backward pass" +
        (checkpointing.cpu_checkpointing && !cpu ? "; the inputs in page-locked host memory (cpu_checkpointing)" : ""));
    checkpointing.enabled = true;
    if (cpu && checkpointing.cpu_checkpointing) {
      log("notice: activation_checkpointing.cpu_checkpointing has no effect on CPU ranks (the block inputs are already "
          "in host memory)");
    }
  }
  model::cpu::set_compute_threads(options.threads > 0 ? options.threads : default_threads(comm));
  table = model->table();
  if (options.seq_len < 0 || options.seq_len > model->max_seq_len()) {
    fail(ErrorKind::kInvalidInput, "--seq-len " + std::to_string(options.seq_len) + " is outside [1, " +
                                       std::to_string(model->max_seq_len()) + "], the sequence lengths model " +
                                       model->name() + " supports");
  }
  seq_len = options.seq_len > 0 ? options.seq_len : model->max_seq_len();
}

BackendOptions Trainer::State::backend_options() {
  BackendOptions bo;
  bo.model = model.get();
  bo.config = &config;
  bo.micro_batch = static_cast<int>(config.micro_batch_per_gpu);
  bo.seq_len = seq_len;
  bo.comm = &comm;
  if (options.snapshot_staging == SnapshotStaging::kDevice && options.device != ComputeDevice::kCuda) {
    fail(ErrorKind::kInvalidInput, "--snapshot-staging device needs --device cuda (CPU ranks copy in host memory)");
  }
  if (options.profile_step != 0 && options.device != ComputeDevice::kCuda) {
    fail(ErrorKind::kInvalidInput, "--profile-step needs --device cuda (it marks a step for the CUDA profilers)");
  }
  if (options.profile_step < 0 || options.profile_step > options.steps) {
    fail(ErrorKind::kInvalidInput, "--profile-step " + std::to_string(options.profile_step) + " is not a step of " +
                                       "this run (1 to --steps " + std::to_string(options.steps) + ")");
  }
  bo.snapshot_staging = options.snapshot_staging;
  bo.log = [this](const std::string& line) { log(line); };
  return bo;
}

void Trainer::State::open_checkpointing(SlowPhases& slow) {
  if (options.save_dir.empty()) return;
  take_save_dir();
  checkpointer = std::make_unique<Checkpointer>(comm, options.save_dir, options.keep_last, ckpt::ShardOptions{},
                                                options.save_mode, [this](const std::string& line) { log(line); });
  slow.run("allocating the checkpoint snapshot buffers", [&] { backend->reserve_snapshot(); });
}

void Trainer::State::initialize_parameters(SlowPhases& slow, const std::string& what) {
  if (resume()) return;
  if (!options.init_from.empty()) {
    const model::HfWeights weights(options.init_from);
    if (weights.model()->architecture() != model->architecture()) {
      fail(ErrorKind::kInvalidInput,
           options.init_from.string() + ": its config.json describes another model than " + model->name());
    }
    slow.run("reading " + what + " from " + options.init_from.string(), [&] {
      backend->initialize([&](int t, int64_t offset, std::span<float> out) { weights.read(t, offset, out); });
    });
    log("initialised from " + options.init_from.string());
    return;
  }
  slow.run("initialising " + what, [&] { backend->initialize(RandomInit(*model, options.seed)); });
}

void Trainer::State::report_memory() {
  // Every rank reports what it holds, so that ZeRO's 1/N savings are visible.
  const std::string mine =
      "rank " + std::to_string(comm.rank()) + ": " + describe_memory(backend->memory(), backend->activation_bytes());
  const std::vector<std::string> all = comm.gather(mine);
  const ckpt::DType comm_type = comm_dtype(config);
  const std::string wire = comm.size() > 1 && comm_type != ckpt::DType::kF32
                               ? std::string(", gradients reduced in ") + comm_dtype_name(comm_type)
                               : "";
  log("model " + model->name() + " (" + model->family() + "): " + std::to_string(table.total_elements()) +
      " parameters; " + std::to_string(comm.size()) + " ranks, ZeRO stage " + std::to_string(config.zero.stage) + wire +
      "; batch " + std::to_string(config.train_batch_size) + " = " + std::to_string(config.micro_batch_per_gpu) +
      " x " + std::to_string(config.gradient_accumulation_steps) + " accumulation x " + std::to_string(comm.size()) +
      " ranks, sequence " + std::to_string(seq_len) + "; " + std::string(backend->optimizer().name) + "; " +
      backend->describe());
  for (const std::string& line : all) log("  " + line);
}

void Trainer::State::report_device_use() {
  // After the first step every working buffer has reached its size: how the plan compares, on the
  // rank that took the most.
  const Backend::DeviceUse use = backend->device_use();
  if (use.planned == 0) return;  // not a GPU backend (on every rank alike)
  const std::vector<std::string> all = comm.gather(std::to_string(use.measured) + " " + std::to_string(use.planned));
  if (!root()) return;
  int64_t measured = -1, planned = 0;
  int rank = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    long long m = 0, p = 0;
    if (std::sscanf(all[r].c_str(), "%lld %lld", &m, &p) == 2 && m > measured) {
      measured = m;
      planned = p;
      rank = static_cast<int>(r);
    }
  }
  log("GPU memory after the first step: " + format_bytes(static_cast<double>(measured)) + " in use on rank " +
      std::to_string(rank) + (all.size() > 1 ? " (the most of any rank)" : "") + ", planned " +
      format_bytes(static_cast<double>(planned)));
}

void Trainer::State::open_metrics() {
  if (!root() || options.metrics.empty()) return;
  // The metrics file may lie in a run folder from elsewhere: a link, FIFO or device there would take
  // the records outside it (or block), so it must be a regular file of its own before it is appended to.
  open_own_file(options.metrics, O_WRONLY | O_APPEND | O_CREAT).close();
  metrics.open(options.metrics, std::ios::app);
  if (!metrics) fail(ErrorKind::kInvalidInput, options.metrics.string() + ": cannot open for appending");
}

void Trainer::State::open_monitors() {
  std::string error;
  if (root()) {
    try {
      std::vector<std::string> outputs;
      if (config.monitor.tensorboard.enabled || config.monitor.csv_monitor.enabled) {
        monitors = std::make_unique<monitor::Monitors>(config.monitor, options.config.string(),
                                                       [this](const std::string& line) { log(line); });
        outputs = monitors->describe();
      }
      for (const std::string& line : outputs) log("monitor: " + line);
      for (const std::string& line : monitor::network_monitor_notes(config.monitor, options.metrics, outputs)) {
        log("warning: " + options.config.string() + ": " + line);
      }
    } catch (const std::exception& e) {
      error = error_to_text(e);
    }
  }
  throw_if_error_text(comm.broadcast(error));
}

Trainer::~Trainer() = default;

StepRecord Trainer::State::train_step() {
  const auto start = Clock::now();
  const int64_t gas = config.gradient_accumulation_steps;
  const int W = comm.size();
  const double scale = scaler->scale();
  const FaultScope faults(comm.rank(), step + 1);  // for fault points deep in the step (swap-enospc)
  if (fault_armed("step-error", comm.rank(), step + 1)) {
    fail(ErrorKind::kIo, "step " + std::to_string(step + 1) + ": injected failure (SHARDKIT_FAULT=step-error)");
  }
  if (fault_armed("stall", comm.rank(), step + 1)) std::this_thread::sleep_for(std::chrono::hours(1));
  crash_point("step-kill", comm.rank(), step + 1);

  StepRecord r;
  const double loss_sum =
      accumulate_gradients(static_cast<float>(scale / static_cast<double>(gas)), &r.forward_ms, &r.backward_ms);
  const auto reduce_start = Clock::now();
  backend->reduce_grads();
  // One pass and one synchronisation: the squared-gradient sum (in double, so no finite fp32
  // gradients can overflow it) is non-finite exactly when some gradient is.
  const double grad_sq = backend->global_grad_sq();
  const bool overflow = scaler->checks_overflow() && !std::isfinite(grad_sq);
  r.reduce_ms = ms_since(reduce_start);

  r.step = step + 1;
  r.loss_scale = scale;
  r.lr = schedule->lr(last_batch_iteration);
  const auto opt_start = Clock::now();
  scaler->update(overflow);
  if (overflow) {
    // DeepSpeed: the step is skipped, the scheduler does not advance, the samples count as consumed.
    r.skipped = true;
    r.grad_norm = std::nan("");
    ++skipped_steps;
  } else {
    // Gradients are summed over ranks and scaled by the loss scale the backward pass used.
    r.grad_norm = std::sqrt(grad_sq) / W / scale;
    optimizer_step(r.grad_norm, scale, r.lr);
  }
  r.optimizer_ms = ms_since(opt_start);
  r.loss = comm.allreduce_sum(loss_sum) / static_cast<double>(gas * W);
  ++step;
  consumed_samples += config.train_batch_size;
  r.tokens = config.train_batch_size * seq_len;
  r.step_ms = ms_since(start);
  r.tokens_per_s = static_cast<double>(r.tokens) / (r.step_ms / 1000.0);
  if (root() && (r.step % config.steps_per_print == 0 || r.step == options.steps)) {
    print_step(r);
  }
  return r;
}

double Trainer::State::accumulate_gradients(float grad_scale, double* fwd_ms, double* bwd_ms) {
  const int T = seq_len;
  const int micro = static_cast<int>(config.micro_batch_per_gpu);
  const int W = comm.size();
  backend->zero_grads();
  double loss_sum = 0;
  for (int64_t m = 0; m < config.gradient_accumulation_steps; ++m) {
    // Global sample indices of this step: micro-step m, rank r, row i -> consumed + (m * W + r) * micro + i.
    for (int i = 0; i < micro; ++i) {
      const int64_t g = consumed_samples + (m * W + comm.rank()) * micro + i;
      order->fill(g, model->vocab_size(), inputs.data() + static_cast<size_t>(i) * T,
                  targets.data() + static_cast<size_t>(i) * T);
    }
    model::PassTimes times;
    loss_sum += backend->forward_backward(inputs.data(), targets.data(), grad_scale, &times);
    *fwd_ms += times.forward_ms;
    *bwd_ms += times.backward_ms;
  }
  return loss_sum;
}

void Trainer::State::optimizer_step(double norm, double scale, double lr) {
  const double clip = config.gradient_clipping;
  const double clip_factor = clip > 0 ? std::max(1.0, (norm + 1e-6) / clip) : 1.0;
  OptimizerStep a;
  a.kind = config.optimizer.kind;
  a.lr = lr;
  a.beta1 = config.optimizer.beta1;
  a.beta2 = config.optimizer.beta2;
  a.eps = config.optimizer.eps;
  a.weight_decay = config.optimizer.weight_decay;
  a.adam_w_mode = config.optimizer.adam_w_mode;
  a.bias_correction = config.optimizer.bias_correction;
  a.step = ++optimizer_steps;
  a.grad_multiplier = 1.0 / (static_cast<double>(comm.size()) * scale * clip_factor);
  backend->step(a);
  ++last_batch_iteration;
}

void Trainer::State::print_step(const StepRecord& r) const {
  char line[512];
  std::snprintf(line, sizeof(line),
                "step %6lld/%lld | loss %.4f | lr %.3e | grad norm %7.4f | scale %g%s | %8.1f ms | %9.0f tok/s",
                static_cast<long long>(r.step), static_cast<long long>(options.steps), r.loss, r.lr, r.grad_norm,
                r.loss_scale, r.skipped ? " (skipped: overflow)" : "", r.step_ms, r.tokens_per_s);
  std::string text = line;
  if (config.wall_clock_breakdown) {
    std::snprintf(line, sizeof(line), " | fwd %.1f bwd %.1f reduce %.1f optim %.1f ms", r.forward_ms, r.backward_ms,
                  r.reduce_ms, r.optimizer_ms);
    text += line;
  }
  log(text);
}

void Trainer::State::write_metrics(const nlohmann::json& record) {
  if (!metrics.is_open()) return;
  metrics << record.dump() << "\n";
  metrics.flush();
}

void Trainer::State::write_monitors(const StepRecord& r) {
  if (!monitors) return;
  const FaultScope faults(comm.rank(), r.step);  // for the fault point monitor-enospc
  monitor::StepContext c;
  c.samples_after = consumed_samples;
  c.samples_before = consumed_samples - config.train_batch_size;
  c.next_lr = schedule->lr(last_batch_iteration);
  if (config.fp16.enabled) c.loss_scale = scaler->scale();
  c.wall_clock_breakdown = config.wall_clock_breakdown;
  monitors->write(monitor::step_scalars(r, c));
}

void Trainer::State::save() {
  checkpointer->save(step, table, *backend, trainer_state(), model->to_json(), to_json(config));
}

bool Trainer::State::resume() {
  const ResumeCandidates found = resume_candidates(options.resume, options.save_dir);
  const std::vector<std::filesystem::path>& candidates = found.paths;
  std::vector<std::filesystem::path> damaged;  // skipped: broken manifests, then checkpoints that fail to load
  for (const auto& d : found.damaged) {
    log("warning: skipping " + d.dir.string() + ": " + d.problem);
    damaged.push_back(d.dir);
  }
  // Damaged checkpoints go out of the way (the run will save those steps again), and `latest` names the
  // checkpoint loaded if it named one of them.
  auto set_damaged_aside = [&](const std::filesystem::path& loaded) {
    if (root() && !damaged.empty()) {
      for (const auto& dir : damaged) log("notice: " + ckpt::set_aside_damaged(dir));
      bool stale = false;
      try {
        std::error_code ec;
        const auto latest = ckpt::read_latest(options.save_dir);
        stale = latest && !std::filesystem::exists(options.save_dir / *latest, ec);
      } catch (const Error&) {
        stale = true;  // a damaged `latest`, or a symbolic link: replaced as well
      }
      if (!loaded.empty() && stale) {
        write_file_durable(options.save_dir / ckpt::kLatestFileName, loaded.filename().string() + "\n");
      }
    }
    comm.barrier();
  };
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::filesystem::path& path = candidates[i];
    const auto load_start = Clock::now();
    nlohmann::json state;
    std::string error;
    try {
      const auto load = [&] { state = load_checkpoint(path, *model, *backend); };
      if (phases) {
        phases->run("loading " + path.string(), load);
      } else {
        load();
      }
    } catch (const Error& e) {
      // Damage (a flipped bit, a truncated or missing shard) moves on to an older checkpoint; a
      // checkpoint of another model, or one the user named, is the user's to sort out.
      if ((e.kind() != ErrorKind::kCorrupt && e.kind() != ErrorKind::kIo) || options.resume != "auto") throw;
      error = e.what();
    }
    // Every rank read its own part: all must have succeeded.
    std::string first_error;
    for (const std::string& e : comm.gather(error)) {
      if (first_error.empty()) first_error = e;
    }
    first_error = comm.broadcast(first_error);
    if (!first_error.empty()) {
      log("warning: skipping " + path.string() + ": " + first_error);
      damaged.push_back(path);
      if (i + 1 == candidates.size()) {
        fail(ErrorKind::kCorrupt, "no checkpoint in " + options.save_dir.string() + " can be loaded (" +
                                      std::to_string(candidates.size()) +
                                      " tried; the last: " + first_error.substr(0, 300) + ")");
      }
      continue;
    }
    // The slowest rank's time; the states read (weights and two moments) are the same at any world size.
    const double seconds = comm.allreduce_max(seconds_since(load_start));
    const double bytes = 3.0 * sizeof(float) * static_cast<double>(table.total_elements());
    restore(state, path.string());
    char rate[96];
    std::snprintf(rate, sizeof(rate), ": %s of states read in %.2f s (%.2f GB/s)", format_bytes(bytes).c_str(), seconds,
                  bytes / seconds / 1e9);
    log("resumed from " + path.string() + " at step " + std::to_string(step) + " (" + std::to_string(comm.size()) +
        " ranks, ZeRO stage " + std::to_string(config.zero.stage) + ")" + rate);
    set_damaged_aside(path);
    return true;
  }
  set_damaged_aside({});
  return false;
}

void Trainer::State::take_save_dir() {
  std::string error;
  if (root()) {
    try {
      std::string previous;
      lock = std::make_unique<ckpt::RunLock>(options.save_dir, "shardkit train", &previous);
      if (!previous.empty()) log("notice: " + previous);
      const ckpt::RunDirCleanup cleanup = ckpt::clean_run_dir(options.save_dir);
      for (const std::string& line : cleanup.removed) log("notice: " + line);
      for (const std::string& line : cleanup.left_alone) log("warning: " + line);
    } catch (const std::exception& e) {
      error = error_to_text(e);  // another job's lock is bad input; a failed clean-up is not
    }
  }
  throw_if_error_text(comm.broadcast(error));
}

void Trainer::State::report(const std::vector<SaveOutcome>& saves) {
  for (const SaveOutcome& o : saves) {
    if (!o.error.empty()) {
      log("warning: checkpoint of step " + std::to_string(o.step) + " failed: " + o.error +
          (options.stop_on_save_error ? "" : " -- training goes on, the previous checkpoint is intact"));
      write_metrics({{"event", "checkpoint_error"}, {"step", o.step}, {"path", o.path.string()}, {"error", o.error}});
      if (options.stop_on_save_error) fail(ErrorKind::kIo, o.error);
      continue;
    }
    char line[320];
    std::snprintf(line, sizeof(line),
                  ": %s committed in %.0f ms; training lost %.1f ms (save() held the loop %.1f ms, the device "
                  "waited %.1f ms for the snapshot)",
                  format_bytes(static_cast<double>(o.bytes)).c_str(), o.write_ms, o.training_lost_ms(),
                  o.loop_blocked_ms, o.device_wait_ms);
    log("checkpoint " + o.path.string() + line);
    write_metrics({{"event", "checkpoint"},
                   {"step", o.step},
                   {"path", o.path.string()},
                   {"bytes", o.bytes},
                   {"training_lost_ms", o.training_lost_ms()},
                   {"loop_blocked_ms", o.loop_blocked_ms},
                   {"device_wait_ms", o.device_wait_ms},
                   {"write_ms", o.write_ms},
                   {"prune_ms", o.prune_ms}});
    if (monitors) {
      // The samples at the checkpoint's step: this run's batch size has not changed since.
      const int64_t samples = consumed_samples - (step - o.step) * config.train_batch_size;
      const monitor::Scalar scalar = monitor::checkpoint_scalar(o.training_lost_ms(), samples);
      const FaultScope faults(comm.rank(), step);
      monitors->write({&scalar, 1});
    }
  }
}

std::vector<StepRecord> Trainer::run() {
  State& s = *s_;
  std::vector<StepRecord> records;
  if (s.step >= s.options.steps) {
    s.log("nothing to do: the run is at step " + std::to_string(s.step) + " of " + std::to_string(s.options.steps));
    return records;
  }
  if (s.options.profile_step > 0 && s.options.profile_step <= s.step) {
    s.log("warning: --profile-step " + std::to_string(s.options.profile_step) + " was taken before this run " +
          "resumed at step " + std::to_string(s.step) + ": no step is profiled");
  }
  while (s.step < s.options.steps) {
    const bool profiled = s.step + 1 == s.options.profile_step;
    if (profiled) s.backend->profiler_range(true);
    const StepRecord r = s.train_step();
    if (profiled) s.backend->profiler_range(false);
    records.push_back(r);
    if (records.size() == 1) s.report_device_use();
    nlohmann::json m = {{"step", r.step},
                        {"loss", r.loss},
                        {"lr", r.lr},
                        {"grad_norm", nullptr},
                        {"loss_scale", r.loss_scale},
                        {"skipped", r.skipped},
                        {"tokens", r.tokens},
                        {"step_ms", r.step_ms},
                        {"tokens_per_s", r.tokens_per_s}};
    if (!r.skipped) m["grad_norm"] = r.grad_norm;
    s.write_metrics(m);
    s.write_monitors(r);
    const bool at_end = s.step == s.options.steps;
    const bool on_interval = s.options.save_interval > 0 && s.step % s.options.save_interval == 0;
    if (s.checkpointer && (on_interval || at_end)) s.save();
    if (s.checkpointer) s.report(s.checkpointer->poll());
  }
  if (s.checkpointer) s.report(s.checkpointer->finish());  // the last save is committed before returning
  return records;
}

}  // namespace shardkit::trainer
