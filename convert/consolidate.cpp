#include "convert/consolidate.hpp"

#include <algorithm>
#include <fstream>
#include <map>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/thread_pool.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/dtype_convert.hpp"
#include "ckpt/hdf5_arrays.hpp"
#include "ckpt/run_dir.hpp"
#include "ckpt/safetensors.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/virtual_view.hpp"
#include "convert/source.hpp"
#include "convert/staging.hpp"
#include "model/registry.hpp"

namespace shardkit::convert {
namespace {

namespace st = ckpt::safetensors;

// One exported tensor: which table tensor and state it comes from, and its name and dtype in the output.
struct Item {
  int tensor = 0;
  int state = 0;
  std::string name;
  ckpt::DType dtype = ckpt::DType::kF32;
};

const char* dtype_string(ckpt::DType d) {
  return d == ckpt::DType::kF32 ? "F32" : d == ckpt::DType::kBF16 ? "BF16" : "F16";
}
const char* torch_dtype(ckpt::DType d) {
  return d == ckpt::DType::kF32 ? "float32" : d == ckpt::DType::kBF16 ? "bfloat16" : "float16";
}

// The checkpoint's model, whose tensor table must be exactly the checkpoint's.
std::shared_ptr<const model::Model> model_of(const ckpt::CheckpointReader& reader) {
  const std::string where = reader.step_dir().string();
  std::shared_ptr<const model::Model> m = model::model_from_manifest(reader.manifest().model, where);
  if (!(reader.tensors() == m->table())) {
    fail(ErrorKind::kInvalidInput,
         where + ": its tensors do not fit its model (" + m->family() + ", " + m->name() + ")");
  }
  return m;
}

// A moment of the optimizer to export: its state index in the source, and its name.
struct Moment {
  int state;
  std::string name;
};

// The master weights of every tensor in `dtype`, then with_optimizer the moments as
// optimizer.<moment>.<name> in fp32.
std::vector<Item> export_items(const ckpt::TensorTable& table, int master, const std::vector<Moment>& moments,
                               ckpt::DType dtype, bool with_optimizer) {
  std::vector<Item> items;
  for (size_t t = 0; t < table.size(); ++t) items.push_back({static_cast<int>(t), master, table[t].name, dtype});
  if (with_optimizer) {
    for (const Moment& m : moments) {
      for (size_t t = 0; t < table.size(); ++t) {
        items.push_back({static_cast<int>(t), m.state, "optimizer." + m.name + "." + table[t].name, ckpt::DType::kF32});
      }
    }
  }
  return items;
}

// A shardkit checkpoint's: the states its manifest lists after the master weights (AdamW's two moments,
// or Lion's one).
std::vector<Item> export_items(const ckpt::CheckpointReader& reader, ckpt::DType dtype, bool with_optimizer) {
  const int master = reader.find_state(ckpt::kMasterWeights);
  if (master < 0) {
    fail(ErrorKind::kInvalidInput,
         reader.step_dir().string() + ": no '" + std::string(ckpt::kMasterWeights) + "' state");
  }
  std::vector<Moment> moments;
  for (const std::string& name : reader.manifest().states) {
    if (name != ckpt::kMasterWeights) moments.push_back({reader.find_state(name), name});
  }
  if (with_optimizer && moments.empty()) {
    fail(ErrorKind::kInvalidInput, reader.step_dir().string() + ": no optimizer moments to export (--with-optimizer)");
  }
  return export_items(reader.tensors(), master, moments, dtype, with_optimizer);
}

// Converts fp32 values into the output dtype's little-endian bytes.
std::span<const std::byte> encode(std::span<const float> values, ckpt::DType dtype, std::vector<uint16_t>& scratch) {
  if (dtype == ckpt::DType::kF32) return std::as_bytes(values);
  scratch.resize(values.size());
  if (dtype == ckpt::DType::kBF16) {
    ckpt::convert_fp32_to_bf16(values, scratch);
  } else {
    ckpt::convert_fp32_to_fp16(values, scratch);
  }
  return std::as_bytes(std::span<const uint16_t>(scratch));
}

// Safetensors out of any source: a shardkit checkpoint, or a DeepSpeed or DCP folder read in place (the
// replacement for DeepSpeed's zero_to_fp32 and PyTorch's dcp_to_torch_save, in bounded memory).
std::vector<std::string> write_safetensors(const ConsolidateRequest& request, const ConvertOptions& options,
                                           const std::filesystem::path& dir, const CheckpointSource& src) {
  const ckpt::TensorTable& table = *src.table;
  // A model of no family (an imported DeepSpeed checkpoint) exports under its module's own names, with
  // the Hugging Face config found beside its source when there was one.
  std::shared_ptr<const model::Model> m;
  if (!model::is_external(src.model)) {
    m = model::model_from_manifest(src.model, src.path.string());
    if (!(table == m->table())) {
      fail(ErrorKind::kInvalidInput,
           src.path.string() + ": its tensors do not fit its model (" + m->family() + ", " + m->name() + ")");
    }
  }
  if (request.with_optimizer && !holds_lion_states(src)) require_adamw_or_weights(src, "--with-optimizer");
  if (request.with_optimizer && !src.has_moments) {
    fail(ErrorKind::kInvalidInput, src.path.string() + ": no optimizer moments to export (--with-optimizer)");
  }
  // The source's states after the master weights, read by their position.
  std::vector<Moment> moments;
  for (size_t s = 1; s < src.states.size(); ++s) moments.push_back({static_cast<int>(s), src.states[s]});
  const std::vector<Item> items = export_items(table, kSourceFp32, moments, request.dtype, request.with_optimizer);
  std::vector<st::TensorSpec> specs;
  std::map<std::string, const Item*> by_name;
  for (const Item& item : items) {
    specs.push_back({item.name, dtype_string(item.dtype), table[static_cast<size_t>(item.tensor)].shape});
    by_name[item.name] = &item;
  }
  const std::vector<std::vector<st::TensorSpec>> shards = st::plan_shards(specs, request.max_shard_bytes);
  const StreamPlan plan = plan_stream(options, 64, src.chunk_elems);
  int64_t total = 0;
  for (const Item& item : items) total += table[static_cast<size_t>(item.tensor)].numel() * 4;
  SharedProgress progress(options.progress, total);
  std::vector<StateReadFn> readers(static_cast<size_t>(plan.threads));
  std::vector<std::vector<float>> pieces(static_cast<size_t>(plan.threads));
  std::vector<std::vector<uint16_t>> scratch(static_cast<size_t>(plan.threads));
  ThreadPool pool(plan.threads - 1);

  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;
  uint64_t total_size = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shards.size() == 1
                                 ? std::string(st::kSingleFileName)
                                 : st::shard_file_name(static_cast<int>(i + 1), static_cast<int>(shards.size()));
    st::Writer writer(dir / file, shards[i], {{std::string(st::kFormatKey), std::string(st::kFormatPyTorch)}});
    // Work: every tensor of the file, cut into pieces that bound the memory in flight.
    struct Task {
      const Item* item;
      int64_t offset;
      int64_t length;
    };
    std::vector<Task> tasks;
    for (const st::TensorSpec& spec : shards[i]) {
      const Item* item = by_name.at(spec.name);
      const int64_t n = table[static_cast<size_t>(item->tensor)].numel();
      for (int64_t off = 0; off < n; off += plan.piece_elems)
        tasks.push_back({item, off, std::min(plan.piece_elems, n - off)});
      weight_map[spec.name] = file;
      total_size += writer.tensor_bytes(spec.name);
    }
    pool.parallel_for(tasks.size(), [&](size_t k, int worker) {
      const Task& task = tasks[k];
      StateReadFn& read = readers[static_cast<size_t>(worker)];
      if (!read) read = src.reader();
      auto& piece = pieces[static_cast<size_t>(worker)];
      piece.resize(static_cast<size_t>(task.length));
      read(task.item->state, task.item->tensor, task.offset, piece);
      const std::span<const std::byte> bytes = encode(piece, task.item->dtype, scratch[static_cast<size_t>(worker)]);
      writer.write(task.item->name, static_cast<uint64_t>(task.offset) * (bytes.size() / piece.size()), bytes);
      progress.add(task.length * 4);
    });
    writer.finish();
    files.push_back(file);
  }
  if (shards.size() > 1) {
    write_file_durable(dir / st::kIndexFileName, st::index_json(total_size, weight_map));
    files.emplace_back(st::kIndexFileName);
  }
  nlohmann::json config = m ? m->hf_config(torch_dtype(request.dtype)) : src.model.value("hf_config", nlohmann::json());
  if (config.is_object()) {
    if (!m) config["torch_dtype"] = torch_dtype(request.dtype);
    write_file_durable(dir / "config.json", config.dump(2) + "\n");
    files.emplace_back("config.json");
  }
  progress.finish();
  return files;
}

std::vector<std::string> write_hdf5(const ConsolidateRequest& request, const ConvertOptions& options,
                                    const std::filesystem::path& dir, const std::filesystem::path& source) {
  if (request.dtype != ckpt::DType::kF32) {
    fail(ErrorKind::kInvalidInput, "--format hdf5 writes fp32 (HDF5 1.10 has no bf16/fp16 type); use safetensors");
  }
  ckpt::CheckpointReader reader(source);
  // Any tensor table exports; a model the registry knows is described as its Hugging Face config,
  // another as the manifest has it.
  std::string description = reader.manifest().model.dump();
  try {
    description = model_of(reader)->hf_config("float32").dump();
  } catch (const Error&) {
    // Not a model of a known family: the tensors still export, described by the manifest.
  }
  const std::vector<Item> items = export_items(reader, request.dtype, request.with_optimizer);
  const StreamPlan plan = plan_stream(options, 1, reader.manifest().chunk_elems);
  const std::filesystem::path path = dir / "model.h5";
  ckpt::Hdf5ArrayFile file(path);
  file.attribute("format", std::string("shardkit-consolidated"));
  file.attribute("model", description);
  file.attribute("step", reader.manifest().step);
  file.attribute("checkpoint_uid", reader.manifest().checkpoint_uid);
  int64_t total = 0;
  for (const Item& item : items) total += reader.tensors()[static_cast<size_t>(item.tensor)].numel() * 4;
  SharedProgress progress(options.progress, total);
  std::vector<float> piece;
  for (const Item& item : items) {
    const ckpt::TensorInfo& t = reader.tensors()[static_cast<size_t>(item.tensor)];
    // Datasets are written in slices along the first dimension (whole rows).
    file.create((item.name.rfind("optimizer.", 0) == 0 ? "/" : "/model/") + item.name, t.shape);
    const int64_t n = t.numel();
    if (n == 0) continue;
    const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    const int64_t row = n / rows;
    const int64_t rows_per_piece = std::max<int64_t>(1, plan.piece_elems / row);
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_piece) {
      const int64_t count = std::min(rows_per_piece, rows - r0);
      piece.resize(static_cast<size_t>(count * row));
      reader.read(item.tensor, item.state, r0 * row, piece);
      file.write_rows(r0, count, piece);
      progress.add(static_cast<int64_t>(piece.size()) * 4);
    }
  }
  file.close();
  fsync_path(path);
  progress.finish();
  return {"model.h5"};
}

}  // namespace

std::vector<std::string> consolidate(const ConsolidateRequest& request, const ConvertOptions& options) {
  if (request.format != ExportFormat::kSafetensors &&
      (is_deepspeed_checkpoint(request.source) || is_dcp_checkpoint(request.source))) {
    const bool dcp = is_dcp_checkpoint(request.source);
    fail(ErrorKind::kInvalidInput, request.source.string() + ": a " + (dcp ? "DCP" : "DeepSpeed") +
                                       " checkpoint consolidates to safetensors; for HDF5, import it first (convert " +
                                       (dcp ? "import-dcp)" : "import-deepspeed)"));
  }
  if (request.format == ExportFormat::kSafetensors) {
    const CheckpointSource src = open_checkpoint_source(request.source, request.model);
    StagedDirectory out(request.output, {request.source, src.path}, options.force);
    std::vector<std::string> files = write_safetensors(request, options, out.path(), src);
    out.commit();
    return files;
  }
  StagedDirectory out(request.output, {request.source, ckpt::resolve_checkpoint(request.source)}, options.force);
  std::vector<std::string> files;
  switch (request.format) {
    case ExportFormat::kSafetensors:
      break;
    case ExportFormat::kHdf5:
      files = write_hdf5(request, options, out.path(), request.source);
      break;
    case ExportFormat::kHdf5Virtual: {
      if (request.dtype != ckpt::DType::kF32) fail(ErrorKind::kInvalidInput, "--format hdf5-virtual presents fp32");
      ckpt::VirtualViewOptions view;
      view.states = {std::string(ckpt::kMasterWeights)};
      if (request.with_optimizer) view.states = {};
      ckpt::write_virtual_view(request.source, out.path() / "view.h5", view);
      files = {"view.h5"};
      break;
    }
  }
  out.commit();
  return files;
}

}  // namespace shardkit::convert
