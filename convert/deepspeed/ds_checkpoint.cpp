#include "convert/deepspeed/ds_checkpoint.hpp"

#include <algorithm>
#include <map>
#include <regex>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/deepspeed/ds_layout.hpp"

namespace shardkit::convert::deepspeed {

using torch::Dtype;
using torch::TensorRef;
using torch::TorchFile;
using torch::Value;

namespace {

using Kind = Value::Kind;

[[noreturn]] void bad(std::string_view where, const std::string& what) {
  fail(ErrorKind::kInvalidInput, std::string(where) + ": " + what);
}

// The value under `key` of a dict, of kind `kind`; Error naming the file and the key path otherwise.
// The names are views: a reference parameter bound to a temporary string would make every caller's
// `const Value&` look dangling to GCC 13's -Wdangling-reference.
const Value& field(const Value& dict, std::string_view key, Kind kind, std::string_view where, std::string_view path) {
  const Value* v = dict.kind == Kind::kDict || dict.kind == Kind::kObject ? dict.get(key) : nullptr;
  const std::string name = path.empty() ? std::string(key) : std::string(path) + "['" + std::string(key) + "']";
  if (!v) bad(where, "no " + name + " (expected in a DeepSpeed checkpoint file)");
  if (v->kind != kind) {
    Value expected;
    expected.kind = kind;
    bad(where, name + " is " + v->describe() + ", not " + expected.describe());
  }
  return *v;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A shape from param_shapes: a torch.Size (read as a tuple) or a list of non-negative ints.
std::vector<int64_t> shape_of(const Value& v, const std::string& where, const std::string& name) {
  if (v.kind != Kind::kTuple && v.kind != Kind::kList)
    bad(where, "the shape of " + quoted_excerpt(name) + " is " + v.describe());
  std::vector<int64_t> shape;
  for (const Value* d : v.items) {
    if (d->kind != Kind::kInt || d->integer < 0 || d->integer > (int64_t{1} << 40)) {
      bad(where, "the shape of " + quoted_excerpt(name) + " holds something other than a size");
    }
    shape.push_back(d->integer);
  }
  return shape;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > (int64_t{1} << 50) / d) fail(ErrorKind::kInvalidInput, "a shape too large: " + shape_text(shape));
    n *= d;
  }
  return n;
}

// (name, shape) pairs of one OrderedDict of param_shapes, in order.
std::vector<std::pair<std::string, std::vector<int64_t>>> named_shapes(const Value& dict, const std::string& where) {
  if (dict.kind != Kind::kDict) bad(where, "param_shapes holds " + std::string(dict.describe()) + ", not a dict");
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  int64_t total = 0;  // bounded, so that sums of sizes over the groups cannot overflow
  for (const auto& [key, value] : dict.pairs) {
    if (key->kind != Kind::kString) bad(where, "param_shapes has a key that is not a parameter name");
    out.emplace_back(key->text, shape_of(*value, where, key->text));
    total += numel_of(out.back().second);
    if (total > (int64_t{1} << 50)) bad(where, "param_shapes declares more than 2^50 elements");
  }
  return out;
}

const TensorRef& tensor_field(const Value& dict, std::string_view key, std::string_view where, std::string_view path) {
  return field(dict, key, Kind::kTensor, where, path).tensor;
}

// Adam's step: a Python int (DeepSpeed's FusedAdam), a float, or a one-element tensor (torch.optim.Adam).
int64_t step_value(const Value& v, const TorchFile& file, const std::string& what) {
  double step = 0;
  if (v.kind == Kind::kInt) {
    step = static_cast<double>(v.integer);
  } else if (v.kind == Kind::kFloat) {
    step = v.real;
  } else if (v.kind == Kind::kTensor && v.tensor.numel() == 1) {
    float f = 0;
    file.read(v.tensor, 0, std::span<float>(&f, 1), what);
    step = static_cast<double>(f);
  } else {
    bad(file.path().string(), what + " is " + v.describe() + ", not a step count");
  }
  if (!(step >= 0 && step <= static_cast<double>(ckpt::kMaxStep)) || step != static_cast<double>(int64_t(step))) {
    bad(file.path().string(), what + " is not a step count between 0 and " + std::to_string(ckpt::kMaxStep));
  }
  return static_cast<int64_t>(step);
}

// A tag read from `latest`: one folder name inside the checkpoint folder, nothing that leads elsewhere.
// Its content is never printed: only a tag that passes these checks is quoted later.
std::string read_tag(const std::filesystem::path& file) {
  std::string tag = read_small_file(file, 4096, ErrorKind::kInvalidInput);
  while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
  while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.front()))) tag.erase(tag.begin());
  // Printable ASCII up to a file name's length: what DeepSpeed's tags (global_step<N>, or the user's
  // own) are.
  const bool printable = std::all_of(tag.begin(), tag.end(), [](char c) { return c > ' ' && c < 0x7f; });
  if (tag.empty() || tag.size() > 255 || !printable || tag == "." || tag == ".." ||
      tag.find_first_of("/\\") != std::string::npos) {
    bad(file.string(), "does not name a tag folder (expected one folder name, such as global_step100)");
  }
  return tag;
}

}  // namespace

DeepSpeedCheckpoint::DeepSpeedCheckpoint(const std::filesystem::path& path, std::shared_ptr<const model::Model> model)
    : model_(std::move(model)) {
  if (model_) {
    table_ = &model_->table();
    pieces_.resize(table_->size());
    seen_as_.resize(table_->size());
  }
  locate_folder(path);
  if (layout_ == SourceLayout::kUniversal) {
    open_universal();
  } else {
    open_zero();
  }
  check_complete();
}

void DeepSpeedCheckpoint::locate_folder(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    bad(path.string(), "not a folder (expected a DeepSpeed checkpoint folder holding 'latest', or a tag folder)");
  }
  root_ = path;
  folder_ = path;
  for (const char* pointer : {"latest", "latest_universal"}) {
    if (std::filesystem::exists(path / pointer, ec)) {
      require_inside(path / pointer);  // a link to a file elsewhere is not read at all
      folder_ = path / read_tag(path / pointer);
      require_inside(folder_);
      if (!std::filesystem::is_directory(folder_, ec)) {
        bad((path / pointer).string(),
            "names " + quoted_excerpt(folder_.filename().string()) + ", which is not a folder beside it");
      }
      break;
    }
  }
  layout_ = std::filesystem::is_directory(folder_ / "zero", ec) ? SourceLayout::kUniversal : SourceLayout::kZero12;
}

namespace {

// The module's name of a parameter: wrappers (DistributedDataParallel, some trainers) prefix it with
// "module.".
std::string_view bare_name(std::string_view name) {
  while (name.starts_with("module.")) name.remove_prefix(7);
  return name;
}

}  // namespace

void DeepSpeedCheckpoint::table_from_shapes(const Value& param_shapes, const std::string& where) {
  std::vector<ckpt::TensorInfo> tensors;
  for (const Value* group : param_shapes.items) {
    for (auto& [name, shape] : named_shapes(*group, where)) {
      tensors.push_back({std::string(bare_name(name)), std::move(shape), ckpt::DType::kF32});
      if (tensors.size() > ckpt::kMaxTensors) bad(where, "param_shapes names more than a million parameters");
    }
  }
  try {
    own_table_ = ckpt::TensorTable(std::move(tensors));
  } catch (const Error& e) {
    bad(where, std::string("param_shapes: ") + e.what());
  }
  table_ = &own_table_;
  pieces_.resize(table_->size());
  seen_as_.resize(table_->size());
}

void DeepSpeedCheckpoint::require_inside(const std::filesystem::path& entry) const {
  // Whoever made the checkpoint chose its links; the folder the user named may itself be one.
  require_within_folder(root_, entry, ErrorKind::kInvalidInput);
}

int DeepSpeedCheckpoint::parameter(const std::string& name, const std::vector<int64_t>& shape,
                                   const std::string& where) {
  const std::string_view bare = bare_name(name);
  if (!model_) {
    const int t = table_->find(bare);
    if (t < 0) bad(where, "parameter " + quoted_excerpt(name) + " is not in the model states' param_shapes");
    const size_t ti = static_cast<size_t>(t);
    if (!seen_as_[ti].empty()) bad(where, "parameter " + quoted_excerpt(name) + " appears twice");
    seen_as_[ti] = name;
    by_source_name_[name] = t;
    const std::vector<int64_t>& expected = (*table_)[ti].shape;
    const bool flat_ok = shape.size() == 1 && layout_ == SourceLayout::kUniversal && shape[0] == numel_of(expected);
    if (shape != expected && !flat_ok) {
      bad(where, "parameter " + quoted_excerpt(name) + " has shape " + shape_text(shape) + "; param_shapes says " +
                     shape_text(expected));
    }
    return t;
  }
  const std::optional<model::HfName> c = model_->classify_hf_name(bare);
  const std::string model_name = "model " + model_->name();
  if (c && c->kind == model::HfName::kTiedOutput) {
    bad(where, "parameter " + quoted_excerpt(name) + " is trained apart from the token embedding, but " + model_name +
                   " ties the output projection to it");
  }
  const int t = c && c->kind == model::HfName::kParameter ? model_->table().find(c->name) : -1;
  if (t < 0) bad(where, "unknown parameter " + quoted_excerpt(name) + ": " + model_name + " has no such tensor");
  if (!seen_as_[static_cast<size_t>(t)].empty()) {
    bad(where, "parameters " + quoted_excerpt(seen_as_[static_cast<size_t>(t)]) + " and " + quoted_excerpt(name) +
                   " are both " + model_->table()[static_cast<size_t>(t)].name);
  }
  seen_as_[static_cast<size_t>(t)] = name;
  by_source_name_[name] = t;
  const std::vector<int64_t>& expected = model_->table()[static_cast<size_t>(t)].shape;
  // The universal checkpoint of a stage 3 run stores every tensor flat.
  const bool flat_ok = shape.size() == 1 && layout_ == SourceLayout::kUniversal;
  if (shape != expected && !(flat_ok && shape[0] == numel_of(expected))) {
    bad(where, "parameter " + quoted_excerpt(name) + " has shape " + shape_text(shape) + "; " + model_name +
                   " expects " + shape_text(expected));
  }
  return t;
}

void DeepSpeedCheckpoint::take_moments(const Value& group_state, const std::string& where, const std::string& what) {
  const auto holds = [&](const char* key) {
    const Value* v = group_state.get(key);
    return v != nullptr && v->kind == Kind::kTensor;
  };
  const std::vector<std::string>& found = holds("exp_avg_sq") ? kAdamMoments : kLionMoments;
  if (!holds("exp_avg")) {
    bad(where, what +
                   ": holds no exp_avg tensor (shardkit reads the states of Adam and AdamW: exp_avg and exp_avg_sq, "
                   "and of Lion: exp_avg)");
  }
  if (moments_.empty()) {
    moments_ = found;
  } else if (moments_ != found) {
    bad(where, what + ": holds " + std::to_string(found.size()) + " optimizer moment(s) where the first holds " +
                   std::to_string(moments_.size()));
  }
}

void DeepSpeedCheckpoint::add(int state, int tensor, Piece piece) {
  if (piece.length == 0) return;
  std::vector<std::vector<Piece>>& states = pieces_[static_cast<size_t>(tensor)];
  if (states.size() <= static_cast<size_t>(state)) states.resize(static_cast<size_t>(state) + 1);
  states[static_cast<size_t>(state)].push_back(std::move(piece));
}

void DeepSpeedCheckpoint::open_zero() {
  static const std::regex kOptim(R"((bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt)");
  static const std::regex kModel(R"((zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt)");
  std::map<int, std::filesystem::path> optim;
  std::map<int, std::filesystem::path> model;  // stage 3: per rank; stage 1/2: rank -1
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder_, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, kOptim) || std::regex_match(name, m, kModel)) {
      require_inside(entry.path());
      if (m[3].str() != "00") bad(entry.path().string(), "tensor or pipeline parallelism (mp_rank > 0) is not read");
      if (m[2].length() > 6) bad(entry.path().string(), "a rank number out of range");
      const int rank = m[2].matched ? std::stoi(m[2].str()) : -1;
      auto& files = name.ends_with("_optim_states.pt") ? optim : model;
      if (!files.emplace(rank, entry.path()).second) {
        bad(entry.path().string(), "a second file for data-parallel rank " + std::to_string(rank));
      }
    }
  }
  if (ec) bad(folder_.string(), "cannot list the folder: " + ec.message());
  // NVMe offload keeps the optimizer states in files of its own beside the ranks' files.
  if (std::filesystem::exists(folder_ / "offloaded_tensors", ec)) {
    bad((folder_ / "offloaded_tensors").string(), "optimizer states offloaded to NVMe are not read");
  }
  if (optim.empty()) {
    bad(folder_.string(),
        "no zero_pp_rank_*_mp_rank_00_optim_states.pt files: not a DeepSpeed ZeRO (stage 1-3) checkpoint folder");
  }
  world_size_ = static_cast<int>(optim.size());
  const std::string prefix = optim.begin()->second.filename().string().starts_with("bf16_") ? "bf16_" : "";
  for (int r = 0; r < world_size_; ++r) {
    if (!optim.count(r)) {
      bad((folder_ / (prefix + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt")).string(),
          "missing: the folder holds " + std::to_string(world_size_) + " optimizer state files, ranks 0-" +
              std::to_string(world_size_ - 1) + " were expected");
    }
  }
  // Every rank's optimizer state; they must agree on the stage and the world size.
  std::vector<const Value*> states;
  for (const auto& [rank, file] : optim) {
    files_.push_back(std::make_unique<TorchFile>(file, &parse_budget_));
    const TorchFile& f = *files_.back();
    const std::string where = f.path().string();
    const Value& sd = field(f.root(), "optimizer_state_dict", Kind::kDict, where, "");
    const Value* zero_stage = sd.get("zero_stage");
    if (!zero_stage || zero_stage->kind != Kind::kInt || zero_stage->integer < 1 || zero_stage->integer > 3) {
      bad(where, "optimizer_state_dict has no zero_stage 1-3 (BF16_Optimizer and stage 0 checkpoints are not read)");
    }
    if (rank == 0) stage_ = static_cast<int>(zero_stage->integer);
    if (zero_stage->integer != stage_) {
      bad(where, "ZeRO stage " + std::to_string(zero_stage->integer) + ", but rank 0's file says stage " +
                     std::to_string(stage_));
    }
    const Value* count = sd.get("partition_count");
    if (!count) bad(where, "optimizer_state_dict has no partition_count");
    std::vector<const Value*> counts = {count};
    if (count->kind == Kind::kList) counts.assign(count->items.begin(), count->items.end());
    for (const Value* c : counts) {
      if (c->kind != Kind::kInt || c->integer != world_size_) {
        bad(where, "partition_count says " + (c->kind == Kind::kInt ? std::to_string(c->integer) : "nothing") +
                       " ranks, but the folder holds " + std::to_string(world_size_) + " optimizer state files");
      }
    }
    states.push_back(&sd);
  }
  layout_ = stage_ == 3 ? SourceLayout::kZero3 : SourceLayout::kZero12;
  const int model_rank = stage_ == 3 ? 0 : -1;
  if (!model.count(model_rank)) {
    bad((folder_ / (stage_ == 3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt")).string(),
        "missing: it names the parameters of a stage " + std::to_string(stage_) + " checkpoint");
  }
  files_.push_back(std::make_unique<TorchFile>(model.at(model_rank), &parse_budget_));
  const TorchFile& mf = *files_.back();
  const std::string where = mf.path().string();
  const Value& ms = mf.root();
  if (ms.kind != Kind::kDict) bad(where, "holds " + std::string(ms.describe()) + ", not a dict of model states");
  if (const Value* dp = ms.get("dp_world_size"); dp && dp->kind == Kind::kInt && dp->integer != world_size_) {
    bad(where, "dp_world_size is " + std::to_string(dp->integer) + ", but the folder holds " +
                   std::to_string(world_size_) + " optimizer state files");
  }
  if (const Value* frozen = ms.get("frozen_param_shapes"); frozen && frozen->kind == Kind::kDict) {
    if (!frozen->pairs.empty()) {
      const Value* first = frozen->pairs.front().first;
      bad(where, "frozen parameters (" + (first->kind == Kind::kString ? quoted_excerpt(first->text) : "one") +
                     ") have no optimizer state; import them with `convert import` after zero_to_fp32");
    }
  }
  const Value& shapes = field(ms, "param_shapes", Kind::kList, where, "");
  if (!model_) table_from_shapes(shapes, where);
  std::optional<int64_t> optimizer_step;
  const std::string osd_key = stage_ == 3 ? "optimizer_state_dict" : "base_optimizer_state";
  const Value& base = field(*states[0], osd_key, Kind::kDict, files_[0]->path().string(), "optimizer_state_dict");
  const Value& adam = field(base, "state", Kind::kDict, files_[0]->path().string(), osd_key);
  if (!adam.pairs.empty() && adam.pairs.front().second->kind == Kind::kDict) {
    if (const Value* step = adam.pairs.front().second->get("step")) {
      optimizer_step = step_value(*step, *files_[0], "the optimizer state's step");
    }
  }
  if (stage_ == 3) {
    map_zero3(states, shapes);
  } else {
    map_zero12(states, shapes);
  }
  read_counters(&ms, where, optimizer_step);
  read_run(ms, shapes, *states[0], files_[0]->path().string());
}

void DeepSpeedCheckpoint::read_run(const Value& ms, const Value& param_shapes, const Value& optimizer_state,
                                   const std::string& optim_file) {
  const std::string model_file =
      (folder_ / (stage_ == 3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt")).string();
  if (const Value* config = ms.get("ds_config"); config && config->kind == Kind::kDict) {
    try {
      ds_config_ = to_json(*config, model_file, "ds_config");
    } catch (const Error&) {
      ds_config_ = nullptr;  // a config with values JSON cannot hold is not needed to read the states
    }
  }
  // Names per entry of param_shapes (stage 3: per sub-group), as the table calls them.
  std::vector<std::vector<std::string>> entries;
  for (const Value* group : param_shapes.items) {
    std::vector<std::string>& names = entries.emplace_back();
    for (const auto& [key, shape] : group->pairs) {
      const auto it = by_source_name_.find(key->text);
      if (it == by_source_name_.end()) fail(ErrorKind::kInternal, "parameter " + key->text + " was not mapped");
      names.push_back((*table_)[static_cast<size_t>(it->second)].name);
    }
  }
  try {
    DeepSpeedRun run;
    const std::string osd_key = stage_ == 3 ? "optimizer_state_dict" : "base_optimizer_state";
    const Value& base = field(optimizer_state, osd_key, Kind::kDict, optim_file, "optimizer_state_dict");
    const Value& groups = field(base, "param_groups", Kind::kList, optim_file, osd_key);
    std::vector<bool> taken(entries.size(), false);
    for (size_t g = 0; g < groups.items.size(); ++g) {
      const Value& group = *groups.items[g];
      const std::string path = osd_key + "['param_groups'][" + std::to_string(g) + "]";
      if (group.kind != Kind::kDict) bad(optim_file, path + " is not a dict");
      DeepSpeedRun::Group out;
      out.options = nlohmann::json::object();
      for (const auto& [key, value] : group.pairs) {
        if (key->kind != Kind::kString) bad(optim_file, path + " has a key that is not a string");
        if (key->text != "params") out.options[key->text] = to_json(*value, optim_file, path + "['" + key->text + "']");
      }
      // Stages 1 and 2 keep one flat tensor per group; stage 3 lists the group's sub-groups.
      std::vector<int64_t> members = {static_cast<int64_t>(g)};
      if (stage_ == 3) {
        members.clear();
        for (const Value* id : field(group, "params", Kind::kList, optim_file, path).items) {
          if (id->kind != Kind::kInt) bad(optim_file, path + "['params'] holds " + id->describe());
          members.push_back(id->integer);
        }
      }
      for (int64_t k : members) {
        if (k < 0 || k >= static_cast<int64_t>(entries.size()) || taken[static_cast<size_t>(k)]) {
          bad(optim_file, path + " names param group " + std::to_string(k) + ", which param_shapes does not hold");
        }
        taken[static_cast<size_t>(k)] = true;
        const auto& names = entries[static_cast<size_t>(k)];
        out.params.insert(out.params.end(), names.begin(), names.end());
      }
      run.groups.push_back(std::move(out));
    }
    if (std::find(taken.begin(), taken.end(), false) != taken.end()) {
      bad(optim_file, "a group of param_shapes belongs to no parameter group of the optimizer");
    }
    if (const Value* shared = ms.get("shared_params"); shared && shared->kind == Kind::kDict) {
      for (const auto& [tied, holder] : shared->pairs) {
        if (tied->kind != Kind::kString || holder->kind != Kind::kString)
          bad(model_file, "shared_params holds non-names");
        run.shared_params[std::string(bare_name(tied->text))] = std::string(bare_name(holder->text));
      }
    }
    if (const Value* lr = ms.get("lr_scheduler"); lr && lr->kind != Kind::kNone) {
      run.lr_scheduler = to_json(*lr, model_file, "lr_scheduler");
    }
    const Value& adam = field(base, "state", Kind::kDict, optim_file, osd_key);
    if (!adam.pairs.empty() && adam.pairs.front().second->kind == Kind::kDict) {
      const Value* step = adam.pairs.front().second->get("step");
      run.step_is_tensor = !step || step->kind == Kind::kTensor;
    }
    run_ = std::move(run);
  } catch (const Error& e) {
    run_missing_ = e.what();
  }
}

void DeepSpeedCheckpoint::map_zero12(const std::vector<const Value*>& states, const Value& param_shapes) {
  const std::string model_file = files_.back()->path().string();
  const int64_t W = world_size_;
  for (size_t g = 0; g < param_shapes.items.size(); ++g) {
    const auto params = named_shapes(*param_shapes.items[g], model_file);
    std::vector<int64_t> numels;
    for (const auto& [name, shape] : params) numels.push_back(numel_of(shape));
    // The saved fp32 partitions leave the padding out, the moments keep it.
    const Zero12Group layout = zero12_group(numels, W);
    const int64_t total = layout.total;
    const int64_t P = layout.partition;
    const std::string group = "param group " + std::to_string(g);
    std::vector<const TensorRef*> fp32(static_cast<size_t>(W));
    std::vector<std::vector<const TensorRef*>> moments;  // [moment][rank]
    for (int64_t r = 0; r < W; ++r) {
      const TorchFile& f = *files_[static_cast<size_t>(r)];
      const std::string where = f.path().string();
      const Value& parts = field(*states[static_cast<size_t>(r)], "single_partition_of_fp32_groups", Kind::kList, where,
                                 "optimizer_state_dict");
      if (parts.items.size() != param_shapes.items.size()) {
        bad(where, "single_partition_of_fp32_groups holds " + std::to_string(parts.items.size()) +
                       " groups; the model states name " + std::to_string(param_shapes.items.size()));
      }
      if (parts.items[g]->kind != Kind::kTensor) bad(where, group + ": the fp32 partition is not a tensor");
      const Value& base =
          field(*states[static_cast<size_t>(r)], "base_optimizer_state", Kind::kDict, where, "optimizer_state_dict");
      const Value& adam = field(base, "state", Kind::kDict, where, "base_optimizer_state");
      const Value* gs = adam.get(static_cast<int64_t>(g));
      if (!gs || gs->kind != Kind::kDict) {
        bad(where, group + ": no optimizer state (base_optimizer_state['state'])");
      }
      take_moments(*gs, where, group);
      moments.resize(moments_.size(), std::vector<const TensorRef*>(static_cast<size_t>(W)));
      fp32[static_cast<size_t>(r)] = &parts.items[g]->tensor;
      for (size_t m = 0; m < moments_.size(); ++m) {
        moments[m][static_cast<size_t>(r)] = &tensor_field(*gs, moments_[m], where, group);
      }
      const int64_t valid = layout.valid(r);
      const auto expect = [&](const TensorRef* t, const char* what, int64_t n) {
        if (t->shape.size() != 1 || t->numel() != n) {
          bad(where, group + ": " + what + " has shape " + shape_text(t->shape) + "; " + std::to_string(n) +
                         " elements were expected (" + std::to_string(total) + " elements over " + std::to_string(W) +
                         " ranks in partitions of " + std::to_string(P) + ")");
        }
      };
      expect(fp32[static_cast<size_t>(r)], "the fp32 partition", valid);
      for (size_t m = 0; m < moments_.size(); ++m) expect(moments[m][static_cast<size_t>(r)], moments_[m].c_str(), P);
    }
    int64_t x = 0;  // position in the group's flat buffer
    for (const auto& [name, shape] : params) {
      const int t = parameter(name, shape, model_file);
      const int64_t n = numel_of(shape);
      for (int64_t pos = x; pos < x + n;) {
        const int64_t r = pos / P;
        const int64_t len = std::min(x + n, (r + 1) * P) - pos;
        const TorchFile* f = files_[static_cast<size_t>(r)].get();
        const size_t ri = static_cast<size_t>(r);
        add(0, t, {pos - x, len, f, fp32[ri], pos - r * P, group + " fp32 partition"});
        for (size_t m = 0; m < moments_.size(); ++m) {
          add(static_cast<int>(m) + 1, t, {pos - x, len, f, moments[m][ri], pos - r * P, group + " " + moments_[m]});
        }
        pos += len;
      }
      x += n;
    }
  }
}

void DeepSpeedCheckpoint::map_zero3(const std::vector<const Value*>& states, const Value& param_shapes) {
  const std::string model_file = files_.back()->path().string();
  const int64_t W = world_size_;
  // Per rank: the sub-groups' fp32 partitions and moments, and where each starts in their concatenation.
  struct Rank {
    std::vector<const TensorRef*> fp32;
    std::vector<std::vector<const TensorRef*>> moments;  // [moment][sub-group]
    std::vector<int64_t> start;
  };
  std::vector<Rank> ranks(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r) {
    const TorchFile& f = *files_[static_cast<size_t>(r)];
    const std::string where = f.path().string();
    const Value& sd = *states[static_cast<size_t>(r)];
    const Value& flats = field(sd, "fp32_flat_groups", Kind::kList, where, "optimizer_state_dict");
    const Value& osd = field(sd, "optimizer_state_dict", Kind::kDict, where, "optimizer_state_dict");
    const Value& adam = field(osd, "state", Kind::kDict, where, "optimizer_state_dict['optimizer_state_dict']");
    Rank& rk = ranks[static_cast<size_t>(r)];
    int64_t at = 0;
    for (size_t k = 0; k < flats.items.size(); ++k) {
      const std::string sub = "sub-group " + std::to_string(k);
      if (flats.items[k]->kind != Kind::kTensor) bad(where, sub + ": the fp32 partition is not a tensor");
      const Value* ks = adam.get(static_cast<int64_t>(k));
      if (!ks || ks->kind != Kind::kDict) bad(where, sub + ": no optimizer state");
      take_moments(*ks, where, sub);
      rk.moments.resize(moments_.size());
      rk.fp32.push_back(&flats.items[k]->tensor);
      const int64_t n = rk.fp32.back()->numel();
      for (size_t m = 0; m < moments_.size(); ++m) {
        const TensorRef* moment = &tensor_field(*ks, moments_[m], where, sub);
        if (moment->numel() != n) {
          bad(where, sub + ": " + moments_[m] + " of " + std::to_string(moment->numel()) +
                         " elements beside an fp32 partition of " + std::to_string(n));
        }
        rk.moments[m].push_back(moment);
      }
      rk.start.push_back(at);
      at += n;
    }
    rk.start.push_back(at);
  }
  // Each parameter: ceil(n / W) elements per rank, back to back in every rank's concatenation.
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  for (const Value* sub : param_shapes.items) {
    const auto p = named_shapes(*sub, model_file);
    params.insert(params.end(), p.begin(), p.end());
  }
  std::vector<int64_t> numels;
  for (const auto& [name, shape] : params) numels.push_back(numel_of(shape));
  const Zero3Layout layout = zero3_layout(numels, W);
  const int64_t total_parts = layout.per_rank;
  for (int64_t r = 0; r < W; ++r) {
    if (ranks[static_cast<size_t>(r)].start.back() != total_parts) {
      bad(files_[static_cast<size_t>(r)]->path().string(),
          "the fp32 partitions hold " + std::to_string(ranks[static_cast<size_t>(r)].start.back()) +
              " elements; the parameters of " + model_file + " need " + std::to_string(total_parts) + " per rank");
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, shape] = params[i];
    const int t = parameter(name, shape, model_file);
    const int64_t part = layout.part[i];
    const int64_t off = layout.offset[i];
    for (int64_t r = 0; r < W; ++r) {
      const Rank& rk = ranks[static_cast<size_t>(r)];
      const int64_t valid = layout.valid(i, r, numels[i]);
      for (int64_t done = 0; done < valid;) {
        const int64_t pos = off + done;
        const size_t k =
            static_cast<size_t>(std::upper_bound(rk.start.begin(), rk.start.end(), pos) - rk.start.begin() - 1);
        const int64_t len = std::min(valid - done, rk.start[k + 1] - pos);
        const TorchFile* f = files_[static_cast<size_t>(r)].get();
        const std::string sub = "sub-group " + std::to_string(k);
        add(0, t, {r * part + done, len, f, rk.fp32[k], pos - rk.start[k], sub + " fp32 partition"});
        for (size_t m = 0; m < moments_.size(); ++m) {
          add(static_cast<int>(m) + 1, t,
              {r * part + done, len, f, rk.moments[m][k], pos - rk.start[k], sub + " " + moments_[m]});
        }
        done += len;
      }
    }
  }
}

void DeepSpeedCheckpoint::open_universal() {
  const std::filesystem::path zero = folder_ / "zero";
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  require_inside(zero);
  for (const auto& entry : std::filesystem::directory_iterator(zero, ec)) {
    if (entry.is_directory(ec)) {
      require_inside(entry.path());
      dirs.push_back(entry.path());
    }
  }
  if (ec) bad(zero.string(), "cannot list the folder: " + ec.message());
  std::sort(dirs.begin(), dirs.end());
  // ds_to_universal copies the model states beside zero/: they hold the run's counters and, for a
  // checkpoint of no known model, the parameters' shapes (stage 3's universal files are flat).
  static const std::regex kModel(R"((zero_pp_rank_0_)?mp_rank_00_model_states\.pt)");
  const Value* counters = nullptr;
  std::string where = zero.string();
  for (const auto& entry : std::filesystem::directory_iterator(folder_, ec)) {
    if (std::regex_match(entry.path().filename().string(), kModel)) {
      require_inside(entry.path());
      files_.push_back(std::make_unique<TorchFile>(entry.path(), &parse_budget_));
      counters = &files_.back()->root();
      where = entry.path().string();
      break;
    }
  }
  if (!model_) {
    const Value* shapes = counters && counters->kind == Kind::kDict ? counters->get("param_shapes") : nullptr;
    if (!shapes || shapes->kind != Kind::kList) {
      bad(folder_.string(),
          "a universal checkpoint without the model states' param_shapes beside zero/: give "
          "--model to say which model it holds");
    }
    table_from_shapes(*shapes, where);
  }
  run_missing_ = "a universal checkpoint keeps no parameter groups";
  // Every parameter's folder holds fp32.pt and a file per moment: Adam's two, or Lion's one (the first
  // folder says which; the others must agree).
  std::vector<std::string> files;
  std::optional<int64_t> optimizer_step;  // stage 3's universal checkpoints have no step.pt
  for (const std::filesystem::path& dir : dirs) {
    const bool adam = std::filesystem::exists(dir / "exp_avg_sq.pt", ec);
    if (files.empty()) {
      moments_ = adam ? kAdamMoments : kLionMoments;
      files.push_back("fp32.pt");
      for (const std::string& m : moments_) files.push_back(m + ".pt");
    } else if (adam != (moments_ == kAdamMoments)) {
      bad(dir.string(), adam ? "holds exp_avg_sq.pt, which the first parameter's folder does not"
                             : "has no exp_avg_sq.pt beside the first parameter's folder's");
    }
    int t = -1;
    for (int s = 0; s < static_cast<int>(files.size()); ++s) {
      require_inside(dir / files[static_cast<size_t>(s)]);
      files_.push_back(std::make_unique<TorchFile>(dir / files[static_cast<size_t>(s)], &parse_budget_));
      const TorchFile& f = *files_.back();
      // Stage 1/2: {'param': tensor in its shape, 'cat_dim': ...}; stage 3: the flat tensor itself.
      const Value* v = &f.root();
      if (v->kind == Kind::kDict) v = &field(*v, "param", Kind::kTensor, f.path().string(), "");
      if (v->kind != Kind::kTensor) bad(f.path().string(), "holds " + std::string(v->describe()) + ", not a tensor");
      if (s == 0) {
        t = parameter(dir.filename().string(), v->tensor.shape, f.path().string());
      } else if (v->tensor.numel() != (*table_)[static_cast<size_t>(t)].numel()) {
        bad(f.path().string(), "holds " + std::to_string(v->tensor.numel()) + " elements; fp32.pt beside it holds " +
                                   std::to_string((*table_)[static_cast<size_t>(t)].numel()));
      }
      add(s, t, {0, v->tensor.numel(), &f, &v->tensor, 0, dir.filename().string()});
    }
    if (!optimizer_step && std::filesystem::exists(dir / "step.pt", ec)) {
      require_inside(dir / "step.pt");
      files_.push_back(std::make_unique<TorchFile>(dir / "step.pt", &parse_budget_));
      optimizer_step = step_value(files_.back()->root(), *files_.back(), "the step");
    }
  }
  read_counters(counters, where, optimizer_step);
}

void DeepSpeedCheckpoint::read_counters(const Value* ms, const std::string& where,
                                        std::optional<int64_t> optimizer_step) {
  auto counter = [&](std::string_view key, int64_t fallback) {
    const Value* v = ms && ms->kind == Kind::kDict ? ms->get(key) : nullptr;
    if (!v || v->kind == Kind::kNone) return fallback;
    if (v->kind != Kind::kInt || v->integer < 0 || v->integer > ckpt::kMaxStep * 1'000'000) {
      bad(where, std::string(key) + " is not a count");
    }
    return v->integer;
  };
  const int64_t step = counter("global_steps", optimizer_step.value_or(0));
  if (step > ckpt::kMaxStep) bad(where, "global_steps is above " + std::to_string(ckpt::kMaxStep));
  const int64_t skipped = counter("skipped_steps", 0);
  if (skipped > step) {
    bad(where, "skipped_steps " + std::to_string(skipped) + " exceeds global_steps " + std::to_string(step));
  }
  // Without a step of its own (stage 3's universal checkpoint), Adam has taken one step per step that
  // the loss scaler did not skip.
  const int64_t adam_steps = optimizer_step.value_or(step - skipped);
  if (adam_steps > step) {
    bad(where, "Adam's step count " + std::to_string(adam_steps) + " exceeds global_steps " + std::to_string(step));
  }
  // DeepSpeed's schedulers count the batches stepped from -1; other schedulers keep other fields, and
  // then the scheduler continues from the step.
  int64_t last_batch = step - 1;
  if (const Value* lr = ms && ms->kind == Kind::kDict ? ms->get("lr_scheduler") : nullptr;
      lr && lr->kind == Kind::kDict) {
    if (const Value* it = lr->get("last_batch_iteration"); it && it->kind == Kind::kInt) {
      if (it->integer < -1 || it->integer > ckpt::kMaxStep) bad(where, "lr_scheduler.last_batch_iteration is bad");
      last_batch = it->integer;
    }
  }
  trainer_state_ = {{"step", step},
                    {"consumed_samples", counter("global_samples", 0)},
                    {"skipped_steps", skipped},
                    {"optimizer_steps", adam_steps},
                    {"lr_scheduler", {{"last_batch_iteration", last_batch}}},
                    {"imported_from", folder_.string()}};
}

void DeepSpeedCheckpoint::check_complete() const {
  const ckpt::TensorTable& table = *table_;
  for (size_t t = 0; t < table.size(); ++t) {
    if (seen_as_[t].empty() && table[t].numel() > 0) {
      bad(folder_.string(), "no parameter of the checkpoint is " + table[t].name +
                                (model_ ? " of model " + model_->name() + " (is --model the model that was trained?)"
                                        : " (param_shapes names it)"));
    }
    if (table[t].numel() > 0 && pieces_[t].size() != 1 + moments_.size()) {
      fail(ErrorKind::kInternal, table[t].name + " has " + std::to_string(pieces_[t].size()) + " states of " +
                                     std::to_string(1 + moments_.size()));
    }
    for (const auto& pieces : pieces_[t]) {
      int64_t at = 0;
      for (const Piece& p : pieces) {
        if (p.begin != at) fail(ErrorKind::kInternal, "pieces of " + table[t].name + " do not tile it");
        at += p.length;
      }
      if (at != table[t].numel()) fail(ErrorKind::kInternal, "pieces of " + table[t].name + " do not cover it");
    }
  }
}

void DeepSpeedCheckpoint::read(int state, int tensor, int64_t offset, std::span<float> out) const {
  if (out.empty()) return;
  if (state < 0 || state > static_cast<int>(moments_.size())) {
    fail(ErrorKind::kInternal, "DeepSpeed checkpoint: state " + std::to_string(state) + " of " +
                                   std::to_string(1 + moments_.size()) + " read");
  }
  const std::vector<Piece>& pieces = pieces_[static_cast<size_t>(tensor)][static_cast<size_t>(state)];
  auto it =
      std::upper_bound(pieces.begin(), pieces.end(), offset, [](int64_t o, const Piece& p) { return o < p.begin; });
  size_t done = 0;
  for (--it; done < out.size(); ++it) {
    const int64_t at = offset + static_cast<int64_t>(done);
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(out.size() - done), it->begin + it->length - at);
    it->file->read(*it->source, it->source_offset + (at - it->begin), out.subspan(done, static_cast<size_t>(n)),
                   it->what);
    done += static_cast<size_t>(n);
  }
}

}  // namespace shardkit::convert::deepspeed
