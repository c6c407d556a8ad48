#include "convert/dcp/dcp_checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <regex>
#include <set>
#include <unordered_map>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "ckpt/shard_format.hpp"

namespace shardkit::convert::dcp {
namespace {

using torch::Value;
using Kind = Value::Kind;

// The optimizer's key prefixes, in the order they are tried: get_state_dict's, torchtitan's.
constexpr const char* kOptimizerPrefixes[] = {"optim.", "optimizer."};
// Top-level entries of torchtitan's state dict that are not the model's.
constexpr const char* kNotModel[] = {"train_state.", "lr_scheduler.", "dataloader."};

bool not_model(std::string_view key) {
  return std::any_of(std::begin(kNotModel), std::end(kNotModel), [&](const char* p) { return key.starts_with(p); });
}
constexpr const char* kStateNames[] = {"weights", "exp_avg", "exp_avg_sq"};
// Elements compared per read when looking for a tied name.
constexpr int64_t kCompareElems = int64_t{1} << 20;
constexpr int64_t kFirstCompareElems = 4096;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

DcpCheckpoint::DcpCheckpoint(const std::filesystem::path& folder, std::shared_ptr<const model::Model> model)
    : model_(std::move(model)), folder_(folder), metadata_(folder, &parse_budget_) {
  std::set<std::string> files;
  for (const Item& item : metadata_.items()) {
    for (const Chunk& c : item.chunks) files.insert(c.location.file);
  }
  // PyTorch's file system writer names its files __<rank>_<n>.distcp (n counts a rank's writer
  // threads): the ranks that saved are the distinct <rank>s; other names count one each.
  static const std::regex kRankFile(R"(__(\d{1,9})_\d{1,9}\.distcp)");
  std::set<std::string> ranks;
  for (const std::string& f : files) {
    require_within_folder(folder_, folder_ / f);
    std::smatch m;
    ranks.insert(std::regex_match(f, m, kRankFile) ? m[1].str() : f);
  }
  world_size_ = static_cast<int>(ranks.size());
  find_layout();
  build_table();
  read_counters();
  read_run();
}

std::string DcpCheckpoint::state_key(const std::string& fqn, const char* state) const {
  return optim_prefix_ + "state." + fqn + "." + state;
}

void DcpCheckpoint::find_layout() {
  const std::string where = (folder_ / ".metadata").string();
  std::string first;  // the first parameter with optimizer state
  for (const char* prefix : kOptimizerPrefixes) {
    const std::string state = std::string(prefix) + "state.";
    for (const Item& item : metadata_.items()) {
      if (item.tensor && item.key.starts_with(state) && item.key.ends_with(".exp_avg") &&
          item.key.size() > state.size() + 8) {
        first = item.key.substr(state.size(), item.key.size() - state.size() - 8);
        break;
      }
    }
    if (!first.empty()) {
      optim_prefix_ = prefix;
      break;
    }
  }
  if (!first.empty()) {
    // torchtitan keeps the model at the top level; get_state_dict under "model.". A model whose own
    // top module is called `model` (Hugging Face's Llama) is told apart by the optimizer's names.
    if (metadata_.find("model." + first)) {
      model_prefix_ = "model.";
    } else if (!metadata_.find(first)) {
      fail(ErrorKind::kInvalidInput, where + ": the optimizer holds state for " + quoted_excerpt(first) +
                                         ", which the checkpoint holds no model entry for (neither '" + first +
                                         "' nor 'model." + first + "')");
    }
  } else {
    // Weights alone: under "model." when every tensor but torchtitan's other entries is there.
    model_prefix_ = "model.";
    for (const Item& item : metadata_.items()) {
      if (item.tensor && !item.key.starts_with("model.") && !not_model(item.key)) model_prefix_.clear();
    }
  }
  layout_name_ = optim_prefix_ == "optimizer." || (optim_prefix_.empty() && model_prefix_.empty()) ? "torchtitan"
                                                                                                   : "get_state_dict";
}

DcpCheckpoint::Source DcpCheckpoint::open_item(const Item& item) {
  Source s;
  s.item = &item;
  for (const Chunk& chunk : item.chunks) {
    Piece p;
    p.chunk = &chunk;
    p.file = std::make_unique<torch::TorchFile>(folder_ / chunk.location.file, chunk.location.offset,
                                                chunk.location.length, &parse_budget_);
    const Value& root = p.file->root();
    const std::string what = quoted_excerpt(item.key);
    if (root.kind != Kind::kTensor) {
      fail(ErrorKind::kInvalidInput, p.file->where() + ": " + what + " holds " + root.describe() + ", not a tensor");
    }
    if (root.tensor.shape != chunk.sizes || !root.tensor.contiguous() || root.tensor.storage->dtype != item.dtype) {
      fail(ErrorKind::kInvalidInput, p.file->where() + ": " + what + " holds a " +
                                         torch::dtype_name(root.tensor.storage->dtype) + " tensor of shape " +
                                         shape_text(root.tensor.shape) + "; the metadata says a contiguous " +
                                         torch::dtype_name(item.dtype) + " chunk of " + shape_text(chunk.sizes));
    }
    p.full_from = 0;
    for (size_t d = item.shape.size(); d-- > 1;) {
      if (chunk.sizes[d] != item.shape[d]) {
        p.full_from = d;
        break;
      }
    }
    s.pieces.push_back(std::move(p));
  }
  return s;
}

void DcpCheckpoint::read_source(const Source& source, int64_t offset, std::span<float> out) const {
  const Item& item = *source.item;
  const size_t n = item.shape.size();
  const std::string what = quoted_excerpt(item.key);
  if (n == 0) {
    source.pieces.front().file->read(source.pieces.front().file->root().tensor, offset, out, what);
    return;
  }
  std::vector<int64_t> stride(n, 1);
  for (size_t d = n - 1; d-- > 0;) stride[d] = stride[d + 1] * item.shape[d + 1];
  std::vector<int64_t> at(n);
  size_t hint = 0;
  for (size_t done = 0; done < out.size();) {
    const int64_t p = offset + static_cast<int64_t>(done);
    for (size_t d = 0; d < n; ++d) at[d] = (p / stride[d]) % item.shape[d];
    const Piece* piece = nullptr;
    for (size_t j = 0; j < source.pieces.size() && !piece; ++j) {
      const Piece& c = source.pieces[(hint + j) % source.pieces.size()];
      bool inside = true;
      for (size_t d = 0; d < n && inside; ++d) {
        inside = at[d] >= c.chunk->offsets[d] && at[d] < c.chunk->offsets[d] + c.chunk->sizes[d];
      }
      if (inside) {
        piece = &c;
        hint = (hint + j) % source.pieces.size();
      }
    }
    if (!piece) {
      fail(ErrorKind::kInvalidInput, (folder_ / ".metadata").string() + ": element " + std::to_string(p) + " of " +
                                         what + " lies in none of its chunks");
    }
    const Chunk& c = *piece->chunk;
    const size_t k = piece->full_from;
    // From `at` the chunk holds the rest of dimension k's extent with every later dimension whole.
    const int64_t run = (c.offsets[k] + c.sizes[k] - at[k]) * stride[k] - p % stride[k];
    int64_t local = 0;
    for (size_t d = 0; d < n; ++d) local = local * c.sizes[d] + (at[d] - c.offsets[d]);
    const auto len = static_cast<size_t>(std::min<int64_t>(run, static_cast<int64_t>(out.size() - done)));
    piece->file->read(piece->file->root().tensor, local, out.subspan(done, len), what);
    done += len;
  }
}

bool DcpCheckpoint::same_values(const Source& a, const Source& b) const {
  if (a.item->shape != b.item->shape || a.item->dtype != b.item->dtype) return false;
  const int64_t numel = a.item->numel();
  std::vector<float> x, y;
  // A small first piece: most pairs differ at once, and a model with many frozen tensors of one shape
  // compares each against every parameter of that shape.
  for (int64_t at = 0, piece = kFirstCompareElems; at < numel; at += piece, piece = kCompareElems) {
    const auto n = static_cast<size_t>(std::min(piece, numel - at));
    x.resize(n);
    y.resize(n);
    read_source(a, at, x);
    read_source(b, at, y);
    if (std::memcmp(x.data(), y.data(), n * sizeof(float)) != 0) return false;
  }
  return true;
}

void DcpCheckpoint::build_table() {
  const std::string where = (folder_ / ".metadata").string();
  struct Entry {
    std::string fqn;
    const Item* item;
    bool stateful;
  };
  std::vector<Entry> entries;
  for (const Item& item : metadata_.items()) {
    if (!item.tensor || !item.key.starts_with(model_prefix_)) continue;
    if (!optim_prefix_.empty() && item.key.starts_with(optim_prefix_)) continue;
    if (model_prefix_.empty() && not_model(item.key)) {
      continue;
    }
    std::string fqn = item.key.substr(model_prefix_.size());
    const bool stateful = metadata_.find(state_key(fqn, "exp_avg")) && metadata_.find(state_key(fqn, "exp_avg_sq"));
    entries.push_back({std::move(fqn), &item, stateful});
  }
  if (entries.empty()) fail(ErrorKind::kInvalidInput, where + ": the state dict holds no model tensors");
  has_moments_ = !optim_prefix_.empty();

  // Each table tensor's weights, and its moments where the optimizer keeps them.
  const auto open_states = [&](size_t t, const Entry& e) {
    sources_[t][0] = open_item(*e.item);
    if (!e.stateful) return;
    for (int s = 1; s < kStates; ++s) {
      const Item& m = *metadata_.find(state_key(e.fqn, kStateNames[s]));
      if (m.shape != e.item->shape) {
        fail(ErrorKind::kInvalidInput, where + ": " + quoted_excerpt(m.key) + " has shape " + shape_text(m.shape) +
                                           "; its parameter has " + shape_text(e.item->shape));
      }
      sources_[t][static_cast<size_t>(s)] = open_item(m);
    }
  };

  if (model_) {
    table_ = &model_->table();
    sources_.resize(table_->size());
    fqns_.resize(table_->size());
    const std::string model_name = "model " + model_->name();
    std::vector<std::pair<std::string, std::string>> tied;  // fqn, table name of what it is tied to
    for (const Entry& e : entries) {
      const std::optional<model::HfName> c = model_->classify_hf_name(e.fqn);
      if (c && c->kind == model::HfName::kTiedOutput) {
        tied.emplace_back(e.fqn, c->name);
        continue;
      }
      if (c && c->kind == model::HfName::kBuffer) continue;
      const int t = c && c->kind == model::HfName::kParameter ? table_->find(c->name) : -1;
      if (t < 0) {
        fail(ErrorKind::kInvalidInput, where + ": unknown parameter " + quoted_excerpt(e.fqn) + ": " + model_name +
                                           " has no such tensor (is --model the model that was trained?)");
      }
      const auto ti = static_cast<size_t>(t);
      if (!fqns_[ti].empty()) {
        fail(ErrorKind::kInvalidInput, where + ": " + quoted_excerpt(fqns_[ti]) + " and " + quoted_excerpt(e.fqn) +
                                           " are both " + (*table_)[ti].name);
      }
      if (e.item->shape != (*table_)[ti].shape) {
        fail(ErrorKind::kInvalidInput, where + ": " + quoted_excerpt(e.fqn) + " has shape " +
                                           shape_text(e.item->shape) + "; " + model_name + " expects " +
                                           shape_text((*table_)[ti].shape));
      }
      fqns_[ti] = e.fqn;
      open_states(ti, e);
    }
    for (size_t t = 0; t < table_->size(); ++t) {
      if (fqns_[t].empty()) {
        fail(ErrorKind::kInvalidInput, where + ": no entry of the state dict is " + (*table_)[t].name + " of " +
                                           model_name + " (is --model the model that was trained?)");
      }
    }
    for (const auto& [fqn, holder] : tied) shared_params_[fqn] = fqns_[static_cast<size_t>(table_->find(holder))];
    return;
  }

  // No model: the entries are the table, but for names that only repeat a parameter's values.
  std::vector<ckpt::TensorInfo> tensors;
  std::vector<const Entry*> kept;
  std::vector<Source> weights;
  for (const Entry& e : entries) {
    if (e.stateful || !has_moments_) {
      kept.push_back(&e);
      continue;
    }
    Source mine = open_item(*e.item);
    const Entry* holder = nullptr;
    for (size_t i = 0; i < entries.size() && !holder; ++i) {
      const Entry& other = entries[i];
      if (other.stateful && other.item->shape == e.item->shape && same_values(mine, open_item(*other.item))) {
        holder = &other;
      }
    }
    if (holder) {
      shared_params_[e.fqn] = holder->fqn;
    } else {
      kept.push_back(&e);  // a frozen parameter or a buffer: its weights travel, it has no moments
    }
  }
  for (const Entry* e : kept) tensors.push_back({e->fqn, e->item->shape, ckpt::DType::kF32});
  try {
    own_table_ = ckpt::TensorTable(std::move(tensors));
  } catch (const Error& e) {
    fail(ErrorKind::kInvalidInput, where + ": " + e.what());
  }
  table_ = &own_table_;
  sources_.resize(table_->size());
  fqns_.resize(table_->size());
  for (size_t t = 0; t < kept.size(); ++t) {
    fqns_[t] = kept[t]->fqn;
    open_states(t, *kept[t]);
  }
}

void DcpCheckpoint::read(int state, int tensor, int64_t offset, std::span<float> out) const {
  const Source& s = sources_.at(static_cast<size_t>(tensor)).at(static_cast<size_t>(state));
  if (!s.item) {
    fail(ErrorKind::kInvalidInput, folder_.string() + ": " + quoted_excerpt(fqns_[static_cast<size_t>(tensor)]) +
                                       " has no " + kStateNames[state] +
                                       " in the checkpoint (a frozen parameter or a buffer: the optimizer keeps no "
                                       "state for it)");
  }
  read_source(s, offset, out);
}

const torch::Value& DcpCheckpoint::value_of(const Item& item) {
  const StorageLocation& loc = item.chunks.front().location;
  values_.push_back(std::make_unique<torch::TorchFile>(folder_ / loc.file, loc.offset, loc.length, &parse_budget_));
  return values_.back()->root();
}

int64_t DcpCheckpoint::counter(const Item& item, const std::string& what) {
  double v = 0;
  std::string from;
  if (item.tensor) {
    const Source s = open_item(item);
    const torch::TorchFile& f = *s.pieces.front().file;
    v = f.scalar(f.root().tensor, what);
    from = f.where();
  } else {
    const Value& value = value_of(item);
    from = values_.back()->where();
    if (value.kind == Kind::kInt) {
      v = static_cast<double>(value.integer);
    } else if (value.kind == Kind::kFloat) {
      v = value.real;
    } else {
      fail(ErrorKind::kInvalidInput, from + ": " + what + " is " + value.describe() + ", not a number");
    }
  }
  if (!(v >= 0 && v <= static_cast<double>(ckpt::kMaxStep)) || v != std::floor(v)) {
    fail(ErrorKind::kInvalidInput, from + ": " + what + " is " + std::to_string(v) + ", not a step count");
  }
  return static_cast<int64_t>(v);
}

void DcpCheckpoint::read_counters() {
  std::optional<int64_t> adam;
  std::string adam_from;
  for (const std::string& fqn : fqns_) {
    const Item* item = optim_prefix_.empty() ? nullptr : metadata_.find(state_key(fqn, "step"));
    if (!item) continue;
    const int64_t step = counter(*item, quoted_excerpt(item->key));
    if (adam && *adam != step) {
      fail(ErrorKind::kInvalidInput, folder_.string() + ": the optimizer's step is " + std::to_string(*adam) + " for " +
                                         adam_from + " and " + std::to_string(step) + " for " + fqn +
                                         "; a checkpoint keeps one step for all parameters");
    }
    adam = step;
    adam_from = fqn;
  }
  int64_t step = adam.value_or(0);
  if (const Item* t = metadata_.find("train_state.step")) step = counter(*t, "train_state.step");
  trainer_state_ = {{"step", step}, {"imported_from", folder_.string()}};
  if (adam) trainer_state_["optimizer_steps"] = *adam;
}

void DcpCheckpoint::read_run() {
  if (optim_prefix_.empty()) {
    run_missing_ = folder_.string() + ": the checkpoint holds no optimizer state";
    return;
  }
  try {
    std::unordered_map<std::string, std::string> table_name;
    for (size_t t = 0; t < fqns_.size(); ++t) table_name[fqns_[t]] = (*table_)[t].name;
    deepspeed::DeepSpeedRun run;
    for (int g = 0;; ++g) {
      const std::string prefix = optim_prefix_ + "param_groups." + std::to_string(g) + ".";
      const Item* params = metadata_.find(prefix + "params");
      if (!params) break;
      deepspeed::DeepSpeedRun::Group group;
      group.options = nlohmann::json::object();
      const Value& names = value_of(*params);
      const std::string& where = values_.back()->where();
      if (names.kind != Kind::kList) {
        fail(ErrorKind::kInvalidInput, where + ": " + params->key + " is " + names.describe() + ", not a list");
      }
      for (const Value* name : names.items) {
        if (name->kind != Kind::kString) {
          fail(ErrorKind::kInvalidInput,
               where + ": " + params->key + " names parameters by number; get_state_dict's names are read");
        }
        const auto it = table_name.find(name->text);
        if (it == table_name.end()) {
          fail(ErrorKind::kInvalidInput, where + ": " + params->key + " names " + quoted_excerpt(name->text) +
                                             ", which is no parameter of the checkpoint");
        }
        group.params.push_back(it->second);
      }
      for (const Item& item : metadata_.items()) {
        if (item.tensor || !item.key.starts_with(prefix) || &item == params) continue;
        const std::string field = item.key.substr(prefix.size());
        group.options[field] = deepspeed::to_json(value_of(item), values_.back()->where(), item.key);
      }
      run.groups.push_back(std::move(group));
    }
    if (run.groups.empty()) fail(ErrorKind::kInvalidInput, folder_.string() + ": no " + optim_prefix_ + "param_groups");
    run.shared_params = shared_params_;
    const Item* step = fqns_.empty() ? nullptr : metadata_.find(state_key(fqns_.front(), "step"));
    run.step_is_tensor = !step || step->tensor;
    run_ = std::move(run);
  } catch (const Error& e) {
    run_missing_ = e.what();
  }
}

}  // namespace shardkit::convert::dcp
