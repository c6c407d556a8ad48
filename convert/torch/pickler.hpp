// Python values for torch.save archives, the reverse of the unpickler: a tree of `Value`s (the same type
// the reader produces, so a value read from a DeepSpeed file can be written back) becomes the protocol-2
// pickle `data.pkl` that torch.save writes, with tensors as persistent ids naming their storage records.
//
// The Python classes these files use are written by name from the value's `text` field:
//   * a tuple whose text is "torch.Size" is a torch.Size; a dict whose text is "collections.OrderedDict"
//     an OrderedDict; an int whose text names a class (DeepSpeed's ZeroStageEnum) a member of that enum;
//   * an object (Kind::kObject) is `text` instantiated without arguments and given its pairs as
//     attributes (what pickle does for a plain Python object or a dataclass), or, when its one pair is
//     kStateAttribute, that value as the state its __setstate__ takes (DCP's TensorProperties);
//   * a global (Kind::kGlobal) is `text` itself, such as torch.bfloat16.
// Nothing else names a global, so a file written here asks the loading Python to import only torch,
// collections and the classes the values name.
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "convert/torch/unpickler.hpp"

namespace shardkit::convert::torch {

// Owns values built to be pickled; pointers it hands out stay valid for its lifetime.
class ValueBuilder {
 public:
  using Pairs = std::vector<std::pair<const Value*, const Value*>>;

  const Value* none();
  const Value* boolean(bool b);
  const Value* integer(int64_t i, std::string python_class = {});
  const Value* real(double d);
  const Value* str(std::string s);
  const Value* list(std::vector<const Value*> items);
  const Value* tuple(std::vector<const Value*> items);
  const Value* set(std::vector<const Value*> items);
  const Value* dict(Pairs pairs, bool ordered = false);
  // A dict with string keys, in the order given.
  const Value* dict(std::initializer_list<std::pair<std::string, const Value*>> pairs, bool ordered = false);
  const Value* size(const std::vector<int64_t>& shape);  // torch.Size
  const Value* object(std::string python_class, Pairs attributes);
  const Value* global(std::string qualified_name);
  // A storage record `key` of `numel` elements of `dtype`, and a contiguous tensor of `shape` viewing it
  // from element `offset`.
  const StorageRef* storage(std::string key, Dtype dtype, int64_t numel);
  const Value* tensor(const StorageRef* storage, int64_t offset, const std::vector<int64_t>& shape);

 private:
  Value* make(Value::Kind kind);
  std::deque<Value> values_;
  std::deque<StorageRef> storages_;
};

// The storage records a pickle refers to, in the order they first appear.
struct PickledValue {
  std::string bytes;
  std::vector<const StorageRef*> storages;
};

// Pickles `root` (protocol 2, as torch.save). Storages are identified by their key: two storages with
// one key must be the same record. Error(kInvalidInput) when a value cannot be written (bytes, a tree
// deeper than kMaxPickleDepth or of more than kMaxPickleValues values: a value read from a crafted file
// can share sub-trees that would expand without end).
inline constexpr int kMaxPickleDepth = 256;
inline constexpr int64_t kMaxPickleValues = int64_t{1} << 24;
PickledValue pickle(const Value& root);

}  // namespace shardkit::convert::torch
