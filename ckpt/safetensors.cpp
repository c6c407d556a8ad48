#include "ckpt/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/json_input.hpp"

namespace shardkit::ckpt::safetensors {
namespace {

using nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr uint64_t kMaxFileOffset = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());  // off_t

struct DtypeEntry {
  std::string_view name;
  size_t bits;
};

// Every dtype of the reference implementation, in the order of its Dtype enum. The reference writer sorts
// tensors by that order, descending, so a tensor's position here is its sort key as well.
constexpr std::array<DtypeEntry, 22> kDtypes = {{
    {"BOOL", 8},    {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6},     {"U8", 8},          {"I8", 8},
    {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
    {"U16", 16},    {"F16", 16},    {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
    {"C64", 64},    {"F64", 64},    {"I64", 64},    {"U64", 64},
}};

// Position of `dtype` in kDtypes, or -1.
int dtype_order(std::string_view dtype) {
  for (size_t i = 0; i < kDtypes.size(); ++i) {
    if (kDtypes[i].name == dtype) return static_cast<int>(i);
  }
  return -1;
}

// Why `name` cannot be a tensor name, or an empty string when it can.
std::string name_problem(std::string_view name) {
  if (name.empty()) return "empty tensor name";
  if (name.size() > kMaxTensorNameBytes) {
    return "tensor name of " + std::to_string(name.size()) + " bytes (at most " + std::to_string(kMaxTensorNameBytes) +
           ")";
  }
  if (name.find('\0') != std::string_view::npos) return "tensor name " + quoted_excerpt(name) + " contains a NUL byte";
  return {};
}

// Bytes of a tensor, or why it has no valid size. Shared by the reader (kCorrupt) and the writer
// (kInvalidInput) so that both accept exactly the same tensors.
struct ByteSize {
  uint64_t bytes = 0;
  std::string problem;  // empty when valid
};

ByteSize byte_size(std::string_view dtype, const std::vector<int64_t>& shape) {
  const size_t bits = dtype_bits(dtype);
  if (bits == 0) return {0, "unknown dtype " + quoted_excerpt(dtype)};
  if (shape.size() > kMaxRank) {
    return {0, "rank " + std::to_string(shape.size()) + " above the limit of " + std::to_string(kMaxRank)};
  }
  uint64_t numel = 1;
  for (const int64_t dim : shape) {
    if (dim < 0) return {0, "negative dimension " + std::to_string(dim)};
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel)) {
      return {0, "shape has more elements than 64 bits can count"};
    }
  }
  uint64_t total_bits = 0;
  if (__builtin_mul_overflow(numel, uint64_t{bits}, &total_bits)) {
    return {0, "size in bits (" + std::to_string(numel) + " elements) overflows 64 bits"};
  }
  // Sub-byte dtypes pack elements; the reference refuses a tensor that ends inside a byte.
  if (total_bits % 8 != 0) {
    return {0,
            std::to_string(numel) + " elements of " + std::to_string(bits) + " bits are not a whole number of bytes"};
  }
  return {total_bits / 8, {}};
}

// ---------------------------------------------------------------------------------------------------
// Header parsing: a SAX handler that checks the structure while the JSON streams past, so that a
// hostile header can neither nest deeply, nor hide a duplicate key (nlohmann's DOM keeps the last one
// silently), nor build a document much larger than its text.

class HeaderSax {
 public:
  Header header;
  std::string problem;  // why a handler stopped the parse; empty for a JSON syntax error

  bool null() { return unexpected("null"); }
  bool boolean(bool) { return unexpected("a boolean"); }
  bool number_integer(json::number_integer_t value) {
    // nlohmann reports non-negative integers through number_unsigned: this one is negative, or "-0",
    // which serde_json (the reference) reads as a float and refuses as well.
    const std::string text = value == 0 ? "-0" : std::to_string(value);
    if (state_ == State::kShape) return stop(tensor_prefix() + "negative dimension " + text);
    if (state_ == State::kOffsets) return stop(tensor_prefix() + "negative data offset " + text);
    return unexpected("a number");
  }
  bool number_unsigned(json::number_unsigned_t value) {
    if (state_ == State::kShape) {
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return stop(tensor_prefix() + "dimension " + std::to_string(value) + " is too large");
      }
      if (tensor_.info.shape.size() == kMaxRank) {
        return stop(tensor_prefix() + "shape has more than " + std::to_string(kMaxRank) + " dimensions");
      }
      tensor_.info.shape.push_back(static_cast<int64_t>(value));
      return true;
    }
    if (state_ == State::kOffsets) {
      if (tensor_.offsets.size() == 2) return stop(tensor_prefix() + "data_offsets has more than 2 entries");
      tensor_.offsets.push_back(value);
      return true;
    }
    return unexpected("a number");
  }
  // Integers beyond 64 bits also arrive here.
  bool number_float(json::number_float_t, const json::string_t&) { return unexpected("a non-integer number"); }
  bool binary(json::binary_t&) { return unexpected("binary data"); }

  bool string(json::string_t& value) {
    if (state_ == State::kMetadata) {
      header.metadata.emplace(key_, std::move(value));
      return true;
    }
    if (state_ == State::kTensor && field_ == Field::kDtype) {
      tensor_.info.dtype = std::move(value);
      return true;
    }
    return unexpected("a string");
  }

  bool start_object(std::size_t) {
    switch (state_) {
      case State::kStart:
        state_ = State::kTop;
        return true;
      case State::kTop:
        if (key_ == kMetadataKey) {
          state_ = State::kMetadata;
        } else {
          state_ = State::kTensor;
          tensor_ = PendingTensor{};
          tensor_.info.name = key_;
        }
        return true;
      default:
        return unexpected("an object");
    }
  }

  bool key(json::string_t& key) {
    switch (state_) {
      case State::kTop:
        if (key == kMetadataKey) {
          if (seen_metadata_) return stop("__metadata__ appears twice");
          seen_metadata_ = true;
        } else if (std::string why = name_problem(key); !why.empty()) {
          return stop(why);
        }
        // Duplicate tensor names are caught when the index is built, once all names are known.
        key_ = std::move(key);
        return true;
      case State::kMetadata:
        if (header.metadata.count(key) != 0) return stop("__metadata__ key " + quoted_excerpt(key) + " appears twice");
        key_ = std::move(key);
        return true;
      case State::kTensor:
        return tensor_field(key);
      default:
        return stop("unexpected key " + quoted_excerpt(key));  // not reachable: keys only occur inside objects
    }
  }

  bool end_object() {
    switch (state_) {
      case State::kTop:
        state_ = State::kDone;
        return true;
      case State::kMetadata:
        state_ = State::kTop;
        return true;
      case State::kTensor:
        return finish_tensor();
      default:
        return stop("unbalanced object");  // not reachable: the lexer balances brackets
    }
  }

  bool start_array(std::size_t) {
    if (state_ == State::kTensor && field_ == Field::kShape) {
      state_ = State::kShape;
      return true;
    }
    if (state_ == State::kTensor && field_ == Field::kOffsets) {
      state_ = State::kOffsets;
      return true;
    }
    return unexpected("an array");
  }

  bool end_array() {
    if (state_ == State::kOffsets && tensor_.offsets.size() != 2) {
      return stop(tensor_prefix() + "data_offsets has " + std::to_string(tensor_.offsets.size()) +
                  " entries, expected [begin, end]");
    }
    state_ = State::kTensor;  // only kShape and kOffsets hold arrays
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    // nlohmann's own message quotes the input; ours stays one line whatever the bytes are.
    problem = "header is not valid JSON (syntax error at byte " + std::to_string(position) + ")";
    return false;
  }

 private:
  enum class State { kStart, kTop, kMetadata, kTensor, kShape, kOffsets, kDone };
  enum class Field { kNone, kDtype, kShape, kOffsets };

  struct PendingTensor {
    TensorInfo info;
    std::vector<uint64_t> offsets;
    bool has_dtype = false;
    bool has_shape = false;
    bool has_offsets = false;
  };

  bool stop(std::string why) {
    problem = std::move(why);
    return false;
  }

  std::string tensor_prefix() const { return "tensor " + quoted_excerpt(tensor_.info.name) + ": "; }

  // The schema allows exactly three fields, each once.
  bool tensor_field(const std::string& key) {
    bool* seen = nullptr;
    if (key == "dtype") {
      field_ = Field::kDtype;
      seen = &tensor_.has_dtype;
    } else if (key == "shape") {
      field_ = Field::kShape;
      seen = &tensor_.has_shape;
    } else if (key == "data_offsets") {
      field_ = Field::kOffsets;
      seen = &tensor_.has_offsets;
    } else {
      return stop(tensor_prefix() + "unknown field " + quoted_excerpt(key) + " (expected dtype, shape, data_offsets)");
    }
    if (*seen) return stop(tensor_prefix() + "field " + key + " appears twice");
    *seen = true;
    return true;
  }

  bool finish_tensor() {
    if (!tensor_.has_dtype || !tensor_.has_shape || !tensor_.has_offsets) {
      const char* missing = !tensor_.has_dtype ? "dtype" : !tensor_.has_shape ? "shape" : "data_offsets";
      return stop(tensor_prefix() + "field " + missing + " is missing");
    }
    tensor_.info.begin = tensor_.offsets[0];
    tensor_.info.end = tensor_.offsets[1];
    header.tensors.push_back(std::move(tensor_.info));
    field_ = Field::kNone;
    state_ = State::kTop;
    return true;
  }

  // A value of the wrong kind (`what`) where the state expects something else.
  bool unexpected(const std::string& what) {
    switch (state_) {
      case State::kStart:
        return stop("header is " + what + ", not a JSON object");
      case State::kTop:
        if (key_ == kMetadataKey) return stop("__metadata__ is " + what + ", not an object");
        return stop("tensor " + quoted_excerpt(key_) + " is " + what + ", not an object");
      case State::kMetadata:
        return stop("__metadata__ value of " + quoted_excerpt(key_) + " is " + what + ", not a string");
      case State::kTensor: {
        const char* expected = field_ == Field::kDtype   ? "dtype is "
                               : field_ == Field::kShape ? "shape is "
                                                         : "data_offsets is ";
        return stop(tensor_prefix() + expected + what +
                    (field_ == Field::kDtype ? ", not a string" : ", not an array"));
      }
      case State::kShape:
        return stop(tensor_prefix() + "shape holds " + what + ", not a non-negative integer");
      case State::kOffsets:
        return stop(tensor_prefix() + "data_offsets holds " + what + ", not a non-negative integer");
      case State::kDone:
        break;
    }
    return stop("unexpected " + what + " after the header object");
  }

  State state_ = State::kStart;
  Field field_ = Field::kNone;
  std::string key_;  // the current key of the top-level or metadata object
  bool seen_metadata_ = false;
  PendingTensor tensor_;
};

// Per-tensor checks, the tiling of the data buffer, and the match with the file size, for tensors
// sorted by offsets.
void validate_layout(const Header& header, uint64_t file_size, const std::string& where) {
  uint64_t expected_begin = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : header.tensors) {
    const std::string prefix = where + ": tensor " + quoted_excerpt(t.name) + ": ";
    const ByteSize size = byte_size(t.dtype, t.shape);
    if (!size.problem.empty()) fail(ErrorKind::kCorrupt, prefix + size.problem);
    if (t.end < t.begin) {
      fail(ErrorKind::kCorrupt, prefix + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                    "] end before they begin");
    }
    if (t.end - t.begin != size.bytes) {
      fail(ErrorKind::kCorrupt, prefix + "data_offsets span " + std::to_string(t.end - t.begin) + " bytes, but dtype " +
                                    t.dtype + " and its shape need " + std::to_string(size.bytes));
    }
    if (t.begin > expected_begin) {
      fail(ErrorKind::kCorrupt, prefix + "begins at data byte " + std::to_string(t.begin) + ", leaving bytes [" +
                                    std::to_string(expected_begin) + ", " + std::to_string(t.begin) +
                                    ") to no tensor (a hole)");
    }
    if (t.begin < expected_begin) {
      fail(ErrorKind::kCorrupt, prefix + "begins at data byte " + std::to_string(t.begin) + ", inside tensor " +
                                    quoted_excerpt(previous->name) + " which ends at " +
                                    std::to_string(expected_begin) + " (overlap)");
    }
    expected_begin = t.end;
    previous = &t;
  }
  // data_start <= file_size was checked by the caller, so the subtraction cannot wrap.
  if (expected_begin != file_size - header.data_start) {
    fail(ErrorKind::kCorrupt,
         where + ": the tensors' data ends at file byte " + std::to_string(header.data_start) + " + " +
             std::to_string(expected_begin) + " but the file has " + std::to_string(file_size) + " bytes" +
             (expected_begin < file_size - header.data_start ? " (trailing bytes)" : " (truncated)"));
  }
}

uint64_t decode_le64(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

void encode_le64(uint64_t value, unsigned char* bytes) {
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(value >> (8 * i));
}

// pwrite(2) of all of `size` bytes at `offset`.
void pwrite_all(const FileDescriptor& fd, const void* data, size_t size, uint64_t offset) {
  const auto* in = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd.get(), in + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(fd.path().string() + ": write at offset " + std::to_string(offset + done), errno);
    }
    if (n == 0) fail_errno(fd.path().string() + ": write at offset " + std::to_string(offset + done), EIO);
    done += static_cast<size_t>(n);
  }
}

// A JSON string literal as serde_json (the reference) and nlohmann both write it: only '"', '\\' and
// control characters escaped, UTF-8 kept. Error(kInvalidInput) for text that is not UTF-8.
std::string json_string(const std::string& text, const std::string& what) {
  try {
    return json(text).dump();
  } catch (const json::exception&) {
    fail(ErrorKind::kInvalidInput, what + " is not valid UTF-8: " + quoted_excerpt(text));
  }
}

std::string compact_header(const std::vector<TensorInfo>& tensors, const std::map<std::string, std::string>& metadata,
                           const std::string& where) {
  std::string out = "{";
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) out += ',';
      first = false;
      out += json_string(key, where + ": metadata key");
      out += ':';
      out += json_string(value, where + ": metadata value of " + quoted_excerpt(key));
    }
    out += '}';
  }
  for (const TensorInfo& t : tensors) {
    if (out.size() > 1) out += ',';
    out += json_string(t.name, where + ": tensor name");
    out += ":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string(t.shape[i]);
    }
    out += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  out += '}';
  // Spaces (valid JSON whitespace) so that the data buffer starts 8-byte aligned in the file.
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

}  // namespace

size_t dtype_bits(std::string_view dtype) {
  const int order = dtype_order(dtype);
  return order < 0 ? 0 : kDtypes[static_cast<size_t>(order)].bits;
}

uint64_t tensor_bytes(const TensorSpec& spec) {
  const ByteSize size = byte_size(spec.dtype, spec.shape);
  if (!size.problem.empty())
    fail(ErrorKind::kInvalidInput, "tensor " + quoted_excerpt(spec.name) + ": " + size.problem);
  return size.bytes;
}

const TensorInfo* Header::find(std::string_view name) const {
  if (auto it = index.find(name);
      it != index.end() && it->second < tensors.size() && tensors[it->second].name == name) {
    return &tensors[it->second];
  }
  for (const TensorInfo& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Header parse_header(std::string_view json_text, uint64_t file_size, const std::string& where) {
  if (json_text.size() > kMaxHeaderBytes) {
    fail(ErrorKind::kCorrupt, where + ": header of " + std::to_string(json_text.size()) +
                                  " bytes exceeds the limit of " + std::to_string(kMaxHeaderBytes));
  }
  const uint64_t data_start = 8 + uint64_t{json_text.size()};
  if (data_start > file_size) {
    fail(ErrorKind::kCorrupt, where + ": header of " + std::to_string(json_text.size()) +
                                  " bytes does not fit in a file of " + std::to_string(file_size) + " bytes");
  }
  // nlohmann's lexer takes a NUL byte for the end of the input, so "{}\0junk" would pass; JSON allows no
  // raw NUL anywhere (the reference rejects it), so refuse it before parsing.
  if (const size_t nul = json_text.find('\0'); nul != std::string_view::npos) {
    fail(ErrorKind::kCorrupt, where + ": header is not valid JSON (NUL byte at byte " + std::to_string(nul) + ")");
  }
  // nlohmann skips a UTF-8 byte-order mark, which JSON text (and the reference) does not allow.
  if (json_text.starts_with("\xef\xbb\xbf")) {
    fail(ErrorKind::kCorrupt, where + ": header starts with a byte-order mark");
  }
  HeaderSax sax;
  const bool ok = json::sax_parse(json_text.begin(), json_text.end(), &sax);
  if (!ok) fail(ErrorKind::kCorrupt, where + ": " + (sax.problem.empty() ? "header is not valid JSON" : sax.problem));
  Header header = std::move(sax.header);
  header.data_start = data_start;
  // The reference sorts by (begin, end); the name breaks the remaining ties so errors are deterministic.
  std::sort(header.tensors.begin(), header.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // Duplicates first: a repeated name would otherwise be reported as an overlap or a size mismatch.
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    if (!header.index.emplace(header.tensors[i].name, i).second) {
      fail(ErrorKind::kCorrupt, where + ": tensor " + quoted_excerpt(header.tensors[i].name) + " appears twice");
    }
  }
  validate_layout(header, file_size, where);
  return header;
}

// ---------------------------------------------------------------------------------------------------

Reader::Reader(const std::filesystem::path& path) : fd_(open_input_file(path)) {
  const std::string where = path.string();
  const auto size = static_cast<uint64_t>(fd_.size());
  if (size < 8) {
    fail(ErrorKind::kCorrupt, where + ": " + std::to_string(size) +
                                  " bytes, too short for a safetensors file (it starts with an 8-byte header length)");
  }
  unsigned char length_bytes[8];
  fd_.pread_exact(length_bytes, sizeof(length_bytes), 0);
  const uint64_t length = decode_le64(length_bytes);
  // Both checks come before the allocation: the length is untrusted.
  if (length > kMaxHeaderBytes) {
    fail(ErrorKind::kCorrupt, where + ": header length " + std::to_string(length) + " exceeds the limit of " +
                                  std::to_string(kMaxHeaderBytes) + " (not a safetensors file?)");
  }
  if (length > size - 8) {
    fail(ErrorKind::kCorrupt, where + ": header length " + std::to_string(length) + " runs past the end of the file (" +
                                  std::to_string(size) + " bytes)");
  }
  std::string text(static_cast<size_t>(length), '\0');
  fd_.pread_exact(text.data(), text.size(), 8);
  header_ = parse_header(text, size, where);
  file_size_ = size;
}

void Reader::read(const TensorInfo& tensor, uint64_t offset, std::span<std::byte> out) const {
  const bool in_file = tensor.begin <= tensor.end && header_.data_start + tensor.end <= file_size_;
  if (!in_file || offset > tensor.size() || out.size() > tensor.size() - offset) {
    fail(ErrorKind::kInternal, path().string() + ": read of bytes [" + std::to_string(offset) + ", +" +
                                   std::to_string(out.size()) + ") outside tensor " + quoted_excerpt(tensor.name) +
                                   " of " + std::to_string(tensor.size()) + " bytes");
  }
  fd_.pread_exact(out.data(), out.size(), static_cast<int64_t>(header_.data_start + tensor.begin + offset));
}

// ---------------------------------------------------------------------------------------------------

Writer::Writer(const std::filesystem::path& path, std::vector<TensorSpec> tensors,
               std::map<std::string, std::string> metadata) {
  const std::string where = path.string();
  struct Placed {
    TensorSpec spec;
    uint64_t bytes;
    int order;
  };
  std::vector<Placed> placed;
  placed.reserve(tensors.size());
  for (TensorSpec& spec : tensors) {
    if (std::string why = name_problem(spec.name); !why.empty()) fail(ErrorKind::kInvalidInput, where + ": " + why);
    if (spec.name == kMetadataKey) fail(ErrorKind::kInvalidInput, where + ": a tensor cannot be named __metadata__");
    const ByteSize size = byte_size(spec.dtype, spec.shape);
    if (!size.problem.empty()) {
      fail(ErrorKind::kInvalidInput, where + ": tensor " + quoted_excerpt(spec.name) + ": " + size.problem);
    }
    const int order = dtype_order(spec.dtype);
    placed.push_back({std::move(spec), size.bytes, order});
  }
  std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    if (a.order != b.order) return a.order > b.order;
    return a.spec.name < b.spec.name;
  });

  uint64_t offset = 0;
  tensors_.reserve(placed.size());
  for (Placed& p : placed) {
    TensorInfo info{std::move(p.spec.name), std::move(p.spec.dtype), std::move(p.spec.shape), offset, 0};
    if (__builtin_add_overflow(offset, p.bytes, &info.end) || info.end > kMaxFileOffset) {
      fail(ErrorKind::kInvalidInput, where + ": the tensors add up to more bytes than a file can hold");
    }
    offset = info.end;
    if (!index_.emplace(info.name, tensors_.size()).second) {
      fail(ErrorKind::kInvalidInput, where + ": tensor " + quoted_excerpt(info.name) + " is listed twice");
    }
    tensors_.push_back(std::move(info));
  }

  header_text_ = compact_header(tensors_, metadata, where);
  if (header_text_.size() > kMaxHeaderBytes) {
    fail(ErrorKind::kInvalidInput, where + ": header of " + std::to_string(header_text_.size()) +
                                       " bytes exceeds the limit of " + std::to_string(kMaxHeaderBytes));
  }
  data_start_ = 8 + header_text_.size();
  if (offset > kMaxFileOffset - data_start_) {
    fail(ErrorKind::kInvalidInput, where + ": the tensors add up to more bytes than a file can hold");
  }
  file_size_ = data_start_ + offset;

  fd_ = FileDescriptor(path, O_RDWR | O_CREAT | O_TRUNC);
  // A sparse file of the final size: the data lands in place, and the header region stays zero (an
  // invalid header length) until finish().
  if (::ftruncate(fd_.get(), static_cast<off_t>(file_size_)) != 0) {
    fail_errno(where + ": cannot size the file to " + std::to_string(file_size_) + " bytes", errno);
  }
}

const TensorInfo& Writer::lookup(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    fail(ErrorKind::kInternal, path().string() + ": no tensor " + quoted_excerpt(name) + " in this file");
  return tensors_[it->second];
}

uint64_t Writer::data_offset(std::string_view name) const {
  return data_start_ + lookup(name).begin;
}

uint64_t Writer::tensor_bytes(std::string_view name) const {
  return lookup(name).size();
}

void Writer::write(std::string_view name, uint64_t offset, std::span<const std::byte> bytes) {
  const TensorInfo& t = lookup(name);
  if (finished_)
    fail(ErrorKind::kInternal, path().string() + ": write to tensor " + quoted_excerpt(name) + " after finish()");
  if (offset > t.size() || bytes.size() > t.size() - offset) {
    fail(ErrorKind::kInternal, path().string() + ": write of bytes [" + std::to_string(offset) + ", +" +
                                   std::to_string(bytes.size()) + ") outside tensor " + quoted_excerpt(name) + " of " +
                                   std::to_string(t.size()) + " bytes");
  }
  pwrite_all(fd_, bytes.data(), bytes.size(), data_start_ + t.begin + offset);
  start_writeback(fd_, static_cast<int64_t>(data_start_ + t.begin + offset), static_cast<int64_t>(bytes.size()));
}

void Writer::finish() {
  if (finished_) return;
  // Data first, header last: a crash in between leaves a file with a zero header length, which every
  // reader refuses, rather than a valid-looking header over missing data.
  fd_.fsync();
  unsigned char length_bytes[8];
  encode_le64(header_text_.size(), length_bytes);
  pwrite_all(fd_, length_bytes, sizeof(length_bytes), 0);
  pwrite_all(fd_, header_text_.data(), header_text_.size(), 8);
  fd_.fsync();
  fd_.close();
  const std::filesystem::path& file = fd_.path();
  fsync_directory(file.has_parent_path() ? file.parent_path() : std::filesystem::path("."));
  finished_ = true;
}

// ---------------------------------------------------------------------------------------------------

std::vector<std::vector<TensorSpec>> plan_shards(const std::vector<TensorSpec>& tensors, uint64_t max_bytes) {
  std::vector<std::vector<TensorSpec>> shards;
  std::vector<TensorSpec> current;
  uint64_t current_bytes = 0;
  for (const TensorSpec& spec : tensors) {
    const uint64_t bytes = tensor_bytes(spec);
    if (bytes > max_bytes) {
      // As huggingface_hub does: the oversized tensor's shard is listed now, before the one being filled.
      shards.push_back({spec});
      continue;
    }
    // bytes <= max_bytes and current_bytes <= max_bytes, so this sum cannot overflow.
    if (current_bytes + bytes > max_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(spec);
    current_bytes += bytes;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_file_name(int index, int count) {
  if (count < 1 || index < 1 || index > count) {
    fail(ErrorKind::kInternal,
         "shard index " + std::to_string(index) + " of " + std::to_string(count) + " is out of range");
  }
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", index, count);
  return name;
}

std::string index_json(uint64_t total_size, const std::map<std::string, std::string>& weight_map) {
  json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", json::object()}};
  for (const auto& [name, file] : weight_map) index["weight_map"][name] = file;
  try {
    // nlohmann's objects are std::maps (keys in byte order, which is code point order for UTF-8, as
    // Python's sort_keys), its indent-2 layout is Python's, and ensure_ascii escapes as Python does.
    return index.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
  } catch (const json::exception&) {
    fail(ErrorKind::kInvalidInput, "safetensors index: a tensor or file name is not valid UTF-8");
  }
}

}  // namespace shardkit::ckpt::safetensors
