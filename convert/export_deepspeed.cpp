#include "convert/export_deepspeed.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "base/thread_pool.hpp"
#include "base/write_target.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/dtype_convert.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/deepspeed/ds_checkpoint.hpp"
#include "convert/deepspeed/ds_layout.hpp"
#include "convert/deepspeed/ds_run.hpp"
#include "convert/source.hpp"
#include "convert/staging.hpp"
#include "convert/torch/torch_writer.hpp"
#include "model/registry.hpp"

namespace shardkit::convert {
namespace {

namespace ds = deepspeed;
using torch::Value;
using torch::ValueBuilder;

// The DeepSpeed release whose file layout these files follow (0.14 to 0.16 and later share it); its
// loader checks the version of a stage 1 checkpoint.
constexpr const char* kFormatVersion = "0.14.5";
// DeepSpeed's default stage-3 sub-group size.
constexpr int64_t kDefaultSubGroupSize = 1'000'000'000;
constexpr int kFp32 = kSourceFp32;

// The source with what DeepSpeed needs back: recorded by an import, or derived from the model shardkit
// trained.
struct Source : CheckpointSource {
  ds::DeepSpeedRun full_run;
};

Source open_source(const std::filesystem::path& path, const std::string& model_name) {
  Source s{open_checkpoint_source(path, model_name), {}};
  // DeepSpeed's Lion (FusedLion, DeepSpeedCPULion) keeps exp_avg alone; its Adam and AdamW both moments.
  if (!holds_lion_states(s)) require_adamw_or_weights(s, "a DeepSpeed checkpoint (or Lion's fp32, exp_avg)");
  if (!s.has_moments) {
    fail(ErrorKind::kInvalidInput, s.path.string() +
                                       ": holds no optimizer moments; DeepSpeed resumes from the fp32 "
                                       "master weights and the optimizer's moments");
  }
  s.full_run = optimizer_run(s);
  return s;
}

// One storage record of an output file: runs of a state of table tensors, constants and zeros, in order.
struct Segment {
  int tensor = -1;  // -1: zeros; -2: `constant`
  int64_t offset = 0;
  int64_t length = 0;
  float constant = 0;
};
struct Storage {
  size_t file = 0;
  std::string key;
  int state = kFp32;
  ckpt::DType dtype = ckpt::DType::kF32;
  std::vector<Segment> segments;
  std::vector<int64_t> starts;  // each segment's first element
  int64_t numel = 0;
  void add(Segment s) {
    if (s.length == 0) return;
    starts.push_back(numel);
    numel += s.length;
    segments.push_back(s);
  }
};

torch::Dtype torch_dtype(ckpt::DType d) {
  return d == ckpt::DType::kF32    ? torch::Dtype::kF32
         : d == ckpt::DType::kBF16 ? torch::Dtype::kBF16
                                   : torch::Dtype::kF16;
}

// The files of one rank (or the model states of stage 1/2), built as values with their storages.
class Files {
 public:
  struct File {
    std::filesystem::path path;
    const Value* root = nullptr;
  };
  ValueBuilder b;
  std::vector<File> files;
  std::deque<Storage> storages;  // a deque: storages are referred to while more are added

  // A new storage in file `file` and a tensor of `shape` over all of it.
  Storage& storage(size_t file, int state, ckpt::DType dtype) {
    Storage& s = storages.emplace_back();
    s.file = file;
    s.key = std::to_string(next_key_[file]++);
    s.state = state;
    s.dtype = dtype;
    return s;
  }
  const Value* tensor(const Storage& s, const std::vector<int64_t>& shape) {
    return b.tensor(b.storage(s.key, torch_dtype(s.dtype), s.numel), 0, shape);
  }
  size_t add_file(std::filesystem::path path) {
    files.push_back({std::move(path), nullptr});
    next_key_.push_back(0);
    return files.size() - 1;
  }

 private:
  std::vector<int> next_key_;
};

struct Target {
  int world_size = 0;
  int stage = 0;
  ckpt::DType dtype = ckpt::DType::kF32;
  int64_t sub_group_size = kDefaultSubGroupSize;
};

// The values every file shares.
struct Common {
  const Value* ds_config = nullptr;
  const Value* version = nullptr;
  const Value* loss_scaler = nullptr;
  bool dynamic = false;
  double clip_grad = 0;
  const Value* lr_scheduler = nullptr;
  const Value* step(Files& f, size_t file, int64_t adam_steps, bool as_tensor) const {
    if (!as_tensor) return f.b.integer(adam_steps);
    Storage& s = f.storage(file, kFp32, ckpt::DType::kF32);
    s.add({-2, 0, 1, static_cast<float>(adam_steps)});
    return f.tensor(s, {});
  }
};

// What is exported, and to what: the source, the target and the parameter groups as table indices.
struct Job {
  const Source& src;
  const Target& t;
  const std::vector<std::vector<int>>& groups;
};

// Stage 3's parameters in group order, cut into sub-groups per group, and their pieces on every rank.
struct Zero3Plan {
  std::vector<int> order;  // table indices, the layout's order
  std::vector<std::vector<int>> sub_groups;
  std::vector<int64_t> group_of_sub;
  ds::Zero3Layout layout;
};

int64_t counter(const nlohmann::json& state, const char* key, int64_t fallback) {
  const auto it = state.find(key);
  return it != state.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

// The loss scaler DeepSpeed pickles: a static one of scale 1 for bf16 and fp32, the dynamic one for fp16
// with the scale the run had reached.
const Value* loss_scaler(ValueBuilder& b, const Target& t, const nlohmann::json& config, const nlohmann::json& state) {
  using P = ValueBuilder::Pairs;
  if (t.dtype != ckpt::DType::kF16) {
    return b.object("deepspeed.runtime.fp16.loss_scaler.LossScaler",
                    P{{b.str("cur_scale"), b.real(1.0)}, {b.str("dynamic"), b.boolean(false)}});
  }
  const nlohmann::json fp16 = config.is_object() ? config.value("fp16", nlohmann::json::object()) : nlohmann::json();
  const nlohmann::json saved = state.value("loss_scaler", nlohmann::json::object());
  const double initial = std::ldexp(1.0, fp16.value("initial_scale_power", 16));
  const int hysteresis = fp16.value("hysteresis", 2);
  return b.object("deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
                  P{{b.str("cur_scale"), b.real(saved.value("cur_scale", initial))},
                    {b.str("cur_iter"), b.integer(saved.value("cur_iter", counter(state, "step", 0)))},
                    {b.str("last_overflow_iter"), b.integer(saved.value("last_overflow_iter", int64_t{-1}))},
                    {b.str("scale_factor"), b.real(2.0)},
                    {b.str("scale_window"), b.integer(fp16.value("loss_scale_window", 1000))},
                    {b.str("min_scale"), b.real(fp16.value("min_loss_scale", 1.0))},
                    {b.str("delayed_shift"), b.integer(hysteresis)},
                    {b.str("cur_hysteresis"), b.integer(saved.value("cur_hysteresis", hysteresis))},
                    {b.str("consecutive_hysteresis"), b.boolean(fp16.value("consecutive_hysteresis", false))},
                    {b.str("raise_error_at_min_scale"), b.boolean(true)},
                    {b.str("dynamic"), b.boolean(true)},
                    {b.str("dtype"), b.global("torch.float16")}});
}

// The parameter groups as table indices, each table tensor in exactly one.
std::vector<std::vector<int>> group_members(const Source& src) {
  std::vector<std::vector<int>> groups;
  std::vector<bool> seen(src.table->size(), false);
  const std::string where = src.path.string();
  for (const ds::DeepSpeedRun::Group& g : src.full_run.groups) {
    std::vector<int>& members = groups.emplace_back();
    for (const std::string& name : g.params) {
      const int t = src.table->find(name);
      if (t < 0) {
        fail(ErrorKind::kInvalidInput, where + ": parameter group member " + quoted_excerpt(name) + " is no tensor");
      }
      if (seen[static_cast<size_t>(t)]) {
        fail(ErrorKind::kInvalidInput, where + ": " + quoted_excerpt(name) + " is in two parameter groups");
      }
      seen[static_cast<size_t>(t)] = true;
      members.push_back(t);
    }
  }
  for (size_t t = 0; t < seen.size(); ++t) {
    if (!seen[t]) {
      fail(ErrorKind::kInvalidInput, where + ": tensor " + (*src.table)[t].name + " is in no parameter group");
    }
  }
  return groups;
}

// The module's weights (stage 1/2: in the run's type; stage 3: empty placeholders, the weights being
// partitioned) with the tied names beside the tensors they share.
const Value* module_states(Files& f, size_t file, const Job& job) {
  const Source& src = job.src;
  const Target& t = job.t;
  ValueBuilder::Pairs pairs;
  std::map<std::string, const Value*> by_name;
  for (size_t i = 0; i < src.table->size(); ++i) {
    const ckpt::TensorInfo& info = (*src.table)[i];
    Storage& s = f.storage(file, kFp32, t.dtype);
    if (t.stage < 3) s.add({static_cast<int>(i), 0, info.numel()});
    const Value* v = f.tensor(s, t.stage < 3 ? info.shape : std::vector<int64_t>{0});
    by_name[info.name] = v;
    pairs.emplace_back(f.b.str(info.name), v);
  }
  for (const auto& [tied, holder] : src.full_run.shared_params.items()) {
    const auto it = by_name.find(holder.get<std::string>());
    if (it == by_name.end()) {
      fail(ErrorKind::kInvalidInput,
           src.path.string() + ": tied parameter " + quoted_excerpt(tied) + " names no tensor");
    }
    pairs.emplace_back(f.b.str(tied), it->second);
  }
  return f.b.dict(std::move(pairs), true);
}

const Value* shapes_of(Files& f, const Source& src, const std::vector<int>& members) {
  ValueBuilder::Pairs pairs;
  for (int m : members) {
    const ckpt::TensorInfo& info = (*src.table)[static_cast<size_t>(m)];
    pairs.emplace_back(f.b.str(info.name), f.b.size(info.shape));
  }
  return f.b.dict(std::move(pairs), true);
}

const Value* model_states(Files& f, size_t file, const Job& job, const Common& c,
                          const std::vector<std::vector<int>>& shape_groups) {
  const Source& src = job.src;
  ValueBuilder& b = f.b;
  std::vector<const Value*> shapes;
  for (const std::vector<int>& g : shape_groups) shapes.push_back(shapes_of(f, src, g));
  ValueBuilder::Pairs shared;
  for (const auto& [tied, holder] : src.full_run.shared_params.items()) {
    shared.emplace_back(b.str(tied), b.str(holder.get<std::string>()));
  }
  const nlohmann::json& state = src.trainer_state;
  const bool stage3 = job.t.stage == 3;
  return b.dict({{"module", module_states(f, file, job)},
                 {"buffer_names", b.list({})},
                 {"optimizer", b.none()},
                 {"param_shapes", b.list(shapes)},
                 {"frozen_param_shapes", stage3 ? b.dict(ValueBuilder::Pairs{}, true) : b.none()},
                 {"shared_params", b.dict(std::move(shared))},
                 {"frozen_param_fragments", stage3 ? b.dict(ValueBuilder::Pairs{}, true) : b.none()},
                 {"lr_scheduler", c.lr_scheduler},
                 {"data_sampler", b.none()},
                 {"random_ltd", b.none()},
                 {"sparse_tensor_module_names", b.set({})},
                 {"skipped_steps", b.integer(counter(state, "skipped_steps", 0))},
                 {"global_steps", b.integer(counter(state, "step", 0))},
                 {"global_samples", b.integer(counter(state, "consumed_samples", 0))},
                 {"dp_world_size", b.integer(job.t.world_size)},
                 {"mp_world_size", b.integer(1)},
                 {"ds_config", c.ds_config},
                 {"ds_version", c.version}});
}

const Value* group_options(ValueBuilder& b, const nlohmann::json& options, std::vector<int64_t> ids) {
  ValueBuilder::Pairs pairs;
  for (const auto& [key, value] : options.items()) {
    // torch keeps Adam's betas as a tuple; a list reads the same.
    const Value* v = ds::from_json(b, value);
    if (key == "betas" && value.is_array()) v = b.tuple(v->items);
    pairs.emplace_back(b.str(key), v);
  }
  std::vector<const Value*> params;
  for (int64_t id : ids) params.push_back(b.integer(id));
  pairs.emplace_back(b.str("params"), b.list(params));
  return b.dict(std::move(pairs));
}

// One storage per state of the source (the fp32 master weights, then the optimizer's moments).
std::vector<Storage*> state_storages(Files& f, size_t file, const Source& src) {
  std::vector<Storage*> st;
  for (size_t s = 0; s < src.states.size(); ++s) st.push_back(&f.storage(file, static_cast<int>(s), ckpt::DType::kF32));
  return st;
}

// The optimizer's state of one flat group or sub-group: its step and its moments (exp_avg and
// exp_avg_sq for Adam and AdamW, exp_avg for Lion), over the storages st[1..].
const Value* optimizer_state(Files& f, size_t file, const Common& c, const Source& src, const std::vector<Storage*>& st,
                             int64_t steps) {
  ValueBuilder::Pairs state{{f.b.str("step"), c.step(f, file, steps, src.full_run.step_is_tensor)}};
  for (size_t m = 1; m < st.size(); ++m) state.emplace_back(f.b.str(src.states[m]), f.tensor(*st[m], {st[m]->numel}));
  return f.b.dict(std::move(state));
}

// Stage 1/2: rank r's optimizer states.
const Value* zero12_optim(Files& f, size_t file, int r, const Job& job, const Common& c,
                          const std::vector<ds::Zero12Group>& layouts) {
  const Source& src = job.src;
  const Target& t = job.t;
  const std::vector<std::vector<int>>& groups = job.groups;
  ValueBuilder& b = f.b;
  ValueBuilder::Pairs adam;
  std::vector<const Value*> fp32, options, paddings, counts, mappings;
  const int64_t adam_steps = counter(src.trainer_state, "optimizer_steps", counter(src.trainer_state, "step", 0));
  for (size_t g = 0; g < groups.size(); ++g) {
    const ds::Zero12Group& L = layouts[g];
    const int64_t begin = r * L.partition;
    const int64_t valid = L.valid(r);
    // The states of the partition's parameters, then padding (the moments keep it, fp32 does not).
    const std::vector<Storage*> st = state_storages(f, file, src);
    ValueBuilder::Pairs mapping;
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const int tensor = groups[g][i];
      const int64_t n = (*src.table)[static_cast<size_t>(tensor)].numel();
      const int64_t lo = std::max(begin, L.offsets[i]);
      const int64_t hi = std::min(begin + valid, L.offsets[i] + n);
      if (lo >= hi) continue;
      for (Storage* s : st) s->add({tensor, lo - L.offsets[i], hi - lo});
      mapping.emplace_back(
          b.str((*src.table)[static_cast<size_t>(tensor)].name),
          b.object("deepspeed.utils.tensor_fragment.fragment_address",
                   ValueBuilder::Pairs{{b.str("numel"), b.integer(hi - lo)}, {b.str("start"), b.integer(lo - begin)}}));
    }
    for (size_t m = 1; m < st.size(); ++m) st[m]->add({-1, 0, L.partition - valid});
    fp32.push_back(f.tensor(*st[0], {valid}));
    adam.emplace_back(b.integer(static_cast<int64_t>(g)), optimizer_state(f, file, c, src, st, adam_steps));
    options.push_back(group_options(b, src.full_run.groups[g].options, {static_cast<int64_t>(g)}));
    // DeepSpeed counts a group's padding on the last rank only.
    paddings.push_back(b.integer(r + 1 == t.world_size ? L.partition * t.world_size - L.total : 0));
    counts.push_back(b.integer(t.world_size));
    mappings.push_back(b.dict(std::move(mapping), true));
  }
  const Value* state = b.dict({
      {"loss_scaler", c.loss_scaler},
      {"dynamic_loss_scale", b.boolean(c.dynamic)},
      {"overflow", b.boolean(false)},
      {"clip_grad", b.real(c.clip_grad)},
      {"base_optimizer_state", b.dict({{"state", b.dict(std::move(adam))}, {"param_groups", b.list(options)}})},
      {"single_partition_of_fp32_groups", b.list(fp32)},
      {"zero_stage", b.integer(t.stage, "deepspeed.runtime.zero.config.ZeroStageEnum")},
      {"group_paddings", b.list(paddings)},
      {"partition_count", b.list(counts)},
      {"ds_version", c.version},
      {"param_slice_mappings", b.list(mappings)},
  });
  return b.dict({{"optimizer_state_dict", state}, {"ds_config", c.ds_config}, {"ds_version", c.version}});
}

Zero3Plan plan_zero3(const Job& job) {
  Zero3Plan plan;
  std::vector<int64_t> numels;
  for (const std::vector<int>& g : job.groups) {
    for (int m : g) numels.push_back((*job.src.table)[static_cast<size_t>(m)].numel());
  }
  plan.layout = ds::zero3_layout(numels, job.t.world_size);
  size_t at = 0;
  for (size_t g = 0; g < job.groups.size(); ++g) {
    const std::vector<int>& group = job.groups[g];
    const std::vector<int64_t> parts(plan.layout.part.begin() + static_cast<std::ptrdiff_t>(at),
                                     plan.layout.part.begin() + static_cast<std::ptrdiff_t>(at + group.size()));
    size_t i = 0;
    for (int64_t count : ds::zero3_sub_groups(parts, job.t.sub_group_size)) {
      plan.sub_groups.emplace_back(group.begin() + static_cast<std::ptrdiff_t>(i),
                                   group.begin() + static_cast<std::ptrdiff_t>(i + static_cast<size_t>(count)));
      plan.group_of_sub.push_back(static_cast<int64_t>(g));
      i += static_cast<size_t>(count);
    }
    plan.order.insert(plan.order.end(), group.begin(), group.end());
    at += group.size();
  }
  return plan;
}

// Stage 3: rank r's optimizer states, one fp32 tensor and one pair of moments per sub-group.
const Value* zero3_optim(Files& f, size_t file, int r, const Job& job, const Common& c, const Zero3Plan& plan) {
  const Source& src = job.src;
  const Target& t = job.t;
  const std::vector<std::vector<int>>& sub_groups = plan.sub_groups;
  const ds::Zero3Layout& layout = plan.layout;
  const std::vector<int>& order = plan.order;
  ValueBuilder& b = f.b;
  ValueBuilder::Pairs adam;
  std::vector<const Value*> fp32;
  const int64_t adam_steps = counter(src.trainer_state, "optimizer_steps", counter(src.trainer_state, "step", 0));
  size_t i = 0;  // position of the parameter in `order` (the layout's order)
  for (size_t k = 0; k < sub_groups.size(); ++k) {
    const std::vector<Storage*> st = state_storages(f, file, src);
    for (size_t m = 0; m < sub_groups[k].size(); ++m, ++i) {
      const int tensor = order[i];
      const int64_t n = (*src.table)[static_cast<size_t>(tensor)].numel();
      const int64_t valid = layout.valid(i, r, n);
      for (Storage* s : st) {
        s->add({tensor, r * layout.part[i], valid});
        s->add({-1, 0, layout.part[i] - valid});
      }
    }
    fp32.push_back(f.tensor(*st[0], {st[0]->numel}));
    adam.emplace_back(b.integer(static_cast<int64_t>(k)), optimizer_state(f, file, c, src, st, adam_steps));
  }
  std::vector<const Value*> options;
  for (size_t g = 0; g < src.full_run.groups.size(); ++g) {
    std::vector<int64_t> ids;
    for (size_t k = 0; k < plan.group_of_sub.size(); ++k) {
      if (plan.group_of_sub[k] == static_cast<int64_t>(g)) ids.push_back(static_cast<int64_t>(k));
    }
    options.push_back(group_options(b, src.full_run.groups[g].options, ids));
  }
  const Value* state = b.dict({
      {"zero_stage", b.integer(3, "deepspeed.runtime.zero.config.ZeroStageEnum")},
      {"loss_scaler", c.loss_scaler},
      {"dynamic_loss_scale", b.boolean(c.dynamic)},
      {"overflow", b.boolean(false)},
      {"partition_count", b.integer(t.world_size)},
      {"optimizer_state_dict", b.dict({{"state", b.dict(std::move(adam))}, {"param_groups", b.list(options)}})},
      {"fp32_flat_groups", b.list(fp32)},
  });
  return b.dict({{"optimizer_state_dict", state}, {"ds_config", c.ds_config}, {"ds_version", c.version}});
}

// Writes every storage of `files` from the source, in pieces on the pool's threads, then finishes them.
void write_files(Files& files, const Source& src, const ConvertOptions& options, SharedProgress& progress) {
  std::vector<std::unique_ptr<torch::TorchFileWriter>> writers;
  for (Files::File& f : files.files) writers.push_back(std::make_unique<torch::TorchFileWriter>(f.path, *f.root));
  const StreamPlan plan = plan_stream(options, 8, src.chunk_elems);
  struct Task {
    const Storage* storage;
    int64_t begin;
    int64_t length;
  };
  std::vector<Task> tasks;
  for (const Storage& s : files.storages) {
    for (int64_t at = 0; at < s.numel; at += plan.piece_elems) {
      tasks.push_back({&s, at, std::min(plan.piece_elems, s.numel - at)});
    }
  }
  std::vector<StateReadFn> readers(static_cast<size_t>(plan.threads));
  std::vector<std::vector<float>> values(static_cast<size_t>(plan.threads));
  std::vector<std::vector<uint16_t>> narrow(static_cast<size_t>(plan.threads));
  ThreadPool pool(plan.threads - 1);
  pool.parallel_for(tasks.size(), [&](size_t k, int worker) {
    const Task& task = tasks[k];
    const Storage& s = *task.storage;
    StateReadFn& read = readers[static_cast<size_t>(worker)];
    if (!read) read = src.reader();
    std::vector<float>& v = values[static_cast<size_t>(worker)];
    v.resize(static_cast<size_t>(task.length));
    // The segments the piece overlaps, from the last one starting at or before it.
    size_t seg =
        static_cast<size_t>(std::upper_bound(s.starts.begin(), s.starts.end(), task.begin) - s.starts.begin() - 1);
    for (int64_t done = 0; done < task.length; ++seg) {
      const Segment& g = s.segments[seg];
      const int64_t into = task.begin + done - s.starts[seg];
      const int64_t n = std::min(task.length - done, g.length - into);
      const std::span<float> out(v.data() + done, static_cast<size_t>(n));
      if (g.tensor >= 0) {
        read(s.state, g.tensor, g.offset + into, out);
      } else {
        std::fill(out.begin(), out.end(), g.tensor == -2 ? g.constant : 0.0f);
      }
      done += n;
    }
    const uint64_t at = static_cast<uint64_t>(task.begin);
    if (s.dtype == ckpt::DType::kF32) {
      writers[s.file]->write(s.key, at * 4, std::as_bytes(std::span<const float>(v)));
    } else {
      std::vector<uint16_t>& h = narrow[static_cast<size_t>(worker)];
      h.resize(v.size());
      s.dtype == ckpt::DType::kBF16 ? ckpt::convert_fp32_to_bf16(v, h) : ckpt::convert_fp32_to_fp16(v, h);
      writers[s.file]->write(s.key, at * 2, std::as_bytes(std::span<const uint16_t>(h)));
    }
    progress.add(task.length * 4);
  });
  for (auto& w : writers) w->finish();
}

ckpt::DType default_dtype(const nlohmann::json& config) {
  auto enabled = [&](const char* key) {
    return config.is_object() && config.contains(key) && config[key].is_object() &&
           config[key].value("enabled", false) == true;
  };
  return enabled("bf16") ? ckpt::DType::kBF16 : enabled("fp16") ? ckpt::DType::kF16 : ckpt::DType::kF32;
}

// The universal layout of ds_to_universal, as DeepSpeed's load_universal reads it at stages 1 and 2:
// zero/<parameter>/{fp32,exp_avg,exp_avg_sq}.pt holding {'param': the full tensor, 'cat_dim': 0} and
// step.pt the step, zero/optimizer_state.pt the optimizer's global state and its parameter groups, and
// the model states beside zero/ (their counters; the module is not read).
void write_universal(const std::filesystem::path& dir, const Job& job, const std::function<Common(Files&)>& common,
                     const ConvertOptions& options, SharedProgress& progress) {
  const Source& src = job.src;
  const Target& t = job.t;
  const std::vector<std::vector<int>>& groups = job.groups;
  {
    Files f;
    const Common c = common(f);
    const size_t model_file = f.add_file(dir / "mp_rank_00_model_states.pt");
    f.files[model_file].root = model_states(f, model_file, job, c, groups);
    ValueBuilder& b = f.b;
    std::vector<const Value*> options_list;
    for (size_t g = 0; g < groups.size(); ++g) {
      options_list.push_back(group_options(b, src.full_run.groups[g].options, {static_cast<int64_t>(g)}));
    }
    std::vector<const Value*> counts(groups.size(), b.integer(t.world_size));
    const size_t optim_file = f.add_file(dir / "zero" / "optimizer_state.pt");
    f.files[optim_file].root =
        b.dict({{"loss_scaler", c.loss_scaler},
                {"dynamic_loss_scale", b.boolean(c.dynamic)},
                {"overflow", b.boolean(false)},
                {"clip_grad", b.real(c.clip_grad)},
                {"zero_stage", b.integer(t.stage, "deepspeed.runtime.zero.config.ZeroStageEnum")},
                {"partition_count", b.list(counts)},
                {"ds_version", c.version},
                {"param_groups", b.list(options_list)}});
    write_files(f, src, options, progress);
  }
  const int64_t adam_steps = counter(src.trainer_state, "optimizer_steps", counter(src.trainer_state, "step", 0));
  for (size_t i = 0; i < src.table->size(); ++i) {
    const ckpt::TensorInfo& info = (*src.table)[i];
    const std::filesystem::path folder = dir / "zero" / info.name;
    make_real_directory(folder);
    Files f;
    const Common c = common(f);
    for (int state = 0; state < static_cast<int>(src.states.size()); ++state) {
      // fp32.pt, then one file per moment under its name.
      const std::string name = state == kFp32 ? "fp32" : src.states[static_cast<size_t>(state)];
      const size_t file = f.add_file(folder / (name + ".pt"));
      Storage& s = f.storage(file, state, ckpt::DType::kF32);
      s.add({static_cast<int>(i), 0, info.numel()});
      f.files[file].root = f.b.dict({{"param", f.tensor(s, info.shape)}, {"cat_dim", f.b.integer(0)}});
    }
    const size_t step_file = f.add_file(folder / "step.pt");
    f.files[step_file].root = c.step(f, step_file, adam_steps, src.full_run.step_is_tensor);
    write_files(f, src, options, progress);
    fsync_directory(folder);
  }
  fsync_directory(dir / "zero");
}

// Hugging Face's Trainer keeps its own files beside DeepSpeed's in `checkpoint-N/` (trainer_state.json,
// config.json, the scheduler's and RNG states, tokenizer files, the weights it saved): they do not
// depend on the world size, so the output gets a copy of each and the Trainer resumes from it. Only
// regular files of the folder itself: DeepSpeed's tag folders are what is rewritten.
void carry_trainer_files(const std::filesystem::path& source, const std::filesystem::path& out) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(source / "trainer_state.json", ec)) return;
  for (const auto& entry : std::filesystem::directory_iterator(source)) {
    const std::string name = entry.path().filename().string();
    if (name == "latest" || name == "latest_universal" || !entry.is_regular_file(ec) || entry.is_symlink(ec)) continue;
    std::filesystem::copy_file(entry.path(), out / name, ec);
    if (ec) fail(ErrorKind::kIo, entry.path().string() + ": cannot copy into the output: " + ec.message());
    fsync_path(out / name);
  }
  fsync_directory(out);
}

}  // namespace

DeepSpeedExportResult export_deepspeed(const DeepSpeedExportRequest& request, const ConvertOptions& options) {
  const Source src = open_source(request.source, request.model);
  Target t;
  t.world_size = request.world_size;
  t.stage = request.stage.value_or(std::max(src.stage, 1));
  t.dtype = request.dtype.value_or(default_dtype(src.config));
  if (t.world_size < 1 || t.world_size > (1 << 20)) {
    fail(ErrorKind::kInvalidInput, "--world-size " + std::to_string(t.world_size) + ": expected 1 to 1048576 ranks");
  }
  if (t.stage < 1 || t.stage > 3) {
    fail(ErrorKind::kInvalidInput,
         "--stage " + std::to_string(t.stage) + ": DeepSpeed's ZeRO checkpoints are written for stages 1, 2 and 3");
  }
  const nlohmann::json zero_config = src.config.is_object() && src.config.contains("zero_optimization")
                                         ? src.config["zero_optimization"]
                                         : nlohmann::json::object();
  t.sub_group_size = request.sub_group_size.value_or(
      zero_config.is_object() && zero_config.contains("sub_group_size") && zero_config["sub_group_size"].is_number()
          ? static_cast<int64_t>(zero_config["sub_group_size"].get<double>())
          : kDefaultSubGroupSize);
  if (t.sub_group_size < 1) fail(ErrorKind::kInvalidInput, "--sub-group-size must be at least 1");
  const std::vector<std::vector<int>> groups = group_members(src);
  const Job job{src, t, groups};
  const int64_t step = counter(src.trainer_state, "step", 0);
  if (step < 0 || step > ckpt::kMaxStep) fail(ErrorKind::kInvalidInput, src.path.string() + ": a bad step count");
  const std::string tag = "global_step" + std::to_string(step) + (request.universal ? "_universal" : "");
  if (request.universal && t.stage == 3) {
    fail(ErrorKind::kInvalidInput,
         "--universal --stage 3: DeepSpeed's load_universal reads another file format at stage 3 and only the "
         "first parameter group there; reshard straight to the run's world size instead (it loads with "
         "load_checkpoint)");
  }

  StagedDirectory out(request.output, {request.source, src.path}, options.force);
  const std::filesystem::path dir = out.path() / tag;
  make_real_directory(dir);
  // Bytes read: the states, and the module's weights at stages 1 and 2.
  const int64_t reads = static_cast<int64_t>(src.states.size()) + (t.stage < 3 ? 1 : 0);
  SharedProgress progress(options.progress, src.table->total_elements() * 4 * reads);

  // What every file shares: the config (with the stage and type written), the version, scaler, scheduler.
  auto common = [&](Files& f) {
    Common c;
    nlohmann::json config = src.config.is_object() ? src.config : nlohmann::json::object();
    config["zero_optimization"] = zero_config.is_object() ? zero_config : nlohmann::json::object();
    config["zero_optimization"]["stage"] = t.stage;
    // The type the files are written for, so that the config they carry describes them.
    for (const auto& [key, on] :
         {std::pair{"bf16", t.dtype == ckpt::DType::kBF16}, std::pair{"fp16", t.dtype == ckpt::DType::kF16}}) {
      if (!config.contains(key) || !config[key].is_object()) config[key] = nlohmann::json::object();
      config[key]["enabled"] = on;
    }
    c.ds_config = ds::from_json(f.b, config);
    c.version = f.b.str(kFormatVersion);
    c.loss_scaler = loss_scaler(f.b, t, src.config, src.trainer_state);
    c.dynamic = t.dtype == ckpt::DType::kF16;
    c.clip_grad = config.value("gradient_clipping", 0.0);
    c.lr_scheduler = ds::from_json(f.b, src.full_run.lr_scheduler);
    return c;
  };
  const std::string prefix = t.dtype == ckpt::DType::kBF16 ? "bf16_" : "";
  auto optim_name = [&](int r) { return prefix + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt"; };

  if (request.universal) {
    make_real_directory(dir / "zero");
    write_universal(dir, job, common, options, progress);
  } else if (t.stage < 3) {
    std::vector<ds::Zero12Group> layouts;
    for (const std::vector<int>& g : groups) {
      std::vector<int64_t> numels;
      for (int m : g) numels.push_back((*src.table)[static_cast<size_t>(m)].numel());
      layouts.push_back(ds::zero12_group(numels, t.world_size));
    }
    {
      Files f;
      const Common c = common(f);
      const size_t file = f.add_file(dir / "mp_rank_00_model_states.pt");
      f.files[file].root = model_states(f, file, job, c, groups);
      write_files(f, src, options, progress);
    }
    for (int r = 0; r < t.world_size; ++r) {
      Files f;
      const Common c = common(f);
      const size_t file = f.add_file(dir / optim_name(r));
      f.files[file].root = zero12_optim(f, file, r, job, c, layouts);
      write_files(f, src, options, progress);
    }
  } else {
    const Zero3Plan plan = plan_zero3(job);
    for (int r = 0; r < t.world_size; ++r) {
      Files f;
      const Common c = common(f);
      const size_t model_file = f.add_file(dir / ("zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_model_states.pt"));
      f.files[model_file].root = model_states(f, model_file, job, c, plan.sub_groups);
      const size_t optim_file = f.add_file(dir / optim_name(r));
      f.files[optim_file].root = zero3_optim(f, optim_file, r, job, c, plan);
      write_files(f, src, options, progress);
    }
  }
  fsync_directory(dir);
  write_file_durable(out.path() / (request.universal ? "latest_universal" : "latest"), tag);
  carry_trainer_files(request.source, out.path());
  out.commit();
  progress.finish();
  DeepSpeedExportResult result;
  result.tag_dir = request.output / tag;
  result.world_size = t.world_size;
  result.stage = t.stage;
  result.dtype = t.dtype;
  result.step = step;
  return result;
}

}  // namespace shardkit::convert
