#include "trainer/data.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "trainer/philox.hpp"

namespace shardkit::trainer {
namespace {

// Tokens are read in place from the mapping, so the file's little-endian ids must be the host's.
static_assert(std::endian::native == std::endian::little, "shardkit assumes a little-endian host");

// llm.c's data files (dev/data/data_common.py): one 256-int32 header, two kinds of tokens.
constexpr int32_t kLlmcGpt2Magic = 20240520;
constexpr int32_t kLlmcGpt2Version = 1;  // uint16 ids
constexpr int32_t kLlmcLlama3Magic = 20240801;
constexpr int32_t kLlmcLlama3Version = 7;  // uint32 ids
constexpr int64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr int64_t kNpyMagicBytes = sizeof(kNpyMagic) - 1;
// NumPy writes a few hundred bytes at most; the bound keeps a crafted length from costing memory.
constexpr int64_t kNpyMaxHeaderBytes = 64 * 1024;

// Where the tokens of a file lie, decided from its first bytes and its size.
struct TokenExtent {
  int64_t offset = 0;  // bytes
  int64_t count = 0;   // tokens
  int bytes_per_token = 2;
  TokenFile::Format format = TokenFile::Format::kRaw;
};

std::string file_error_prefix(const std::filesystem::path& path) {
  return path.string() + ": ";
}

// Validates the llm.c header (int32 magic, version, token count) against the file size.
TokenExtent llmc_extent(const std::filesystem::path& path, const int32_t header[3], int64_t file_size) {
  const bool llama3 = header[0] == kLlmcLlama3Magic;
  const int32_t version = llama3 ? kLlmcLlama3Version : kLlmcGpt2Version;
  const std::string kind = llama3 ? "llm.c Llama 3 token file" : "llm.c token file";
  if (header[1] != version) {
    fail(ErrorKind::kInvalidInput, file_error_prefix(path) + kind + " version " + std::to_string(header[1]) +
                                       ", expected " + std::to_string(version));
  }
  const int64_t count = header[2];
  if (count < 0) {
    fail(ErrorKind::kInvalidInput,
         file_error_prefix(path) + kind + " header declares a negative token count " + std::to_string(count));
  }
  const int bytes_per_token = llama3 ? 4 : 2;
  const int64_t needed = kLlmcHeaderBytes + bytes_per_token * count;
  if (needed > file_size) {
    fail(ErrorKind::kInvalidInput, file_error_prefix(path) + kind + " header declares " + std::to_string(count) +
                                       " tokens (" + std::to_string(needed) +
                                       " bytes with the header) but the file has " + std::to_string(file_size) +
                                       " bytes");
  }
  return {kLlmcHeaderBytes, count, bytes_per_token, TokenFile::Format::kLlmc};
}

// ---- .npy ----------------------------------------------------------------------------------------

// The three keys of a .npy header, as far as a token file needs them.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// A strict reader of the Python dict literal that NumPy writes as the header, e.g.
// "{'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }": exactly the keys descr (a string),
// fortran_order (True or False) and shape (a tuple of non-negative integers), each once, in any
// order. Anything else is refused rather than guessed at.
class NpyHeaderParser {
 public:
  NpyHeaderParser(const std::filesystem::path& path, const std::string& text) : path_(path), text_(text) {}

  NpyHeader parse() {
    NpyHeader header;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    expect('{');
    for (skip_space(); peek() != '}'; skip_space()) {
      const size_t key_at = pos_;
      const std::string key = string();
      expect(':');
      if (key == "descr" && !seen_descr) {
        header.descr = string();
        seen_descr = true;
      } else if (key == "fortran_order" && !seen_order) {
        header.fortran_order = boolean();
        seen_order = true;
      } else if (key == "shape" && !seen_shape) {
        header.shape = tuple();
        seen_shape = true;
      } else {
        pos_ = key_at;
        error("unexpected or repeated key " + quoted_excerpt(key) +
              " (expected 'descr', 'fortran_order' and 'shape' once each)");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != '}') {
        error("expected ',' or '}' after the value of " + quoted_excerpt(key));
      }
    }
    ++pos_;
    // NumPy pads the header with spaces and ends it with a newline.
    skip_space();
    if (pos_ != text_.size()) error("unexpected characters after the header dict");
    if (!(seen_descr && seen_order && seen_shape)) error("the header lacks one of 'descr', 'fortran_order', 'shape'");
    return header;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail(ErrorKind::kInvalidInput,
         file_error_prefix(path_) + ".npy header, at byte " + std::to_string(pos_) + ": " + what);
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t' || text_[pos_] == '\r'))
      ++pos_;
  }

  void expect(char c) {
    skip_space();
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }

  // A quoted string of printable characters without escapes (NumPy's keys and dtypes need none).
  std::string string() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') error("expected a quoted string");
    const size_t begin = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] < 0x20 || text_[pos_] > 0x7e || text_[pos_] == '\\') error("unsupported character in a string");
      ++pos_;
    }
    if (pos_ == text_.size()) error("unterminated string");
    return text_.substr(begin, pos_++ - begin);
  }

  bool boolean() {
    skip_space();
    for (const bool value : {true, false}) {
      const std::string word = value ? "True" : "False";
      if (text_.compare(pos_, word.size(), word) == 0) {
        pos_ += word.size();
        return value;
      }
    }
    error("expected True or False");
  }

  int64_t integer() {
    skip_space();
    if (!std::isdigit(static_cast<unsigned char>(peek()))) error("expected a non-negative integer");
    int64_t value = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      const int digit = text_[pos_] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) error("integer too large");
      value = value * 10 + digit;
      ++pos_;
    }
    return value;
  }

  // "()", "(n,)", "(n, m)", "(n, m,)"; "(n)" is a parenthesised integer in Python, not a tuple.
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> values;
    bool trailing_comma = false;
    for (skip_space(); peek() != ')'; skip_space()) {
      values.push_back(integer());
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
      } else if (peek() != ')') {
        error("expected ',' or ')' in the shape");
      }
    }
    if (values.size() == 1 && !trailing_comma) error("the shape is an integer in parentheses, not a tuple");
    ++pos_;
    return values;
  }

  const std::filesystem::path& path_;
  const std::string& text_;
  size_t pos_ = 0;
};

[[noreturn]] void npy_fail(const std::filesystem::path& path, const std::string& what) {
  fail(ErrorKind::kInvalidInput, file_error_prefix(path) + ".npy token file " + what);
}

// The shape as Python writes it, cut after a few dimensions: a crafted header can hold thousands, and
// a message stays one short line.
std::string shape_text(const std::vector<int64_t>& shape) {
  constexpr size_t kShown = 4;
  std::string text = "(";
  for (size_t d = 0; d < shape.size() && d < kShown; ++d) text += (d > 0 ? ", " : "") + std::to_string(shape[d]);
  if (shape.size() > kShown) return text + ", ... " + std::to_string(shape.size()) + " dimensions)";
  return text + (shape.size() == 1 ? ",)" : ")");
}

// Reads the preamble (magic, version, header length) and the header, returning the header's text and
// where the data begins.
std::pair<std::string, int64_t> npy_header_text(const FileDescriptor& fd, int64_t file_size) {
  const std::filesystem::path& path = fd.path();
  unsigned char preamble[12] = {};
  constexpr int64_t kV1Preamble = 10, kV2Preamble = 12;  // magic, major, minor, then a uint16 or uint32 length
  if (file_size < kV1Preamble) npy_fail(path, "ends inside its preamble (" + std::to_string(file_size) + " bytes)");
  fd.pread_exact(preamble, static_cast<size_t>(std::min(file_size, kV2Preamble)), 0);
  const int major = preamble[6], minor = preamble[7];
  if (major < 1 || major > 3 || minor != 0) {
    npy_fail(path, "has format version " + std::to_string(major) + "." + std::to_string(minor) +
                       ", expected 1.0, 2.0 or 3.0");
  }
  const int64_t header_at = major == 1 ? kV1Preamble : kV2Preamble;
  if (file_size < header_at) npy_fail(path, "ends inside its preamble (" + std::to_string(file_size) + " bytes)");
  int64_t header_bytes = preamble[8] | (preamble[9] << 8);
  if (major > 1) header_bytes |= (int64_t{preamble[10]} << 16) | (int64_t{preamble[11]} << 24);
  if (header_bytes > kNpyMaxHeaderBytes) {
    npy_fail(path, "declares a header of " + std::to_string(header_bytes) + " bytes, more than the " +
                       std::to_string(kNpyMaxHeaderBytes) + " accepted");
  }
  if (header_at + header_bytes > file_size) {
    npy_fail(path, "declares a header of " + std::to_string(header_bytes) + " bytes but the file has " +
                       std::to_string(file_size) + " bytes");
  }
  std::string text(static_cast<size_t>(header_bytes), '\0');
  fd.pread_exact(text.data(), text.size(), header_at);
  return {std::move(text), header_at + header_bytes};
}

// Bytes per id of a .npy dtype; only the little-endian unsigned types that hold token ids.
int npy_bytes_per_token(const std::filesystem::path& path, const std::string& descr) {
  if (descr == "<u2") return 2;
  if (descr == "<u4") return 4;
  npy_fail(path, "has dtype " + quoted_excerpt(descr) + ", expected '<u2' or '<u4' (little-endian uint16 or uint32)");
}

// The number of elements of `shape`, or -1 when it exceeds `limit`. Checked before each product, so
// that a crafted shape cannot wrap around to a size that matches the file.
int64_t element_count(const std::vector<int64_t>& shape, int64_t limit) {
  int64_t count = 1;
  for (const int64_t dim : shape) {
    if (dim == 0) return 0;
    if (count > limit / dim) return -1;
    count *= dim;
  }
  return count;
}

// Validates a .npy token file: little-endian uint16 or uint32, 1-D or 2-D in C order (a 1-D array
// has the same bytes in either order), and exactly the data its shape needs after the header.
TokenExtent npy_extent(const FileDescriptor& fd, int64_t file_size) {
  const std::filesystem::path& path = fd.path();
  const auto [text, data_at] = npy_header_text(fd, file_size);
  const NpyHeader header = NpyHeaderParser(path, text).parse();
  const int bytes_per_token = npy_bytes_per_token(path, header.descr);
  const std::string shape = shape_text(header.shape);
  if (header.shape.empty() || header.shape.size() > 2) {
    npy_fail(path, "has shape " + shape + ", expected 1-D (tokens) or 2-D (rows of tokens, read row by row)");
  }
  if (header.fortran_order && header.shape.size() > 1) {
    npy_fail(path, "has a 2-D shape " + shape + " in Fortran order, expected C order (fortran_order False)");
  }
  const int64_t data_bytes = file_size - data_at;
  const int64_t count = element_count(header.shape, std::numeric_limits<int64_t>::max() / bytes_per_token);
  if (count < 0 || count * bytes_per_token != data_bytes) {
    const std::string needed = count < 0 ? "2^63 bytes or more" : std::to_string(count * bytes_per_token) + " bytes";
    npy_fail(path, "has shape " + shape + " of '" + header.descr + "' (" + needed + ") but " +
                       std::to_string(data_bytes) + " bytes of data after its header");
  }
  return {data_at, count, bytes_per_token, TokenFile::Format::kNpy};
}

// ---- Format ---------------------------------------------------------------------------------------

bool has_npy_magic(const FileDescriptor& fd, int64_t file_size) {
  char magic[kNpyMagicBytes];
  if (file_size < kNpyMagicBytes) return false;
  fd.pread_exact(magic, sizeof(magic), 0);
  return std::memcmp(magic, kNpyMagic, sizeof(magic)) == 0;
}

// A file too short for the whole llm.c header is raw whatever its first bytes.
bool has_llmc_magic(const FileDescriptor& fd, int64_t file_size, int32_t header[3]) {
  if (file_size < kLlmcHeaderBytes) return false;
  fd.pread_exact(header, 3 * sizeof(int32_t), 0);
  return header[0] == kLlmcGpt2Magic || header[0] == kLlmcLlama3Magic;
}

TokenExtent raw_extent(const std::filesystem::path& path, int64_t file_size) {
  if (file_size % 2 != 0) {
    fail(ErrorKind::kInvalidInput, file_error_prefix(path) + "raw token file has an odd size of " +
                                       std::to_string(file_size) + " bytes (expected uint16 tokens)");
  }
  return {0, file_size / 2, 2, TokenFile::Format::kRaw};
}

// Decides the format from the first bytes (see data.hpp) and validates it against the file size.
TokenExtent token_extent(const FileDescriptor& fd, int64_t file_size) {
  const std::filesystem::path& path = fd.path();
  TokenExtent extent;
  if (has_npy_magic(fd, file_size)) {
    extent = npy_extent(fd, file_size);
  } else if (int32_t header[3]; has_llmc_magic(fd, file_size, header)) {
    extent = llmc_extent(path, header, file_size);
  } else {
    extent = raw_extent(path, file_size);
  }
  // An llm.c or .npy file may declare zero tokens; it is as useless as an empty raw file.
  if (extent.count == 0) fail(ErrorKind::kInvalidInput, file_error_prefix(path) + "holds no tokens");
  return extent;
}

// Token i of the mapping. memcpy because nothing aligns the data of a .npy file to the id's width.
template <typename Id>
Id load(const unsigned char* tokens, int64_t i) noexcept {
  Id id;
  std::memcpy(&id, tokens + i * static_cast<int64_t>(sizeof(Id)), sizeof(Id));
  return id;
}

// Copies ids [first, first + count) into out until one is >= vocab_size; returns how many were copied.
template <typename Id>
int64_t widen(const unsigned char* tokens, int64_t first, int64_t count, uint32_t vocab_size, int32_t* out) noexcept {
  for (int64_t k = 0; k < count; ++k) {
    const Id id = load<Id>(tokens, first + k);
    if (id >= vocab_size) return k;
    out[k] = static_cast<int32_t>(id);
  }
  return count;
}

uint64_t join(uint32_t high, uint32_t low) noexcept {
  return (uint64_t{high} << 32) | low;
}

}  // namespace

// ---- TokenFile -----------------------------------------------------------------------------------

TokenFile::TokenFile(const std::filesystem::path& path) : path_(path) {
  const FileDescriptor fd = open_input_file(path);
  const int64_t file_size = fd.size();
  // Every check happens before the mapping exists, so nothing can throw while it would leak.
  const TokenExtent extent = token_extent(fd, file_size);
  map_size_ = static_cast<size_t>(file_size);
  void* map = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) fail_errno(path.string() + ": mmap", errno);
  map_ = map;
  tokens_ = static_cast<const unsigned char*>(map_) + extent.offset;
  count_ = extent.count;
  bytes_per_token_ = extent.bytes_per_token;
  format_ = extent.format;
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

uint32_t TokenFile::at(int64_t i) const noexcept {
  return bytes_per_token_ == 2 ? load<uint16_t>(tokens_, i) : load<uint32_t>(tokens_, i);
}

void TokenFile::read(int64_t first, int64_t count, int vocab_size, int32_t* out) const {
  if (first < 0 || count < 0 || first > count_ - count || vocab_size < 1) {
    fail(ErrorKind::kInternal, file_error_prefix(path_) + "reading tokens [" + std::to_string(first) + ", " +
                                   std::to_string(first + count) + ") of " + std::to_string(count_) +
                                   " with a vocabulary of " + std::to_string(vocab_size));
  }
  const auto vocab = static_cast<uint32_t>(vocab_size);
  const int64_t copied = bytes_per_token_ == 2 ? widen<uint16_t>(tokens_, first, count, vocab, out)
                                               : widen<uint32_t>(tokens_, first, count, vocab, out);
  if (copied < count) {
    const int64_t position = first + copied;
    fail(ErrorKind::kInvalidInput, file_error_prefix(path_) + "token id " + std::to_string(at(position)) +
                                       " at position " + std::to_string(position) + " is outside the vocabulary of " +
                                       std::to_string(vocab_size) + " tokens");
  }
}

// ---- SampleOrder ---------------------------------------------------------------------------------

SampleOrder::SampleOrder(const TokenFile& file, int seq_len, uint64_t seed)
    : file_(file), seq_len_(seq_len), seed_(seed), num_samples_(0) {
  if (seq_len < 1) {
    fail(ErrorKind::kInvalidInput,
         file_error_prefix(file.path()) + "sequence length " + std::to_string(seq_len) + " must be positive");
  }
  // Windows start every T tokens and each needs T + 1 (its last target is the next window's first input).
  num_samples_ = (file.size() - 1) / seq_len;
  if (num_samples_ == 0) {
    fail(ErrorKind::kInvalidInput, file_error_prefix(file.path()) + std::to_string(file.size()) +
                                       " tokens, fewer than the seq_len + 1 = " + std::to_string(seq_len + 1) +
                                       " of one sample");
  }
}

int64_t SampleOrder::sample_at(int64_t g) {
  if (g < 0) fail(ErrorKind::kInternal, "global sample index " + std::to_string(g) + " is negative");
  const int64_t epoch = g / num_samples_;
  if (epoch != cached_epoch_) {
    // Fisher-Yates from the last position down; step i draws its swap partner from counter (i, epoch),
    // so the permutation depends on (seed, epoch) only, not on which epochs were built before.
    permutation_.resize(static_cast<size_t>(num_samples_));
    std::iota(permutation_.begin(), permutation_.end(), int64_t{0});
    for (int64_t i = num_samples_ - 1; i > 0; --i) {
      uint32_t out[4];
      Philox::generate(seed_, static_cast<uint64_t>(i), static_cast<uint64_t>(epoch), out);
      // Modulo of 64 random bits: the bias is below (i + 1) / 2^64, far beneath any observable effect.
      const auto j = static_cast<int64_t>(join(out[1], out[0]) % static_cast<uint64_t>(i + 1));
      std::swap(permutation_[static_cast<size_t>(i)], permutation_[static_cast<size_t>(j)]);
    }
    cached_epoch_ = epoch;
  }
  return permutation_[static_cast<size_t>(g % num_samples_)];
}

void SampleOrder::fill(int64_t g, int vocab_size, int32_t* inputs, int32_t* targets) {
  const int64_t start = sample_at(g) * seq_len_;
  // Inputs first: a bad id anywhere in the window is then reported at its lowest position.
  file_.read(start, seq_len_, vocab_size, inputs);
  file_.read(start + 1, seq_len_, vocab_size, targets);
}

}  // namespace shardkit::trainer
