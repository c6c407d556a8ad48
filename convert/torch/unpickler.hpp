// A restricted reader of the Python pickles inside torch.save archives (`data.pkl`), written for the
// files DeepSpeed saves (and, with its own list of globals, PyTorch DCP's `.metadata`): it builds plain
// values (None, bool, int, float, str, bytes, tuple, list, dict, set) and knows a fixed list of Python
// globals by name, never loading or running anything. Tensors come out as references to their storage
// record (which the caller reads from the archive); the
// DeepSpeed classes the files name (loss scalers, fragment addresses) come out as objects with their
// attribute dictionary; ZeroStageEnum members as their integer.
//
// Everything else is refused with a one-line Error(kInvalidInput): a global outside the list (named by
// module and name, e.g. "os.system"), an opcode these files never contain, a memo index never
// stored, a length past the end of the data, a stack deeper than kMaxStack. The machine is a loop over
// the bytes (no recursion), every object lives in an arena owned by the result (a crafted pickle that
// makes a list contain itself leaks nothing), and the memory of everything it builds is charged as it
// grows against a bound per file (kMaxPickleMemory) and, through a ParseBudget, per checkpoint.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardkit::convert::torch {

// Which closed list of globals a pickle is read with.
enum class Globals {
  // A torch.save archive's data.pkl: tensors and their storages, containers, DeepSpeed's state classes.
  kTorchSave,
  // PyTorch DCP's .metadata: the dataclasses of torch.distributed.checkpoint.metadata (and its
  // filesystem's _StorageInfo), torch.Size, dtypes, layouts, pathlib.PosixPath; no tensors.
  kDcpMetadata,
};

// Element types of torch storages, by their storage class (torch.FloatStorage, ...).
enum class Dtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };
size_t dtype_size(Dtype dtype) noexcept;
const char* dtype_name(Dtype dtype) noexcept;
// The torch storage class of `dtype` ("FloatStorage", ...), as pickles name it: the reader's table of
// known globals, read the other way, so that the writer names exactly what the reader accepts.
const char* storage_class_name(Dtype dtype) noexcept;

// A storage record of the archive: `<archive>/data/<key>`, `numel` elements of `dtype`.
struct StorageRef {
  std::string key;
  Dtype dtype = Dtype::kF32;
  int64_t numel = 0;
};

// A tensor as _rebuild_tensor_v2 describes it: a view of a storage (which may be larger than the tensor:
// DeepSpeed saves views of padded buffers). The shape and strides are validated to stay inside it.
struct TensorRef {
  const StorageRef* storage = nullptr;
  int64_t offset = 0;  // elements
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  // The unpickler refuses a view whose element count (or that of its non-empty dimensions) passes 2^62,
  // so these never overflow; for a TensorRef made otherwise numel saturates at INT64_MAX.
  int64_t numel() const noexcept;
  // Row-major without gaps (what torch.save writes for every tensor DeepSpeed saves).
  bool contiguous() const noexcept;
};

struct Value {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kTuple,
    kList,
    kSet,
    kDict,
    kGlobal,  // a known global that is not itself a value (a class or function), by qualified name
    kStorage,
    kTensor,
    kObject,  // an instance of a known class: `text` is the class, `pairs` its attributes
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;                                          // str, bytes, or the global's "module.name"
  std::vector<const Value*> items;                           // tuple, list, set
  std::vector<std::pair<const Value*, const Value*>> pairs;  // dict (in order), object attributes
  StorageRef storage;
  TensorRef tensor;
  // Keys sorted for lookup, built by unpickle() for dicts and objects of more than a few pairs, so that
  // looking up every group of a million-group state dict costs O(n log n), not O(n^2).
  struct KeyIndex;
  std::shared_ptr<const KeyIndex> index;

  // The value under string key `key` of a dict or an object's attributes (the last one when a crafted
  // pickle gives it twice), or nullptr.
  const Value* get(std::string_view key) const;
  // The value under integer key `key` of a dict, or nullptr.
  const Value* get(int64_t key) const;
  // "a dict", "an int", ... for messages.
  const char* describe() const;
};

// The result of unpickling: the root value and the arena that owns every value.
class ParseBudget;

class Pickle {
 public:
  const Value& root() const { return *root_; }
  // Bytes charged for its values.
  uint64_t memory() const noexcept { return memory_; }

 private:
  friend Pickle unpickle(std::string_view data, const std::string& where, ParseBudget* budget, Globals globals);
  // Values point at each other: the arena lives on the heap so that moving a Pickle moves no value.
  std::unique_ptr<std::deque<Value>> arena_ = std::make_unique<std::deque<Value>>();
  const Value* root_ = nullptr;
  uint64_t memory_ = 0;
};

inline constexpr size_t kMaxStack = size_t{1} << 20;
inline constexpr size_t kMaxMemo = size_t{1} << 20;
inline constexpr size_t kMaxMarks = 4096;
// Memory of one parsed pickle: every value made (sizeof(Value)), the bytes of its strings, the slots of
// its containers (as their capacity grows), tensor shapes, storage records, memo entries and key
// indexes, charged as they are made. The bound is kPickleMemoryPerByte bytes per byte of pickle, at
// least kMinPickleMemory and at most kMaxPickleMemory: real DeepSpeed files charge 34 to 38 bytes per
// byte (a gpt2-sized model states file: 6 kB of pickle, 0.2 MB), while a crafted one can make each
// byte cost far more (a one-byte EMPTY_DICT makes a Value, a 7-byte call of torch.Size copies a tuple
// of any length).
inline constexpr uint64_t kPickleMemoryPerByte = 64;
inline constexpr uint64_t kMinPickleMemory = uint64_t{64} << 20;
inline constexpr uint64_t kMaxPickleMemory = uint64_t{1} << 30;
// The same, summed over the files of one checkpoint (ParseBudget's default): thousands of ranks' real
// files, not thousands of files each near the per-file bound.
inline constexpr uint64_t kMaxCheckpointPickleMemory = uint64_t{4} << 30;

// A memory budget shared by the pickles of one checkpoint (DeepSpeedCheckpoint holds one and passes it
// to every TorchFile it opens): each unpickle() charges what it builds, in steps of 1 MiB, so many files
// each under kMaxPickleMemory cannot add up without limit. Charges are never given back: one budget
// per checkpoint opened. Thread-safe.
class ParseBudget {
 public:
  explicit ParseBudget(uint64_t limit_bytes = kMaxCheckpointPickleMemory) noexcept : limit_(limit_bytes) {}
  ParseBudget(const ParseBudget&) = delete;
  ParseBudget& operator=(const ParseBudget&) = delete;

  // Adds `bytes`; Error(kInvalidInput) "<where>: ..." once the total passes the limit.
  void charge(uint64_t bytes, const std::string& where);
  uint64_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  uint64_t limit() const noexcept { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

// The attribute under which an object built from a tuple state (a class's own __getstate__) keeps it.
inline constexpr std::string_view kStateAttribute = "__getstate__";

// The dtype a global names (torch.float32, ...), or nullopt when `v` is not one.
std::optional<Dtype> dtype_of(const Value& v) noexcept;

// Runs the pickle in `data` (protocols 2 to 5). `where` names the file for messages. What it builds is
// charged against the per-file bound above and, when given, `budget`.
Pickle unpickle(std::string_view data, const std::string& where, ParseBudget* budget = nullptr,
                Globals globals = Globals::kTorchSave);

}  // namespace shardkit::convert::torch
