// Reading JSON that comes from outside (manifests, Hugging Face config.json and index files, model
// files, DeepSpeed configs): the size, the nesting depth and the number of values of a document are
// bounded before its tree is built, values quoted in messages are cut short, and integers are
// range-checked before anything narrows them. A crafted file then gets a one-line error, never a stack
// overflow, gigabytes of memory or a silently wrapped number.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/error.hpp"

namespace shardkit {

// Deeper than any file shardkit reads needs (a manifest nests 4 levels, a DeepSpeed config 3), and
// shallow enough for the recursive parts of nlohmann (dump, copy, comparison) to stay far from the
// end of the stack.
inline constexpr int kMaxJsonDepth = 64;
// Real files spend well over 16 bytes of text per value (a manifest's shard entry: about 26); a
// document denser than that ("[0,0,0,...]" is 2 bytes a value) is crafted to make the tree, at 16 to
// 100 bytes a value, outgrow the text many times over. So a cap of N bytes also admits N / 16 values.
inline constexpr size_t kMinBytesPerJsonValue = 16;

struct JsonLimits {
  size_t max_bytes = 0;
  bool comments = false;  // `//` and `/* */` comments, as DeepSpeed and our model files allow
  // A comma before `}` or `]`: DeepSpeed reads its configs with hjson, which allows one.
  bool trailing_commas = false;
};

// The size caps of each kind of JSON file, from what real files need.
namespace json_limits {
// A Hugging Face config.json: a few KiB; a classifier's id2label table of 20,000 classes is ~600 KB.
inline constexpr JsonLimits kHfConfig{size_t{4} << 20, false};
// model.safetensors.index.json: ~100 bytes per tensor; 16 MiB is 160,000 tensors (a 7B model has ~300).
inline constexpr JsonLimits kHfIndex{size_t{16} << 20, false};
// A shardkit model file: a few KiB.
inline constexpr JsonLimits kConfig{size_t{1} << 20, true};
// A DeepSpeed config: a few KiB, read as leniently as DeepSpeed reads it.
inline constexpr JsonLimits kDsConfig{size_t{1} << 20, true, true};
}  // namespace json_limits

// Parses `text` within `limits`: larger text, a NUL byte, deeper nesting than kMaxJsonDepth, more
// values than the size cap admits, or a syntax error are Error(kind) "<where>: ...". A syntax error is
// placed by line and column (bytes, from 1) of the last byte of the token where the text went wrong.
// The depth and the count are checked by a first pass that builds nothing, so no tree is ever deeper
// or larger.
nlohmann::json parse_untrusted_json(std::string_view text, const JsonLimits& limits, const std::string& where,
                                    ErrorKind kind);
// Reads `path` (an input file, see open_input_file) and parses it as above, naming the file in errors.
nlohmann::json read_json_file(const std::filesystem::path& path, const JsonLimits& limits, ErrorKind kind);

// An untrusted string for a message: quoted, control bytes as \xNN, at most 160 bytes of it shown
// ("'abc...'..."), so that the message stays one short line whatever a file holds.
std::string quoted_excerpt(std::string_view text);
// A JSON value for a message: numbers, booleans, null and strings as JSON writes them (so control
// bytes appear as escapes), a string cut after 160 bytes ("..." follows), objects and arrays by
// their type name.
std::string value_excerpt(const nlohmann::json& value);

// The integer `value` (field `key` of `where`) checked to lie in [lo, hi] before any narrowing:
// anything else (a float, a string, an integer beyond 64 bits, one out of range) is Error(kind)
// "<where>: <key> = <value> is not an integer in [lo, hi]".
int64_t checked_integer(const nlohmann::json& value, const std::string& where, std::string_view key, int64_t lo,
                        int64_t hi, ErrorKind kind);
// The same for the field `key` of `object`, which must be an object holding it.
int64_t integer_field(const nlohmann::json& object, std::string_view key, const std::string& where, int64_t lo,
                      int64_t hi, ErrorKind kind);

// The boolean `value` of field `key`: Error(kind) "<what> '<key>' is <value>, expected true or false"
// for anything else.
bool checked_boolean(const nlohmann::json& value, const std::string& what, std::string_view key, ErrorKind kind);
// The boolean field `key` of `object`, nullopt where it is absent or null.
std::optional<bool> optional_boolean_field(const nlohmann::json& object, std::string_view key, const std::string& what,
                                           ErrorKind kind);

}  // namespace shardkit
