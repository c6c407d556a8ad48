#include "convert/deepspeed/ds_checkpoint.hpp"

#include <algorithm>
#include <map>
#include <regex>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "ckpt/shard_format.hpp"

namespace shardkit::convert::deepspeed {
namespace {

using Kind = Value::Kind;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  fail(ErrorKind::kInvalidInput, where + ": " + what);
}

// The value under `key` of a dict, of kind `kind`; Error naming the file and the key path otherwise.
const Value& field(const Value& dict, std::string_view key, Kind kind, const std::string& where,
                   const std::string& path) {
  const Value* v = dict.kind == Kind::kDict || dict.kind == Kind::kObject ? dict.get(key) : nullptr;
  const std::string name = path.empty() ? std::string(key) : path + "['" + std::string(key) + "']";
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

const TensorRef& tensor_field(const Value& dict, std::string_view key, const std::string& where,
                              const std::string& path) {
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
    step = f;
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
  const size_t n = model_->table().size();
  pieces_.resize(n);
  seen_as_.resize(n);
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

void DeepSpeedCheckpoint::require_inside(const std::filesystem::path& entry) const {
  // Whoever made the checkpoint chose its links; the folder the user named may itself be one.
  require_within_folder(root_, entry, ErrorKind::kInvalidInput);
}

int DeepSpeedCheckpoint::parameter(const std::string& name, const std::vector<int64_t>& shape,
                                   const std::string& where) {
  std::string_view bare = name;
  // Wrappers (DistributedDataParallel, some trainers) prefix the module's names with "module.".
  while (bare.starts_with("module.")) bare.remove_prefix(7);
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
  const std::vector<int64_t>& expected = model_->table()[static_cast<size_t>(t)].shape;
  // The universal checkpoint of a stage 3 run stores every tensor flat.
  const bool flat_ok = shape.size() == 1 && layout_ == SourceLayout::kUniversal;
  if (shape != expected && !(flat_ok && shape[0] == numel_of(expected))) {
    bad(where, "parameter " + quoted_excerpt(name) + " has shape " + shape_text(shape) + "; " + model_name +
                   " expects " + shape_text(expected));
  }
  return t;
}

void DeepSpeedCheckpoint::add(int state, int tensor, Piece piece) {
  if (piece.length > 0) pieces_[static_cast<size_t>(tensor)][static_cast<size_t>(state)].push_back(std::move(piece));
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
}

void DeepSpeedCheckpoint::map_zero12(const std::vector<const Value*>& states, const Value& param_shapes) {
  const std::string model_file = files_.back()->path().string();
  const int64_t W = world_size_;
  for (size_t g = 0; g < param_shapes.items.size(); ++g) {
    const auto params = named_shapes(*param_shapes.items[g], model_file);
    int64_t total = 0;
    for (const auto& [name, shape] : params) total += numel_of(shape);
    // DeepSpeed pads each group's flat buffer to a multiple of 2 * W and splits it into W equal parts;
    // the saved fp32 partitions leave the padding out, the moments keep it.
    const int64_t align = 2 * W;
    const int64_t P = (total + align - 1) / align * align / W;
    const std::string group = "param group " + std::to_string(g);
    std::vector<const TensorRef*> fp32(static_cast<size_t>(W)), m1(fp32.size()), m2(fp32.size());
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
      if (!gs || gs->kind != Kind::kDict) bad(where, group + ": no Adam state (base_optimizer_state['state'])");
      fp32[static_cast<size_t>(r)] = &parts.items[g]->tensor;
      m1[static_cast<size_t>(r)] = &tensor_field(*gs, "exp_avg", where, group);
      m2[static_cast<size_t>(r)] = &tensor_field(*gs, "exp_avg_sq", where, group);
      const int64_t valid = std::clamp<int64_t>(total - r * P, 0, P);
      const auto expect = [&](const TensorRef* t, const char* what, int64_t n) {
        if (t->shape.size() != 1 || t->numel() != n) {
          bad(where, group + ": " + what + " has shape " + shape_text(t->shape) + "; " + std::to_string(n) +
                         " elements were expected (" + std::to_string(total) + " elements over " + std::to_string(W) +
                         " ranks in partitions of " + std::to_string(P) + ")");
        }
      };
      expect(fp32[static_cast<size_t>(r)], "the fp32 partition", valid);
      expect(m1[static_cast<size_t>(r)], "exp_avg", P);
      expect(m2[static_cast<size_t>(r)], "exp_avg_sq", P);
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
        add(1, t, {pos - x, len, f, m1[ri], pos - r * P, group + " exp_avg"});
        add(2, t, {pos - x, len, f, m2[ri], pos - r * P, group + " exp_avg_sq"});
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
    std::vector<const TensorRef*> fp32, m1, m2;
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
      if (!ks || ks->kind != Kind::kDict) bad(where, sub + ": no Adam state");
      rk.fp32.push_back(&flats.items[k]->tensor);
      rk.m1.push_back(&tensor_field(*ks, "exp_avg", where, sub));
      rk.m2.push_back(&tensor_field(*ks, "exp_avg_sq", where, sub));
      const int64_t n = rk.fp32.back()->numel();
      for (const TensorRef* m : {rk.m1.back(), rk.m2.back()}) {
        if (m->numel() != n) {
          bad(where, sub + ": a moment of " + std::to_string(m->numel()) + " elements beside an fp32 partition of " +
                         std::to_string(n));
        }
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
  int64_t total_parts = 0;
  for (const auto& [name, shape] : params) {
    total_parts += (numel_of(shape) + W - 1) / W;
    if (total_parts > (int64_t{1} << 50)) bad(model_file, "param_shapes declares more than 2^50 elements");
  }
  for (int64_t r = 0; r < W; ++r) {
    if (ranks[static_cast<size_t>(r)].start.back() != total_parts) {
      bad(files_[static_cast<size_t>(r)]->path().string(),
          "the fp32 partitions hold " + std::to_string(ranks[static_cast<size_t>(r)].start.back()) +
              " elements; the parameters of " + model_file + " need " + std::to_string(total_parts) + " per rank");
    }
  }
  int64_t off = 0;
  for (const auto& [name, shape] : params) {
    const int t = parameter(name, shape, model_file);
    const int64_t n = numel_of(shape);
    const int64_t part = (n + W - 1) / W;
    for (int64_t r = 0; r < W; ++r) {
      const Rank& rk = ranks[static_cast<size_t>(r)];
      const int64_t valid = std::clamp<int64_t>(n - r * part, 0, part);
      for (int64_t done = 0; done < valid;) {
        const int64_t pos = off + done;
        const size_t k =
            static_cast<size_t>(std::upper_bound(rk.start.begin(), rk.start.end(), pos) - rk.start.begin() - 1);
        const int64_t len = std::min(valid - done, rk.start[k + 1] - pos);
        const TorchFile* f = files_[static_cast<size_t>(r)].get();
        const std::string sub = "sub-group " + std::to_string(k);
        add(0, t, {r * part + done, len, f, rk.fp32[k], pos - rk.start[k], sub + " fp32 partition"});
        add(1, t, {r * part + done, len, f, rk.m1[k], pos - rk.start[k], sub + " exp_avg"});
        add(2, t, {r * part + done, len, f, rk.m2[k], pos - rk.start[k], sub + " exp_avg_sq"});
        done += len;
      }
    }
    off += part;
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
  constexpr const char* kFiles[kStateCount] = {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"};
  std::optional<int64_t> optimizer_step;  // stage 3's universal checkpoints have no step.pt
  for (const std::filesystem::path& dir : dirs) {
    int t = -1;
    for (int s = 0; s < kStateCount; ++s) {
      require_inside(dir / kFiles[s]);
      files_.push_back(std::make_unique<TorchFile>(dir / kFiles[s], &parse_budget_));
      const TorchFile& f = *files_.back();
      // Stage 1/2: {'param': tensor in its shape, 'cat_dim': ...}; stage 3: the flat tensor itself.
      const Value* v = &f.root();
      if (v->kind == Kind::kDict) v = &field(*v, "param", Kind::kTensor, f.path().string(), "");
      if (v->kind != Kind::kTensor) bad(f.path().string(), "holds " + std::string(v->describe()) + ", not a tensor");
      if (s == 0) {
        t = parameter(dir.filename().string(), v->tensor.shape, f.path().string());
      } else if (v->tensor.numel() != model_->table()[static_cast<size_t>(t)].numel()) {
        bad(f.path().string(), "holds " + std::to_string(v->tensor.numel()) + " elements; fp32.pt beside it holds " +
                                   std::to_string(model_->table()[static_cast<size_t>(t)].numel()));
      }
      add(s, t, {0, v->tensor.numel(), &f, &v->tensor, 0, dir.filename().string()});
    }
    if (!optimizer_step && std::filesystem::exists(dir / "step.pt", ec)) {
      require_inside(dir / "step.pt");
      files_.push_back(std::make_unique<TorchFile>(dir / "step.pt", &parse_budget_));
      optimizer_step = step_value(files_.back()->root(), *files_.back(), "the step");
    }
  }
  // ds_to_universal copies the model states beside zero/: they hold the run's counters.
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
  const ckpt::TensorTable& table = model_->table();
  for (size_t t = 0; t < table.size(); ++t) {
    if (seen_as_[t].empty() && table[t].numel() > 0) {
      bad(folder_.string(), "no parameter of the checkpoint is " + table[t].name + " of model " + model_->name() +
                                " (is --model the model that was trained?)");
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
