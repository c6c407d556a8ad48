#include "ckpt/tensor_table.hpp"

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/json_input.hpp"

namespace shardkit::ckpt {

std::string_view dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) noexcept {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  return std::nullopt;
}

int64_t TensorInfo::numel() const noexcept {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool is_plain_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > kMaxTensorNameLength || name.front() == '.' || name.front() == '-') return false;
  if (name.find("..") != std::string_view::npos) return false;
  for (char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

TensorTable::TensorTable(std::vector<TensorInfo> tensors) : tensors_(std::move(tensors)) {
  if (tensors_.size() > kMaxTensors) {
    fail(ErrorKind::kInvalidInput, "tensor table has " + std::to_string(tensors_.size()) + " tensors (at most " +
                                       std::to_string(kMaxTensors) + " supported)");
  }
  index_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    if (!is_plain_name(t.name)) {
      fail(ErrorKind::kInvalidInput, "tensor name " + quoted_excerpt(t.name) +
                                         " is not a plain name (expected 1-512 characters of [A-Za-z0-9_.-], no '..')");
    }
    if (t.shape.size() > kMaxTensorRank) {
      fail(ErrorKind::kInvalidInput, "tensor " + t.name + " has " + std::to_string(t.shape.size()) +
                                         " dimensions (at most " + std::to_string(kMaxTensorRank) + ")");
    }
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || d > kMaxTensorElements || (d > 0 && n > kMaxTensorElements / d)) {
        fail(ErrorKind::kInvalidInput, "tensor " + t.name + " has an invalid or too large shape");
      }
      n *= d;
    }
    if (total_elements_ > kMaxTensorElements - n) {
      fail(ErrorKind::kInvalidInput, "tensor table holds more than 2^48 elements");
    }
    total_elements_ += n;
    if (!index_.emplace(t.name, static_cast<int>(i)).second) {
      fail(ErrorKind::kInvalidInput, "tensor name " + t.name + " appears twice in the tensor table");
    }
  }
}

int TensorTable::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? -1 : it->second;
}

bool TensorTable::operator==(const TensorTable& other) const {
  if (tensors_.size() != other.tensors_.size()) return false;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& a = tensors_[i];
    const TensorInfo& b = other.tensors_[i];
    if (a.name != b.name || a.shape != b.shape || a.dtype != b.dtype) return false;
  }
  return true;
}

nlohmann::json tensor_table_to_json(const TensorTable& table) {
  nlohmann::json out = nlohmann::json::array();
  for (const TensorInfo& t : table) {
    out.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", std::string(dtype_name(t.dtype))}});
  }
  return out;
}

TensorTable tensor_table_from_json(const nlohmann::json& j, const std::string& where) {
  auto bad = [&](const std::string& what) { fail(ErrorKind::kCorrupt, where + ": tensor table: " + what); };
  if (!j.is_array()) bad("expected an array");
  if (j.size() > kMaxTensors) bad("too many tensors");
  std::vector<TensorInfo> tensors;
  tensors.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    const std::string entry = "entry " + std::to_string(i);
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array() || !e.contains("dtype") || !e["dtype"].is_string()) {
      bad(entry + " needs string 'name', array 'shape' and string 'dtype'");
    }
    TensorInfo t;
    t.name = e["name"].get<std::string>();
    if (e["shape"].size() > kMaxTensorRank) bad(entry + " has too many dimensions");
    for (const auto& d : e["shape"]) {
      t.shape.push_back(
          checked_integer(d, where + ": tensor table", entry + " dimension", 0, INT64_MAX, ErrorKind::kCorrupt));
    }
    auto dtype = parse_dtype(e["dtype"].get<std::string>());
    if (!dtype) bad(entry + " has unknown dtype " + quoted_excerpt(e["dtype"].get<std::string>()));
    t.dtype = *dtype;
    tensors.push_back(std::move(t));
  }
  try {
    return TensorTable(std::move(tensors));
  } catch (const Error& e) {
    fail(ErrorKind::kCorrupt, where + ": tensor table: " + e.what());
  }
}

}  // namespace shardkit::ckpt
