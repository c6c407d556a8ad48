#include "convert/export_dcp.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/thread_pool.hpp"
#include "base/write_target.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/source.hpp"
#include "convert/staging.hpp"
#include "convert/torch/pickler.hpp"
#include "convert/torch/torch_writer.hpp"

namespace shardkit::convert {
namespace {

using torch::Value;
using torch::ValueBuilder;

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata.";
// What torch.save into a buffer names an archive's folder; DCP's writer saves every item that way.
constexpr const char* kArchiveName = "archive";
constexpr const char* kStateKeys[] = {nullptr, "exp_avg", "exp_avg_sq"};

// torch.optim.AdamW's group fields (PyTorch 2.11): dcp.load wants every field of the loading
// optimizer's groups in the checkpoint, so those a source did not record are written with AdamW's
// defaults (the settings that change the update, lr, betas, eps and weight_decay, always come from
// the source).
nlohmann::json adamw_defaults() {
  return {{"amsgrad", false},
          {"maximize", false},
          {"foreach", nullptr},
          {"capturable", false},
          {"differentiable", false},
          {"fused", nullptr},
          {"decoupled_weight_decay", true}};
}

// One item of the state dict: a chunk of a tensor, a step counter or a pickled value.
struct Item {
  std::string key;
  nlohmann::json path;  // planner_data: the key's path through the nested state dict
  int tensor = -1;      // table tensor (a chunk of one of its states), or -1
  int state = 0;
  std::vector<int64_t> shape;  // the full tensor's
  std::vector<int64_t> offsets, sizes;
  size_t chunk_index = 0;
  const Value* value = nullptr;  // a step's 0-d tensor, or a pickled value
  bool bytes = false;
  int rank = 0;
  uint64_t offset = 0, length = 0;  // placed in the rank's file
  int64_t flat_begin = 0, numel = 0;
};

Item named(std::string key, nlohmann::json path) {
  Item item;
  item.key = std::move(key);
  item.path = std::move(path);
  return item;
}

int64_t volume(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (const int64_t d : dims) n *= d;
  return n;
}

// FSDP2's Shard(0): ceil(rows / ranks) rows per rank, the last ranks fewer or none.
std::vector<std::pair<int64_t, int64_t>> row_chunks(int64_t rows, int world) {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  const int64_t per = (rows + world - 1) / world;
  for (int r = 0; r < world && per > 0; ++r) {
    const int64_t begin = std::min(rows, r * per), end = std::min(rows, (r + 1) * per);
    if (end > begin) chunks.emplace_back(begin, end - begin);
  }
  return chunks;
}

class Exporter {
 public:
  Exporter(const CheckpointSource& src, int world) : src_(src), world_(world) {}

  void plan() {
    const ckpt::TensorTable& table = *src_.table;
    for (size_t t = 0; t < table.size(); ++t) add_tensor("model." + table[t].name, {"model", table[t].name}, t, 0);
    if (!src_.has_moments) return;
    const deepspeed::DeepSpeedRun run = optimizer_run(src_);
    // The names a model's state dict repeats for a tied parameter (GPT-2's lm_head.weight), with its values.
    for (const auto& [tied, holder] : run.shared_params.items()) {
      const int t = table.find(holder.get<std::string>());
      if (t >= 0 && table.find(tied) < 0) add_tensor("model." + tied, {"model", tied}, static_cast<size_t>(t), 0);
    }
    const int64_t steps = src_.trainer_state.value("optimizer_steps", src_.trainer_state.value("step", int64_t{0}));
    const Value* step = b_.tensor(b_.storage("0", torch::Dtype::kF32, 1), 0, {});
    step_value_ = static_cast<float>(steps);
    for (const deepspeed::DeepSpeedRun::Group& g : run.groups) {
      for (const std::string& name : g.params) {
        const int t = table.find(name);
        if (t < 0) fail(ErrorKind::kInvalidInput, src_.path.string() + ": parameter group names unknown " + name);
        const std::string prefix = "optim.state." + name + ".";
        Item item = named(prefix + "step", {"optim", "state", name, "step"});
        item.value = step;
        items_.push_back(std::move(item));
        for (int s = 1; s <= 2; ++s) {
          add_tensor(prefix + kStateKeys[s], {"optim", "state", name, kStateKeys[s]}, static_cast<size_t>(t), s);
        }
      }
    }
    for (size_t g = 0; g < run.groups.size(); ++g) {
      nlohmann::json fields = adamw_defaults();
      for (const auto& [k, v] : run.groups[g].options.items()) fields[k] = v;
      fields["params"] = run.groups[g].params;
      const std::string prefix = "optim.param_groups." + std::to_string(g) + ".";
      for (const auto& [field, v] : fields.items()) {
        Item item = named(prefix + field, {"optim", "param_groups", static_cast<int64_t>(g), field});
        item.value = deepspeed::from_json(b_, v);
        item.bytes = true;
        items_.push_back(std::move(item));
      }
    }
  }

  void write(const std::filesystem::path& dir, const ConvertOptions& options) {
    int64_t total = 0;
    for (const Item& item : items_) total += item.numel * 4;
    SharedProgress progress(options.progress, total);
    // One rank's file at a time, however many ranks: a bounded number of open files.
    for (int r = 0; r < world_; ++r) write_rank(dir, r, options, progress);
    progress.finish();
    write_file_durable(dir / ".metadata", torch::pickle(*metadata()).bytes);
  }

 private:
  static std::string file_name(int rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

  // The rank's items back to back, every archive laid out before a byte is written, then the tensors'
  // values streamed in pieces on the pool's threads.
  void write_rank(const std::filesystem::path& dir, int rank, const ConvertOptions& options, SharedProgress& progress) {
    FileDescriptor file = create_fresh_file(dir / file_name(rank), O_WRONLY);
    std::vector<Item*> mine;
    std::vector<std::unique_ptr<torch::TorchFileWriter>> writers;
    uint64_t end = 0;
    for (Item& item : items_) {
      if (item.rank != rank) continue;
      const Value* root = item.value;
      if (item.tensor >= 0) root = b_.tensor(b_.storage("0", torch::Dtype::kF32, volume(item.sizes)), 0, item.sizes);
      writers.push_back(std::make_unique<torch::TorchFileWriter>(file, end, kArchiveName, *root));
      item.offset = end;
      item.length = writers.back()->archive_size();
      end += item.length;
      mine.push_back(&item);
    }
    const StreamPlan plan = plan_stream(options, 8, src_.chunk_elems);
    struct Task {
      size_t item;
      int64_t begin, length;
    };
    std::vector<Task> tasks;
    for (size_t i = 0; i < mine.size(); ++i) {
      for (int64_t at = 0; at < mine[i]->numel; at += plan.piece_elems) {
        tasks.push_back({i, at, std::min(plan.piece_elems, mine[i]->numel - at)});
      }
    }
    std::vector<StateReadFn> readers(static_cast<size_t>(plan.threads));
    std::vector<std::vector<float>> values(static_cast<size_t>(plan.threads));
    ThreadPool pool(plan.threads - 1);
    pool.parallel_for(tasks.size(), [&](size_t k, int worker) {
      const Task& task = tasks[k];
      const Item& item = *mine[task.item];
      StateReadFn& read = readers[static_cast<size_t>(worker)];
      if (!read) read = src_.reader();
      std::vector<float>& v = values[static_cast<size_t>(worker)];
      v.resize(static_cast<size_t>(task.length));
      read(item.state, item.tensor, item.flat_begin + task.begin, v);
      writers[task.item]->write("0", static_cast<uint64_t>(task.begin) * 4, std::as_bytes(std::span<const float>(v)));
      progress.add(task.length * 4);
    });
    for (size_t i = 0; i < mine.size(); ++i) {
      if (mine[i]->tensor < 0 && !mine[i]->bytes) {
        writers[i]->write("0", 0, std::as_bytes(std::span<const float>(&step_value_, 1)));
      }
      writers[i]->finish();
    }
    file.fsync();
  }

  // A state of a table tensor, cut into FSDP2's dim-0 chunks, chunk r in rank r's file.
  void add_tensor(const std::string& key, const nlohmann::json& path, size_t t, int state) {
    const ckpt::TensorInfo& info = (*src_.table)[t];
    Item base = named(key, path);
    base.tensor = static_cast<int>(t);
    base.state = state;
    base.shape = info.shape;
    if (info.shape.empty()) {
      base.numel = 1;
      items_.push_back(base);
      return;
    }
    const int64_t inner = info.shape[0] == 0 ? 0 : info.numel() / info.shape[0];
    auto chunks = row_chunks(info.shape[0], world_);
    if (chunks.empty()) chunks.emplace_back(0, 0);  // an empty tensor: one empty chunk
    for (size_t c = 0; c < chunks.size(); ++c) {
      Item item = base;
      item.offsets.assign(info.shape.size(), 0);
      item.offsets[0] = chunks[c].first;
      item.sizes = info.shape;
      item.sizes[0] = chunks[c].second;
      item.chunk_index = c;
      item.rank = static_cast<int>(c);
      item.flat_begin = chunks[c].first * inner;
      item.numel = chunks[c].second * inner;
      items_.push_back(std::move(item));
    }
  }

  const Value* cls(const char* name, ValueBuilder::Pairs attributes) {
    return b_.object(std::string(kMetadataModule) + name, std::move(attributes));
  }
  const Value* path_value(const nlohmann::json& path) {
    std::vector<const Value*> parts;
    for (const auto& p : path)
      parts.push_back(p.is_number() ? b_.integer(p.get<int64_t>()) : b_.str(p.get<std::string>()));
    return b_.tuple(std::move(parts));
  }

  const Value* metadata() {
    const Value* properties = b_.object(
        std::string(kMetadataModule) + "TensorProperties",
        {{b_.str(std::string(torch::kStateAttribute)),
          b_.tuple({b_.global("torch.float32"), b_.global("torch.strided"), b_.boolean(false),
                    b_.integer(0, std::string(kMetadataModule) + "_MEM_FORMAT_ENCODING"), b_.boolean(false)})}});
    ValueBuilder::Pairs sdm, planner, storage;
    std::map<std::string, size_t> entry_of;  // key -> index in sdm
    std::vector<std::vector<const Value*>> chunks;
    for (const Item& item : items_) {
      auto [it, fresh] = entry_of.emplace(item.key, sdm.size());
      if (fresh) {
        sdm.emplace_back(b_.str(item.key), nullptr);
        chunks.emplace_back();
        planner.emplace_back(b_.str(item.key), path_value(item.path));
      }
      const Value* index = nullptr;
      if (item.bytes) {
        index = cls("MetadataIndex", {{b_.str("fqn"), b_.str(item.key)}, {b_.str("index"), b_.none()}});
      } else {
        chunks[it->second].push_back(cls("ChunkStorageMetadata", {{b_.str("offsets"), b_.size(item.offsets)},
                                                                  {b_.str("sizes"), b_.size(item.sizes)}}));
        index = cls("MetadataIndex", {{b_.str("fqn"), b_.str(item.key)},
                                      {b_.str("offset"), b_.size(item.offsets)},
                                      {b_.str("index"), b_.integer(static_cast<int64_t>(item.chunk_index))}});
      }
      storage.emplace_back(index, b_.object("torch.distributed.checkpoint.filesystem._StorageInfo",
                                            {{b_.str("relative_path"), b_.str(file_name(item.rank))},
                                             {b_.str("offset"), b_.integer(static_cast<int64_t>(item.offset))},
                                             {b_.str("length"), b_.integer(static_cast<int64_t>(item.length))}}));
    }
    for (const Item& item : items_) {
      auto& [key, meta] = sdm[entry_of[item.key]];
      if (meta) continue;
      meta = item.bytes ? cls("BytesStorageMetadata", {})
                        : cls("TensorStorageMetadata", {{b_.str("properties"), properties},
                                                        {b_.str("size"), b_.size(item.shape)},
                                                        {b_.str("chunks"), b_.list(chunks[entry_of[item.key]])}});
    }
    return cls("Metadata", {{b_.str("state_dict_metadata"), b_.dict(std::move(sdm))},
                            {b_.str("planner_data"), b_.dict(std::move(planner))},
                            {b_.str("storage_data"), b_.dict(std::move(storage))},
                            {b_.str("storage_meta"), b_.none()},
                            {b_.str("version"), b_.str("1.0.0")}});
  }

  const CheckpointSource& src_;
  const int world_;
  ValueBuilder b_;
  std::vector<Item> items_;
  float step_value_ = 0;
};

}  // namespace

DcpExportResult export_dcp(const DcpExportRequest& request, const ConvertOptions& options) {
  if (request.world_size < 1 || request.world_size > (1 << 20)) {
    fail(ErrorKind::kInvalidInput,
         "--world-size " + std::to_string(request.world_size) + ": expected 1 to 1048576 ranks");
  }
  const CheckpointSource src = open_checkpoint_source(request.source, request.model);
  require_adamw_or_weights(src, "a PyTorch DCP checkpoint");
  Exporter exporter(src, request.world_size);
  exporter.plan();
  StagedDirectory out(request.output, {request.source, src.path}, options.force);
  exporter.write(out.path(), options);
  out.commit();
  DcpExportResult result;
  result.folder = request.output;
  result.step = src.trainer_state.value("step", int64_t{0});
  result.world_size = request.world_size;
  result.optimizer = src.has_moments;
  return result;
}

}  // namespace shardkit::convert
