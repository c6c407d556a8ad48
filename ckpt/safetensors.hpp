// safetensors files (Hugging Face's tensor container), read and written as the reference implementation
// does: an 8-byte little-endian header length N, N bytes of JSON header, then the
// tensors' bytes packed back to back to the end of the file. Also Hugging Face's rules for splitting a
// model into several such files and the index that names them.
//
// Both the reader and the writer work on byte ranges with pread/pwrite, so several threads can fill or
// drain one file at once and nothing is mapped or held in memory whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/file_util.hpp"

namespace shardkit::ckpt::safetensors {

// The reference reader refuses larger headers; so do we, before reading them.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Bounds of our own on what a header may declare (the reference has none; real models are far below).
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr size_t kMaxRank = 64;

// Hugging Face's file names: a model in one file, or the index of a model split over several.
inline constexpr std::string_view kSingleFileName = "model.safetensors";
inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
// The metadata Hugging Face loaders expect ("format" must be "pt", "tf", "flax" or "mlx").
inline constexpr std::string_view kFormatKey = "format";
inline constexpr std::string_view kFormatPyTorch = "pt";

// One tensor of a header. `begin`/`end` are byte offsets relative to the data buffer (the first byte after
// the header), `end` one past the last byte.
struct TensorInfo {
  std::string name;
  std::string dtype;           // a safetensors dtype string: "F32", "BF16", ...
  std::vector<int64_t> shape;  // empty = 0-dim scalar (1 element); a zero dimension = no elements
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t size() const noexcept { return end - begin; }
};

struct Header {
  std::map<std::string, std::string> metadata;  // "__metadata__" (string -> string only)
  std::vector<TensorInfo> tensors;              // sorted by begin
  uint64_t data_start = 0;                      // 8 + header length: file offset of the data buffer
  // Name -> position in `tensors`, filled by parse_header. find() scans `tensors` when it is empty or
  // disagrees, so a Header assembled by hand still works.
  std::map<std::string, size_t, std::less<>> index;

  // The tensor called `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  // Bytes of the data buffer (the end of the last tensor).
  uint64_t data_size() const noexcept { return tensors.empty() ? 0 : tensors.back().end; }
};

// Parses and validates a header (the N bytes of JSON text) of a file of `file_size` bytes, as the
// reference reader does and a little stricter:
//   * a JSON object (leading and trailing JSON whitespace allowed; the writer pads with spaces);
//   * "__metadata__", when present: an object of string values;
//   * every other key a tensor object with exactly the fields dtype (a known dtype string), shape (at most
//     kMaxRank non-negative integers) and data_offsets ([begin, end]); end - begin must equal
//     numel * dtype bits / 8, a whole number of bytes, with every product checked for overflow;
//   * sorted by offsets, the tensors tile [0, data_size) with no hole and no overlap, and
//     8 + N + data_size == file_size (no trailing bytes);
//   * tensor names non-empty, at most kMaxTensorNameBytes bytes, without NUL; no key, at any level, twice.
// Callers check the names further where they mean something (GPT-2 names). Throws Error(kCorrupt) whose
// message starts with `where` (the file) and names the tensor at fault.
Header parse_header(std::string_view json_text, uint64_t file_size, const std::string& where);

// Bits per element of a safetensors dtype, 0 for an unknown one. Knows every dtype the format defines:
// BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16,
// BF16, I32, U32, F32, C64, F64, I64, U64.
size_t dtype_bits(std::string_view dtype);

// A tensor to write: its bytes are numel * dtype bits / 8.
struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// Bytes of a tensor's data. Throws Error(kInvalidInput) naming the tensor for an unknown dtype, a
// negative dimension, a rank above kMaxRank, an overflowing size or a size that is not whole bytes.
uint64_t tensor_bytes(const TensorSpec& spec);

// A safetensors file opened for reading; the header is read and validated on construction.
class Reader {
 public:
  // Reads the 8-byte length and the header (refusing one above kMaxHeaderBytes before reading it) and
  // validates it against the file size. Error(kInvalidInput) for a missing file, Error(kCorrupt) for a
  // file that is not a valid safetensors file, Error(kIo) for a failed read.
  explicit Reader(const std::filesystem::path& path);

  const Header& header() const noexcept { return header_; }
  const std::filesystem::path& path() const noexcept { return fd_.path(); }

  // Reads bytes [offset, offset + out.size()) of `tensor`'s data into `out`. Safe to call from several
  // threads at once (pread). `tensor` must come from header(); a range outside it is Error(kInternal).
  void read(const TensorInfo& tensor, uint64_t offset, std::span<std::byte> out) const;

 private:
  FileDescriptor fd_;
  Header header_;
  uint64_t file_size_ = 0;
};

// Writes a safetensors file whose layout is fixed up front, so that tensors' bytes can be written in any
// order, by several threads, straight to their place in the file.
class Writer {
 public:
  // Lays the tensors out as the reference writer does: by dtype descending in the reference's dtype order
  // (which is by alignment: 8-byte types first), then by name, byte-wise. Builds the header (compact JSON:
  // "__metadata__" first when `metadata` is not empty, then the tensors in offset order, padded with spaces
  // so that 8 + N is a multiple of 8), creates or truncates `path` and sizes it.
  // The header itself is written by finish(), after the data is on disk: until then the file begins with
  // a zero header length and no reader takes it for a complete file.
  // Error(kInvalidInput) for an invalid spec (bad or duplicate name, unknown dtype, bad shape, metadata
  // that is not UTF-8, a header above kMaxHeaderBytes); Error(kIo) when the file cannot be created.
  Writer(const std::filesystem::path& path, std::vector<TensorSpec> tensors,
         std::map<std::string, std::string> metadata);

  // File offset where `name`'s data begins; Error(kInternal) for an unknown name.
  uint64_t data_offset(std::string_view name) const;
  // Bytes of `name`'s data; Error(kInternal) for an unknown name.
  uint64_t tensor_bytes(std::string_view name) const;
  // The tensors in file order, with offsets relative to the data buffer.
  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  // The padded header JSON (N bytes) that finish() writes after the 8-byte length.
  const std::string& header_text() const noexcept { return header_text_; }

  // Writes `bytes` at `offset` within `name`'s data (pwrite): callable from several threads at once, for
  // disjoint ranges. Error(kInternal) for an unknown name, a range outside the tensor or a finished
  // writer; Error(kIo) when the write fails.
  void write(std::string_view name, uint64_t offset, std::span<const std::byte> bytes);

  // Flushes the data (fsync), writes the 8-byte length and the header, fsyncs and closes the file and
  // fsyncs its directory. The file is complete only after this; a second call does nothing.
  void finish();

  uint64_t file_size() const noexcept { return file_size_; }
  const std::filesystem::path& path() const noexcept { return fd_.path(); }

 private:
  const TensorInfo& lookup(std::string_view name) const;

  FileDescriptor fd_;
  std::vector<TensorInfo> tensors_;  // in file order
  std::map<std::string, size_t, std::less<>> index_;
  std::string header_text_;
  uint64_t data_start_ = 0;
  uint64_t file_size_ = 0;
  bool finished_ = false;
};

// Hugging Face's split of a model into shards (huggingface_hub split_state_dict_into_shards_factory):
// tensors are taken in the given order; one larger than `max_bytes` becomes a shard of its own at once
// (so it is listed before the shard being filled); otherwise the shard being filled is closed when
// adding the tensor would take it past `max_bytes`. Tensor order is kept within each shard. An empty
// input gives no shard. Error(kInvalidInput) as tensor_bytes() for an invalid spec.
std::vector<std::vector<TensorSpec>> plan_shards(const std::vector<TensorSpec>& tensors, uint64_t max_bytes);

// "model-00001-of-00003.safetensors" for index 1 of 3 (1-based; five digits at least). Error(kInternal)
// unless 1 <= index <= count.
std::string shard_file_name(int index, int count);

// The index file's text: {"metadata": {"total_size": N}, "weight_map": {name: file}}, serialized as
// Python's json.dumps(obj, indent=2, sort_keys=True) + "\n" (what transformers writes): keys sorted,
// non-ASCII escaped as \uXXXX. Error(kInvalidInput) for a name or file that is not UTF-8.
std::string index_json(uint64_t total_size, const std::map<std::string, std::string>& weight_map);

}  // namespace shardkit::ckpt::safetensors
