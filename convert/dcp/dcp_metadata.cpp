#include "convert/dcp/dcp_metadata.hpp"

#include <map>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "ckpt/safetensors.hpp"
#include "ckpt/tensor_table.hpp"

namespace shardkit::convert::dcp {
namespace {

using torch::Value;
using Kind = Value::Kind;

// The pickle holds a few hundred bytes per chunk: this is tens of thousands of ranks' chunks of a
// large model, and keeps a crafted file from being read whole into memory.
constexpr size_t kMaxMetadataBytes = size_t{256} << 20;
constexpr std::string_view kModule = "torch.distributed.checkpoint.metadata.";

class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  [[noreturn]] void bad(const std::string& what) const { fail(ErrorKind::kInvalidInput, where_ + ": " + what); }

  const Value& object(const Value& v, std::string_view cls, const std::string& what) const {
    if (v.kind != Kind::kObject || v.text.size() <= kModule.size() || !v.text.starts_with(kModule) ||
        std::string_view(v.text).substr(kModule.size()) != cls) {
      bad(what + " is " + (v.kind == Kind::kObject ? quoted_excerpt(v.text) : std::string(v.describe())) + ", not a " +
          std::string(cls));
    }
    return v;
  }
  const Value& attribute(const Value& v, std::string_view name, Kind kind, const std::string& what) const {
    const Value* a = v.get(name);
    if (!a || a->kind != kind) {
      bad(what + "." + std::string(name) + " is " + (a ? a->describe() : "missing") + ", not " + kind_name(kind));
    }
    return *a;
  }
  int64_t nonnegative(const Value& v, const std::string& what) const {
    if (v.kind != Kind::kInt || v.integer < 0) bad(what + " is " + v.describe() + ", not a non-negative integer");
    return v.integer;
  }
  std::vector<int64_t> dims(const Value& v, const std::string& what) const {
    if (v.kind != Kind::kTuple) bad(what + " is " + v.describe() + ", not a torch.Size");
    if (v.items.size() > ckpt::safetensors::kMaxRank) bad(what + " has more than 64 dimensions");
    std::vector<int64_t> out;
    for (const Value* d : v.items) out.push_back(nonnegative(*d, what));
    return out;
  }

 private:
  static const char* kind_name(Kind kind) {
    switch (kind) {
      case Kind::kDict:
        return "a dict";
      case Kind::kList:
        return "a list";
      case Kind::kTuple:
        return "a tuple";
      case Kind::kString:
        return "a string";
      case Kind::kInt:
        return "an int";
      default:
        return "the expected value";
    }
  }
  std::string where_;
};

int64_t volume(const std::vector<int64_t>& dims, const Reader& r, const std::string& what) {
  int64_t n = 1;
  for (const int64_t d : dims) {
    if (d != 0 && n > (int64_t{1} << 62) / d) r.bad(what + " has more than 2^62 elements");
    n *= d;
  }
  return n;
}

// TensorProperties: the fields in order as its __getstate__ tuple (torch 2.x), or as attributes.
torch::Dtype tensor_dtype(const Value& props, const Reader& r, const std::string& what) {
  const Value* dtype = nullptr;
  const Value* layout = nullptr;
  if (const Value* state = props.get(torch::kStateAttribute); state && state->kind == Kind::kTuple) {
    if (state->items.size() < 2)
      r.bad(what + " has a TensorProperties state of " + std::to_string(state->items.size()) + " fields");
    dtype = state->items[0];
    layout = state->items[1];
  } else {
    dtype = props.get("dtype");
    layout = props.get("layout");
  }
  const std::optional<torch::Dtype> d = dtype ? torch::dtype_of(*dtype) : std::nullopt;
  if (!d) {
    r.bad(what + " has element type " + (dtype && dtype->kind == Kind::kGlobal ? quoted_excerpt(dtype->text) : "?") +
          "; floating-point and integer tensors are read");
  }
  // PyTorch pickles the layout through torch.serialization._get_layout("torch.strided"); shardkit's
  // writer names the global torch.strided.
  if (layout &&
      !((layout->kind == Kind::kString || layout->kind == Kind::kGlobal) && layout->text == "torch.strided")) {
    r.bad(what + " is not a dense (torch.strided) tensor");
  }
  return *d;
}

// A storage file name: a plain name inside the folder.
void check_file_name(const std::string& name, const Reader& r, const std::string& what) {
  if (name.empty() || name.size() > 255 || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    r.bad(what + " names the file " + quoted_excerpt(name) + ", not a file of the checkpoint's folder");
  }
}

}  // namespace

int64_t Item::numel() const noexcept {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

Metadata::Metadata(const std::filesystem::path& folder, torch::ParseBudget* budget) : folder_(folder) {
  const std::filesystem::path file = folder / ".metadata";
  const std::string where = file.string();
  require_within_folder(folder, file);
  const torch::Pickle pickle = torch::unpickle(read_small_file(file, kMaxMetadataBytes, ErrorKind::kInvalidInput),
                                               where, budget, torch::Globals::kDcpMetadata);
  const Reader r(where);
  const Value& md = r.object(pickle.root(), "Metadata", "the file");
  const Value& sdm = r.attribute(md, "state_dict_metadata", Kind::kDict, "Metadata");
  const Value& storage = r.attribute(md, "storage_data", Kind::kDict, "Metadata");

  // Where each (key, chunk offsets) was written.
  std::map<std::pair<std::string, std::vector<int64_t>>, StorageLocation> locations;
  for (const auto& [index, info] : storage.pairs) {
    const Value& mi = r.object(*index, "MetadataIndex", "a key of storage_data");
    const std::string& fqn = r.attribute(mi, "fqn", Kind::kString, "MetadataIndex").text;
    const std::string what = "storage_data[" + quoted_excerpt(fqn) + "]";
    std::vector<int64_t> offsets;
    if (const Value* o = mi.get("offset"); o && o->kind != Kind::kNone) offsets = r.dims(*o, what + ".offset");
    if (info->kind != Kind::kObject || info->text != "torch.distributed.checkpoint.filesystem._StorageInfo") {
      r.bad(what + " is " + info->describe() + ", not a _StorageInfo");
    }
    StorageLocation loc;
    loc.file = r.attribute(*info, "relative_path", Kind::kString, what).text;
    check_file_name(loc.file, r, what);
    loc.offset = static_cast<uint64_t>(r.nonnegative(r.attribute(*info, "offset", Kind::kInt, what), what + ".offset"));
    loc.length = static_cast<uint64_t>(r.nonnegative(r.attribute(*info, "length", Kind::kInt, what), what + ".length"));
    if (const Value* t = info->get("transform_descriptors");
        t && t->kind != Kind::kNone && !((t->kind == Kind::kList || t->kind == Kind::kTuple) && t->items.empty())) {
      r.bad(what + " was saved through transforms (compression); only plain items are read");
    }
    if (!locations.emplace(std::pair{fqn, std::move(offsets)}, std::move(loc)).second) {
      r.bad(what + " is given twice for the same chunk");
    }
  }

  for (const auto& [key, meta] : sdm.pairs) {
    if (key->kind != Kind::kString) r.bad("state_dict_metadata has a key that is " + std::string(key->describe()));
    if (items_.size() >= 4 * ckpt::kMaxTensors) r.bad("more than 4 million items");
    Item item;
    item.key = key->text;
    const std::string what = "state_dict_metadata[" + quoted_excerpt(item.key) + "]";
    const auto located = [&](const std::vector<int64_t>& offsets) {
      const auto it = locations.find({item.key, offsets});
      if (it == locations.end()) r.bad(what + ": a chunk with no storage_data entry (a file is missing?)");
      StorageLocation loc = it->second;
      locations.erase(it);
      return loc;
    };
    if (meta->kind == Kind::kObject && meta->text == std::string(kModule) + "BytesStorageMetadata") {
      item.tensor = false;
      item.chunks.push_back({{}, {}, located({})});
    } else {
      const Value& tsm = r.object(*meta, "TensorStorageMetadata", what);
      item.dtype = tensor_dtype(r.object(r.attribute(tsm, "properties", Kind::kObject, what), "TensorProperties", what),
                                r, what);
      item.shape = r.dims(r.attribute(tsm, "size", Kind::kTuple, what), what + ".size");
      const int64_t numel = volume(item.shape, r, what);
      int64_t covered = 0;
      for (const Value* c : r.attribute(tsm, "chunks", Kind::kList, what).items) {
        const Value& cm = r.object(*c, "ChunkStorageMetadata", what + ".chunks");
        Chunk chunk;
        chunk.offsets = r.dims(r.attribute(cm, "offsets", Kind::kTuple, what), what + " chunk offsets");
        chunk.sizes = r.dims(r.attribute(cm, "sizes", Kind::kTuple, what), what + " chunk sizes");
        if (chunk.offsets.size() != item.shape.size() || chunk.sizes.size() != item.shape.size()) {
          r.bad(what + " has a chunk of " + std::to_string(chunk.sizes.size()) + " dimensions in a tensor of " +
                std::to_string(item.shape.size()));
        }
        for (size_t d = 0; d < item.shape.size(); ++d) {
          if (chunk.offsets[d] > item.shape[d] || chunk.sizes[d] > item.shape[d] - chunk.offsets[d]) {
            r.bad(what + " has a chunk reaching past the tensor's shape in dimension " + std::to_string(d));
          }
        }
        covered += volume(chunk.sizes, r, what);
        if (covered > numel) break;
        chunk.location = located(chunk.offsets);
        item.chunks.push_back(std::move(chunk));
      }
      if (covered != numel) {
        r.bad(what + ": its chunks hold " + std::to_string(covered) + " elements; the tensor has " +
              std::to_string(numel));
      }
    }
    if (!by_key_.emplace(item.key, items_.size()).second) r.bad(what + " is given twice");
    items_.push_back(std::move(item));
  }
  if (!locations.empty()) {
    r.bad("storage_data names " + quoted_excerpt(locations.begin()->first.first) +
          ", which state_dict_metadata has not");
  }
}

const Item* Metadata::find(std::string_view key) const {
  const auto it = by_key_.find(std::string(key));
  return it == by_key_.end() ? nullptr : &items_[it->second];
}

bool is_dcp_folder(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path / ".metadata", ec);
}

}  // namespace shardkit::convert::dcp
