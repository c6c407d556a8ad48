// The tensor table: the ordered list of (name, shape, dtype) that a model trains and a checkpoint
// stores. Its order is the flat-buffer order of ZeRO stages 0-2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardkit::ckpt {

// Element type of a tensor in the training model. The checkpoint always stores fp32 master weights and
// fp32 optimizer states; the dtype records what the model computes in (it guides exports).
enum class DType { kF32, kF16, kBF16 };

std::string_view dtype_name(DType dtype) noexcept;  // "f32", "f16", "bf16"
std::optional<DType> parse_dtype(std::string_view name) noexcept;

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // empty = scalar (1 element); a zero dimension = empty tensor
  DType dtype = DType::kF32;

  int64_t numel() const noexcept;
};

// Limits that keep a hostile manifest from exhausting memory or overflowing arithmetic.
inline constexpr size_t kMaxTensors = 1'000'000;
inline constexpr size_t kMaxTensorRank = 8;
inline constexpr size_t kMaxTensorNameLength = 512;
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 48;

// True when `name` is a plain tensor name: 1..512 characters of [A-Za-z0-9_.-], not starting with '.'
// and without "..", so it can never be read as a path or an option.
bool is_plain_name(std::string_view name) noexcept;

class TensorTable {
 public:
  TensorTable() = default;
  // Validates names (plain, unique), shapes (non-negative, bounded product) and count.
  // Throws Error(kInvalidInput) naming the offending tensor.
  explicit TensorTable(std::vector<TensorInfo> tensors);

  size_t size() const noexcept { return tensors_.size(); }
  const TensorInfo& operator[](size_t i) const { return tensors_[i]; }
  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  auto begin() const noexcept { return tensors_.begin(); }
  auto end() const noexcept { return tensors_.end(); }

  // Index of the tensor with this name, or -1.
  int find(std::string_view name) const;
  // Sum of numel over all tensors.
  int64_t total_elements() const noexcept { return total_elements_; }

  bool operator==(const TensorTable& other) const;

 private:
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, int> index_;
  int64_t total_elements_ = 0;
};

// JSON form: [{"name": ..., "shape": [...], "dtype": "f32"}, ...]. from_json validates types and
// bounds and throws Error(kCorrupt) with `where` (a file name) in the message.
nlohmann::json tensor_table_to_json(const TensorTable& table);
TensorTable tensor_table_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace shardkit::ckpt
