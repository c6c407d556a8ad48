#include "base/json_input.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "base/file_util.hpp"

namespace shardkit {
namespace {

using nlohmann::json;

constexpr size_t kShownBytes = 160;

// The first pass over a document: nlohmann's own lexer (so comments and strings are read exactly as
// the real parse reads them) with a handler that builds nothing and stops at the first level or value
// beyond the limits, or at a key its object already has: parsers disagree on which of the two wins
// (nlohmann and Python the last, others the first), and DeepSpeed refuses such a config.
class ShapeCheck {
 public:
  ShapeCheck(std::string_view text, size_t max_values) : text_(text), max_values_(max_values) {}

  std::string problem;  // why the pass stopped

  bool null() { return count(); }
  bool boolean(bool) { return count(); }
  bool number_integer(json::number_integer_t) { return count(); }
  bool number_unsigned(json::number_unsigned_t) { return count(); }
  bool number_float(json::number_float_t, const json::string_t&) { return count(); }
  bool string(json::string_t&) { return count(); }
  bool binary(json::binary_t&) { return count(); }
  bool key(json::string_t& k) {
    if (!keys_.back().insert(k).second) {
      problem = "duplicate key " + quoted_excerpt(k) + " in one object";
      return false;
    }
    return count();  // a key costs a node of its own in the tree
  }
  bool start_object(std::size_t) {
    keys_.emplace_back();
    return open();
  }
  bool start_array(std::size_t) {
    keys_.emplace_back();  // unused: keeps keys_ in step with the nesting
    return open();
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    // nlohmann's own message quotes the input; this one stays short whatever the bytes are, and gives
    // the line and column an editor shows. `position` counts the bytes read, up to the last one of
    // the offending token.
    const size_t at = std::min(position > 0 ? position - 1 : 0, text_.size());
    const std::string_view before = text_.substr(0, at);
    const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
    const size_t line_start = before.rfind('\n');
    const size_t column = at - (line_start == std::string_view::npos ? 0 : line_start + 1) + 1;
    problem = "not valid JSON (syntax error at line " + std::to_string(line) + ", column " + std::to_string(column) +
              ", byte " + std::to_string(position) + ")";
    return false;
  }

 private:
  bool count() {
    if (++values_ <= max_values_) return true;
    problem = "more than " + std::to_string(max_values_) + " JSON values, more than such a file may hold";
    return false;
  }
  bool open() {
    if (++depth_ <= kMaxJsonDepth) return count();
    problem = "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return false;
  }
  bool close() {
    --depth_;
    keys_.pop_back();
    return true;
  }

  std::string_view text_;
  size_t max_values_;
  size_t values_ = 0;
  int depth_ = 0;
  std::vector<std::set<std::string, std::less<>>> keys_;  // of each open object or array
};

// `text` with each comma that directly precedes a `}` or `]` (whitespace and, when allowed, comments
// between) replaced by a space: nlohmann has no option for them. Every other byte stays in place, so
// an error's line and column still point into the file as written.
std::string blank_trailing_commas(std::string_view text, bool comments) {
  std::string out(text);
  size_t comma = std::string::npos;  // the last comma seen, while only blanks followed it
  char last = '\0';                  // the last significant byte before it
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    if (comments && c == '/' && i + 1 < out.size() && (out[i + 1] == '/' || out[i + 1] == '*')) {
      const size_t end = out[i + 1] == '/' ? out.find('\n', i) : out.find("*/", i + 2);
      if (end == std::string::npos) break;  // an unclosed comment: the parse reports it
      i = out[i + 1] == '/' ? end : end + 1;
      continue;
    }
    if ((c == '}' || c == ']') && comma != std::string::npos) out[comma] = ' ';
    // Only a comma after a value can trail: "[,]" and "{,}" stay errors.
    const bool after_value = last != '\0' && last != '[' && last != '{' && last != ',' && last != ':';
    comma = c == ',' && after_value ? i : std::string::npos;
    last = c;
    if (c == '"') {  // skip the string, escapes included
      for (++i; i < out.size() && out[i] != '"'; ++i) {
        if (out[i] == '\\') ++i;
      }
    }
  }
  return out;
}

}  // namespace

json parse_untrusted_json(std::string_view text, const JsonLimits& limits, const std::string& where, ErrorKind kind) {
  if (text.size() > limits.max_bytes) {
    fail(kind, where + ": " + std::to_string(text.size()) + " bytes of JSON, more than the " +
                   std::to_string(limits.max_bytes) + " such a file may have");
  }
  // nlohmann reads a NUL byte as the end of the input; JSON text never holds one unescaped.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    fail(kind, where + ": not valid JSON (NUL byte at byte " + std::to_string(nul) + ")");
  }
  const std::string lenient = limits.trailing_commas ? blank_trailing_commas(text, limits.comments) : std::string();
  if (limits.trailing_commas) text = lenient;
  ShapeCheck check(text, limits.max_bytes / kMinBytesPerJsonValue);
  if (!json::sax_parse(text, &check, json::input_format_t::json, /*strict=*/true, limits.comments)) {
    fail(kind, where + ": " + check.problem);
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false, limits.comments);
  if (j.is_discarded()) fail(kind, where + ": not valid JSON");
  return j;
}

json read_json_file(const std::filesystem::path& path, const JsonLimits& limits, ErrorKind kind) {
  return parse_untrusted_json(read_small_file(path, limits.max_bytes, kind), limits, path.string(), kind);
}

std::string quoted_excerpt(std::string_view text) {
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kShownBytes; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += text.size() > kShownBytes ? "'..." : "'";
  return out;
}

std::string value_excerpt(const json& value) {
  if (value.is_structured()) return value.type_name();
  if (!value.is_string()) return value.dump();
  const std::string& text = value.get_ref<const std::string&>();
  // JSON's escapes keep control bytes out of the message; a cut inside a UTF-8 sequence becomes U+FFFD.
  const std::string shown =
      json(text.substr(0, kShownBytes)).dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  return text.size() > kShownBytes ? shown + "..." : shown;
}

int64_t checked_integer(const json& value, const std::string& where, std::string_view key, int64_t lo, int64_t hi,
                        ErrorKind kind) {
  const bool fits = value.is_number_integer() &&
                    !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
  if (!fits || value.get<int64_t>() < lo || value.get<int64_t>() > hi) {
    fail(kind, where + ": " + std::string(key) + " = " + value_excerpt(value) + " is not an integer in [" +
                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return value.get<int64_t>();
}

int64_t integer_field(const json& object, std::string_view key, const std::string& where, int64_t lo, int64_t hi,
                      ErrorKind kind) {
  const auto it = object.is_object() ? object.find(key) : object.end();
  if (it == object.end()) fail(kind, where + ": " + std::string(key) + " is missing");
  return checked_integer(*it, where, key, lo, hi, kind);
}

bool checked_boolean(const json& value, const std::string& what, std::string_view key, ErrorKind kind) {
  if (!value.is_boolean()) {
    fail(kind, what + " '" + std::string(key) + "' is " + value_excerpt(value) + ", expected true or false");
  }
  return value.get<bool>();
}

std::optional<bool> optional_boolean_field(const json& object, std::string_view key, const std::string& what,
                                           ErrorKind kind) {
  const auto it = object.is_object() ? object.find(key) : object.end();
  if (it == object.end() || it->is_null()) return std::nullopt;
  return checked_boolean(*it, what, key, kind);
}

}  // namespace shardkit
