#include "ckpt/manifest.hpp"

#include <ctime>
#include <random>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "base/xxh64.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/zstd_codec.hpp"

namespace shardkit::ckpt {
namespace {

constexpr char kDigestKey[] = "manifest_digest";

uint64_t canonical_digest(const nlohmann::json& body) {
  const std::string canonical = body.dump();  // keys sorted, no whitespace
  return xxh64(canonical.data(), canonical.size());
}

// Typed, bounded access to a JSON object's fields; every failure names the file and the field.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) bad("expected a JSON object");
  }
  [[noreturn]] void bad(const std::string& what) const { fail(ErrorKind::kCorrupt, where_ + ": " + what); }
  const nlohmann::json& get(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end()) bad(std::string("field '") + key + "' is missing");
    return *it;
  }
  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    return checked_integer(get(key), where_, key, lo, hi, ErrorKind::kCorrupt);
  }
  std::string string(const char* key, size_t max_length = 256) const {
    const nlohmann::json& v = get(key);
    if (!v.is_string() || v.get_ref<const std::string&>().size() > max_length) {
      bad(std::string("field '") + key + "' is not a string of at most " + std::to_string(max_length) + " bytes");
    }
    return v.get<std::string>();
  }
  const nlohmann::json& object(const char* key) const {
    const nlohmann::json& v = get(key);
    if (!v.is_object()) bad(std::string("field '") + key + "' is not an object");
    return v;
  }
  const nlohmann::json& array(const char* key) const {
    const nlohmann::json& v = get(key);
    if (!v.is_array()) bad(std::string("field '") + key + "' is not an array");
    return v;
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

}  // namespace

int64_t Manifest::total_bytes() const noexcept {
  int64_t total = 0;
  for (const ShardRecord& s : shards) total += s.bytes;
  return total;
}

nlohmann::json manifest_to_json(const Manifest& m) {
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardRecord& s : m.shards) {
    shards.push_back({{"rank", s.rank}, {"file", s.file}, {"bytes", s.bytes}, {"digest", to_hex(s.digest)}});
  }
  nlohmann::json j = {
      {"format", std::string(kManifestFormatName)},
      {"format_version", m.format_version},
      {"checkpoint_uid", m.checkpoint_uid},
      {"step", m.step},
      {"created", m.created},
      {"writer", m.writer},
      {"tensors", tensor_table_to_json(m.tensors)},
      {"layout", {{"world_size", m.layout.world_size}, {"stage", m.layout.stage}, {"alignment", m.layout.alignment}}},
      {"states", m.states},
      {"storage",
       {{"chunk_elems", m.chunk_elems},
        {"compression", m.compression_level > 0 ? "zstd" : "none"},
        {"compression_level", m.compression_level},
        {"checksum", std::string(kChecksumName)}}},
      {"shards", shards},
      {"trainer_state", m.trainer_state},
      {"model", m.model},
      {"config", m.config},
  };
  j[kDigestKey] = to_hex(canonical_digest(j));
  return j;
}

Manifest parse_manifest(const std::string& text, const std::string& where) {
  nlohmann::json j = parse_untrusted_json(text, {kMaxManifestBytes, false}, where, ErrorKind::kCorrupt);
  Fields top(j, where);
  if (top.string("format") != kManifestFormatName) top.bad("not a shardkit manifest (format field)");
  Manifest m;
  m.format_version = static_cast<int>(top.integer("format_version", 1, 1 << 20));
  if (m.format_version != kFormatVersion) {
    top.bad("format version " + std::to_string(m.format_version) + ", this build reads version " +
            std::to_string(kFormatVersion));
  }
  uint64_t stored_digest = 0;
  if (!from_hex(top.string(kDigestKey), &stored_digest)) top.bad("manifest_digest is not 16 hex digits");
  // Erased in place rather than from a copy: the tree of a large manifest is many times its text.
  j.erase(kDigestKey);
  if (canonical_digest(j) != stored_digest) {
    top.bad("manifest digest mismatch: the file was modified or damaged after it was written");
  }

  m.checkpoint_uid = top.string("checkpoint_uid", 64);
  m.step = top.integer("step", 0, kMaxStep);
  m.created = top.string("created");
  m.writer = top.string("writer");
  m.tensors = tensor_table_from_json(top.array("tensors"), where);

  Fields layout(top.object("layout"), where + ": layout");
  m.layout.world_size = static_cast<int>(layout.integer("world_size", 1, kMaxWorldSize));
  m.layout.stage = static_cast<int>(layout.integer("stage", 0, 3));
  m.layout.alignment = layout.integer("alignment", 1, kMaxAlignment);

  const nlohmann::json& states = top.array("states");
  if (states.empty() || states.size() > kMaxStates) top.bad("'states' must list 1-16 names");
  for (const auto& s : states) {
    if (!s.is_string() || !is_plain_name(s.get<std::string>())) top.bad("'states' holds an invalid name");
    m.states.push_back(s.get<std::string>());
  }

  Fields storage(top.object("storage"), where + ": storage");
  m.chunk_elems = storage.integer("chunk_elems", 1, kMaxChunkElems);
  m.compression_level = static_cast<int>(storage.integer("compression_level", 0, 19));
  const std::string codec = storage.string("compression");
  if (codec != (m.compression_level > 0 ? "zstd" : "none"))
    storage.bad("compression " + quoted_excerpt(codec) + " is unsupported");
  if (storage.string("checksum") != kChecksumName) storage.bad("checksum must be xxh64");

  const nlohmann::json& shards = top.array("shards");
  if (shards.size() != static_cast<size_t>(m.layout.world_size)) {
    top.bad("lists " + std::to_string(shards.size()) + " shards for world size " + std::to_string(m.layout.world_size));
  }
  for (size_t r = 0; r < shards.size(); ++r) {
    Fields f(shards[r], where + ": shard " + std::to_string(r));
    ShardRecord s;
    s.rank = static_cast<int>(f.integer("rank", 0, kMaxWorldSize));
    s.file = f.string("file");
    s.bytes = f.integer("bytes", 0, int64_t{1} << 56);
    // The file name is never used as a path as given: only the one name the rank and world size imply.
    const std::string expected = shard_file_name(static_cast<int>(r), m.layout.world_size);
    if (s.rank != static_cast<int>(r) || s.file != expected) {
      f.bad("rank " + std::to_string(s.rank) + " in file " + quoted_excerpt(s.file) + ", expected rank " +
            std::to_string(r) + " in " + expected);
    }
    if (!from_hex(f.string("digest"), &s.digest)) f.bad("digest is not 16 hex digits");
    m.shards.push_back(std::move(s));
  }
  // Moved, not copied: these are opaque to this library and may be most of the manifest.
  for (const char* key : {"trainer_state", "model", "config"}) top.object(key);
  m.trainer_state = std::move(j["trainer_state"]);
  m.model = std::move(j["model"]);
  m.config = std::move(j["config"]);
  return m;
}

Manifest read_manifest(const std::filesystem::path& step_dir) {
  const std::filesystem::path path = step_dir / kManifestFileName;
  require_within_folder(step_dir, path, ErrorKind::kCorrupt);
  return parse_manifest(read_small_file(path, kMaxManifestBytes), path.string());
}

void write_manifest(const std::filesystem::path& step_dir, const Manifest& manifest, bool durable) {
  const std::filesystem::path path = step_dir / kManifestFileName;
  const std::string text = manifest_to_json(manifest).dump(2) + "\n";
  // A manifest that no reader would accept must not commit a checkpoint.
  if (text.size() > kMaxManifestBytes) {
    fail(ErrorKind::kInvalidInput, path.string() + ": " + std::to_string(text.size()) +
                                       " bytes of manifest, more than the " + std::to_string(kMaxManifestBytes) +
                                       " a reader accepts (too many ranks or tensors)");
  }
  write_file_atomic(path, text, durable);
}

std::string make_checkpoint_uid() {
  std::random_device device;
  const uint64_t hi = (uint64_t{device()} << 32) | device();
  const uint64_t lo = (uint64_t{device()} << 32) | device();
  return to_hex(hi) + to_hex(lo);
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

}  // namespace shardkit::ckpt
