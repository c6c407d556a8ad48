#include "model/hf_weights.hpp"

#include <set>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "ckpt/dtype_convert.hpp"
#include "model/registry.hpp"

namespace shardkit::model {
namespace {

// The folder the files of a Hugging Face folder must stay in: the folder itself, except for a snapshot
// of Hugging Face's download cache (`models--<org>--<name>/snapshots/<revision>/`), whose files are
// links into the repository's own `blobs/` folder: there, the repository folder.
std::filesystem::path containment_root(const std::filesystem::path& folder) {
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(folder, ec);
  if (ec) return folder;
  const std::filesystem::path snapshots = real.parent_path();
  const std::filesystem::path repository = snapshots.parent_path();
  if (snapshots.filename() == "snapshots" && repository.filename().string().starts_with("models--") &&
      std::filesystem::is_directory(repository / "blobs", ec)) {
    return repository;
  }
  return folder;
}

// The safetensors files of `path`: the file itself, or a folder's model.safetensors, or the shards its
// index names (each a plain file name in the folder). What the user named may be a link; what lies in
// the folder may not lead out of it (require_within_folder; a download cache's snapshot, out of its
// repository folder).
std::vector<std::filesystem::path> weight_files(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return {path};
  if (!std::filesystem::is_directory(path, ec))
    fail(ErrorKind::kInvalidInput, path.string() + ": no such file or folder");
  const std::filesystem::path root = containment_root(path);
  const auto inside = [&](std::filesystem::path file) {
    require_within_folder(root, file);
    return file;
  };
  const std::filesystem::path index = path / ckpt::safetensors::kIndexFileName;
  if (std::filesystem::exists(index, ec)) {
    require_within_folder(root, index);
    const nlohmann::json j = read_json_file(index, json_limits::kHfIndex, ErrorKind::kInvalidInput);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      fail(ErrorKind::kInvalidInput, index.string() + ": no \"weight_map\" object");
    }
    std::set<std::string> names;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string() || !ckpt::is_plain_name(file.get<std::string>())) {
        fail(ErrorKind::kInvalidInput,
             index.string() + ": weight_map entry for " + quoted_excerpt(tensor) + " is not a plain file name");
      }
      names.insert(file.get<std::string>());
    }
    std::vector<std::filesystem::path> files;
    for (const std::string& n : names) files.push_back(inside(path / n));
    return files;
  }
  if (std::filesystem::exists(path / ckpt::safetensors::kSingleFileName, ec))
    return {inside(path / ckpt::safetensors::kSingleFileName)};
  fail(ErrorKind::kInvalidInput, path.string() + ": holds neither model.safetensors nor model.safetensors.index.json");
}

std::filesystem::path config_file(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path folder = std::filesystem::is_directory(path, ec) ? path : path.parent_path();
  const std::filesystem::path file = (folder.empty() ? std::filesystem::path(".") : folder) / "config.json";
  if (!std::filesystem::exists(file, ec)) {
    fail(ErrorKind::kInvalidInput, file.string() + ": missing (the model's config.json must accompany the weights)");
  }
  require_within_folder(containment_root(file.parent_path()), file);
  return file;
}

}  // namespace

bool is_hf_weights(const std::filesystem::path& path) {
  return std::filesystem::is_directory(path) ? std::filesystem::exists(path / "config.json")
                                             : path.extension() == ".safetensors";
}

HfWeights::HfWeights(const std::filesystem::path& path) : path_(path) {
  const std::filesystem::path cfg = config_file(path);
  model_ = model_from_hf_config(read_json_file(cfg, json_limits::kHfConfig, ErrorKind::kInvalidInput), cfg.string());
  const ckpt::TensorTable& table = model_->table();
  sources_.resize(table.size());
  for (const std::filesystem::path& file : weight_files(path)) {
    files_.push_back(std::make_unique<ckpt::safetensors::Reader>(file));
    const ckpt::safetensors::Reader& reader = *files_.back();
    for (const auto& info : reader.header().tensors) {
      const std::string where = file.string() + ": tensor " + quoted_excerpt(info.name);
      const auto kind = model_->classify_hf_name(info.name);
      // Skipped: a tied output projection (a copy of the embedding), buffers, and exported Adam moments
      // (an import starts with zeroed moments).
      if (kind && kind->kind != HfName::kParameter) continue;
      const int t = kind ? table.find(kind->name) : -1;
      if (t < 0) {
        fail(ErrorKind::kInvalidInput, where + " is no tensor of " + model_->family() + " (" + cfg.string() + ")");
      }
      if (info.shape != table[static_cast<size_t>(t)].shape) {
        fail(ErrorKind::kInvalidInput, where + " has the wrong shape for the configuration in " + cfg.string());
      }
      if (info.dtype != "F32" && info.dtype != "BF16" && info.dtype != "F16") {
        fail(ErrorKind::kInvalidInput, where + " has dtype " + info.dtype + " (expected F32, BF16 or F16)");
      }
      if (sources_[static_cast<size_t>(t)].info) fail(ErrorKind::kInvalidInput, where + " appears twice");
      sources_[static_cast<size_t>(t)] = {&reader, &info};
    }
  }
  for (size_t t = 0; t < table.size(); ++t) {
    if (!sources_[t].info) fail(ErrorKind::kInvalidInput, path.string() + ": tensor " + table[t].name + " is missing");
  }
}

HfWeights::~HfWeights() = default;

void HfWeights::read(int tensor, int64_t offset, std::span<float> out) const {
  const Source& s = sources_[static_cast<size_t>(tensor)];
  const uint64_t width = s.info->dtype == "F32" ? 4 : 2;
  if (width == 4) {
    s.file->read(*s.info, static_cast<uint64_t>(offset) * 4, std::as_writable_bytes(out));
    return;
  }
  std::vector<uint16_t> half(out.size());
  s.file->read(*s.info, static_cast<uint64_t>(offset) * 2, std::as_writable_bytes(std::span<uint16_t>(half)));
  if (s.info->dtype == "BF16") {
    ckpt::convert_bf16_to_fp32(half, out);
  } else {
    ckpt::convert_fp16_to_fp32(half, out);
  }
}

}  // namespace shardkit::model
