// A restricted reader of the Python pickles inside torch.save archives (`data.pkl`), written for the
// files DeepSpeed saves: it builds plain values (None, bool, int, float, str, bytes, tuple, list, dict,
// set) and knows a fixed list of Python globals by name, never loading or running anything. Tensors
// come out as references to their storage record (which the caller reads from the archive); the
// DeepSpeed classes the files name (loss scalers, fragment addresses) come out as objects with their
// attribute dictionary; ZeroStageEnum members as their integer.
//
// Everything else is refused with a one-line Error(kInvalidInput): a global outside the list (named by
// module and name, e.g. "os.system"), an opcode these files never contain, a memo index never
// stored, a length past the end of the data, a stack deeper than kMaxStack. The machine is a loop over
// the bytes (no recursion), every object lives in an arena owned by the result (a crafted pickle that
// makes a list contain itself leaks nothing), and the number of objects is bounded by the number of
// bytes read.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardkit::convert::deepspeed {

// Element types of torch storages, by their storage class (torch.FloatStorage, ...).
enum class Dtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };
size_t dtype_size(Dtype dtype) noexcept;
const char* dtype_name(Dtype dtype) noexcept;

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

  // The value under string key `key` of a dict or an object's attributes (the last one when a crafted
  // pickle gives it twice), or nullptr.
  const Value* get(std::string_view key) const;
  // The value under integer key `key` of a dict, or nullptr.
  const Value* get(int64_t key) const;
  // "a dict", "an int", ... for messages.
  const char* describe() const;
};

// The result of unpickling: the root value and the arena that owns every value.
class Pickle {
 public:
  const Value& root() const { return *root_; }

 private:
  friend Pickle unpickle(std::string_view data, const std::string& where);
  // Values point at each other: the arena lives on the heap so that moving a Pickle moves no value.
  std::unique_ptr<std::deque<Value>> arena_ = std::make_unique<std::deque<Value>>();
  const Value* root_ = nullptr;
};

inline constexpr size_t kMaxStack = size_t{1} << 20;
inline constexpr size_t kMaxMemo = size_t{1} << 20;
inline constexpr size_t kMaxMarks = 4096;
// Objects made, all kinds together: a real DeepSpeed data.pkl makes a few per tensor (thousands); the
// bound caps what a crafted one of repeated one-byte instructions can allocate (about 0.25 GB).
inline constexpr size_t kMaxValues = size_t{1} << 20;

// Runs the pickle in `data` (protocols 2 to 5). `where` names the file for messages.
Pickle unpickle(std::string_view data, const std::string& where);

}  // namespace shardkit::convert::deepspeed
