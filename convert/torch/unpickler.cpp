#include "convert/torch/unpickler.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>

#include "base/error.hpp"
#include "base/json_input.hpp"

namespace shardkit::convert::torch {

size_t dtype_size(Dtype dtype) noexcept {
  switch (dtype) {
    case Dtype::kF64:
    case Dtype::kI64:
      return 8;
    case Dtype::kF32:
    case Dtype::kI32:
      return 4;
    case Dtype::kF16:
    case Dtype::kBF16:
    case Dtype::kI16:
      return 2;
    case Dtype::kI8:
    case Dtype::kU8:
    case Dtype::kBool:
      return 1;
  }
  return 1;
}

const char* dtype_name(Dtype dtype) noexcept {
  static constexpr std::array<const char*, 10> kNames = {"float64", "float32", "float16", "bfloat16", "int64",
                                                         "int32",   "int16",   "int8",    "uint8",    "bool"};
  return kNames[static_cast<size_t>(dtype)];
}

int64_t TensorRef::numel() const noexcept {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

bool TensorRef::contiguous() const noexcept {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    if (__builtin_mul_overflow(expected, shape[i], &expected)) return false;
  }
  return true;
}

// Keys in sorted order, one entry per key: the value of its last pair.
struct Value::KeyIndex {
  std::vector<std::pair<std::string_view, const Value*>> text;
  std::vector<std::pair<int64_t, const Value*>> integer;
};

namespace {

// Dicts up to this size are scanned: most of a checkpoint's dicts are small, and an index costs more.
constexpr size_t kIndexAbove = 8;

template <typename K>
const Value* find_key(const std::vector<std::pair<K, const Value*>>& sorted, const K& key) {
  const auto it = std::lower_bound(sorted.begin(), sorted.end(), key,
                                   [](const std::pair<K, const Value*>& e, const K& k) { return e.first < k; });
  return it != sorted.end() && it->first == key ? it->second : nullptr;
}

// Sorts (key, value) entries listed in pair order and keeps the last value of each key.
template <typename K>
void sort_keep_last(std::vector<std::pair<K, const Value*>>& entries) {
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t out = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i + 1 < entries.size() && entries[i + 1].first == entries[i].first) continue;
    entries[out++] = entries[i];
  }
  entries.resize(out);
}

}  // namespace

const Value* Value::get(std::string_view key) const {
  if (index) return find_key(index->text, key);
  for (size_t i = pairs.size(); i-- > 0;) {
    if (pairs[i].first->kind == Kind::kString && pairs[i].first->text == key) return pairs[i].second;
  }
  return nullptr;
}

const Value* Value::get(int64_t key) const {
  if (index) return find_key(index->integer, key);
  for (size_t i = pairs.size(); i-- > 0;) {
    if (pairs[i].first->kind == Kind::kInt && pairs[i].first->integer == key) return pairs[i].second;
  }
  return nullptr;
}

void ParseBudget::charge(uint64_t bytes, const std::string& where) {
  const uint64_t total = used_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (total > limit_) {
    fail(ErrorKind::kInvalidInput, where + ": the pickles of this checkpoint's files need more than " +
                                       std::to_string(limit_ >> 20) +
                                       " MiB of memory together (is it a real DeepSpeed checkpoint?)");
  }
}

const char* Value::describe() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "a bool";
    case Kind::kInt:
      return "an int";
    case Kind::kFloat:
      return "a float";
    case Kind::kString:
      return "a str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kTuple:
      return "a tuple";
    case Kind::kList:
      return "a list";
    case Kind::kSet:
      return "a set";
    case Kind::kDict:
      return "a dict";
    case Kind::kGlobal:
      return "a class or function";
    case Kind::kStorage:
      return "a storage";
    case Kind::kTensor:
      return "a tensor";
    case Kind::kObject:
      return "an object";
  }
  return "a value";
}

namespace {

// What each global these files name is to the reader. Nothing else is ever resolved.
enum class Role {
  kOrderedDict,       // collections.OrderedDict(): an empty dict
  kRebuildTensor,     // torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)
  kRebuildParameter,  // torch._utils._rebuild_parameter(tensor, requires_grad, hooks[, state]) (torch 2.x
                      // writes _rebuild_parameter_with_state, with the state, for a Parameter with attributes)
  kRebuildFromType,   // torch._tensor._rebuild_from_type_v2(func, type, args, state): torch 2.x's form of a
                      // tensor that carries Python attributes
  kTensorType,        // torch.Tensor, torch.nn.parameter.Parameter: only as _rebuild_from_type_v2's type
  kSize,              // torch.Size(tuple)
  kSet,               // set(list) / frozenset(list)
  kGetattr,           // getattr(ZeroStageEnum, "member"): how Python 3.11 pickles an Enum member
  kStorageType,       // torch.FloatStorage, ...: only inside a persistent id
  kStageEnum,         // deepspeed's ZeroStageEnum: called with an int, or read through getattr
  kClass,             // a class instantiated with NEWOBJ and given its state with BUILD (DeepSpeed's loss
                      // scalers, DCP's metadata dataclasses)
  kConstant,          // a value that pickles by name: torch.float16, ... (a loss scaler's or DCP tensor's dtype)
  kLayout,            // torch.serialization._get_layout("torch.strided"): the name, as a string
  kLayoutConstant,    // torch.strided named as a global (how shardkit's writer pickles it)
  kMemoryFormat,      // DCP's _MEM_FORMAT_ENCODING(int): the member's integer
  kPath,              // pathlib.PosixPath(*parts): the parts joined by '/', as a string
};

// Which files may name a global: each kind of file has its own closed list.
constexpr unsigned kInTorchSave = 1u << static_cast<unsigned>(Globals::kTorchSave);
constexpr unsigned kInDcpMetadata = 1u << static_cast<unsigned>(Globals::kDcpMetadata);
constexpr unsigned kInBoth = kInTorchSave | kInDcpMetadata;

struct Known {
  std::string_view module;
  std::string_view name;
  Role role;
  Dtype dtype = Dtype::kU8;  // of a storage class or a dtype constant
  unsigned files = kInTorchSave;
};

constexpr std::string_view kDcpMetadataModule = "torch.distributed.checkpoint.metadata";

constexpr Known kKnown[] = {
    {"collections", "OrderedDict", Role::kOrderedDict},
    {"torch._utils", "_rebuild_tensor_v2", Role::kRebuildTensor},
    {"torch._utils", "_rebuild_parameter", Role::kRebuildParameter},
    {"torch._utils", "_rebuild_parameter_with_state", Role::kRebuildParameter},
    {"torch._tensor", "_rebuild_from_type_v2", Role::kRebuildFromType},
    {"torch", "Tensor", Role::kTensorType},
    {"torch.nn.parameter", "Parameter", Role::kTensorType},
    {"torch", "Size", Role::kSize, Dtype::kU8, kInBoth},
    {"torch", "DoubleStorage", Role::kStorageType, Dtype::kF64},
    {"torch", "FloatStorage", Role::kStorageType, Dtype::kF32},
    {"torch", "HalfStorage", Role::kStorageType, Dtype::kF16},
    {"torch", "BFloat16Storage", Role::kStorageType, Dtype::kBF16},
    {"torch", "LongStorage", Role::kStorageType, Dtype::kI64},
    {"torch", "IntStorage", Role::kStorageType, Dtype::kI32},
    {"torch", "ShortStorage", Role::kStorageType, Dtype::kI16},
    {"torch", "CharStorage", Role::kStorageType, Dtype::kI8},
    {"torch", "ByteStorage", Role::kStorageType, Dtype::kU8},
    {"torch", "BoolStorage", Role::kStorageType, Dtype::kBool},
    {"torch", "UntypedStorage", Role::kStorageType, Dtype::kU8},
    {"torch", "float64", Role::kConstant, Dtype::kF64, kInBoth},
    {"torch", "float32", Role::kConstant, Dtype::kF32, kInBoth},
    {"torch", "float16", Role::kConstant, Dtype::kF16, kInBoth},
    {"torch", "bfloat16", Role::kConstant, Dtype::kBF16, kInBoth},
    {"torch", "int64", Role::kConstant, Dtype::kI64, kInDcpMetadata},
    {"torch", "int32", Role::kConstant, Dtype::kI32, kInDcpMetadata},
    {"torch", "int16", Role::kConstant, Dtype::kI16, kInDcpMetadata},
    {"torch", "int8", Role::kConstant, Dtype::kI8, kInDcpMetadata},
    {"torch", "uint8", Role::kConstant, Dtype::kU8, kInDcpMetadata},
    {"torch", "bool", Role::kConstant, Dtype::kBool, kInDcpMetadata},
    // Protocol 2 names the builtins module "__builtin__" (Python 2's name); protocol 3+ "builtins".
    {"__builtin__", "set", Role::kSet},
    {"__builtin__", "frozenset", Role::kSet},
    {"__builtin__", "getattr", Role::kGetattr},
    {"builtins", "set", Role::kSet},
    {"builtins", "frozenset", Role::kSet},
    {"builtins", "getattr", Role::kGetattr},
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", Role::kStageEnum},
    {"deepspeed.runtime.fp16.loss_scaler", "LossScaler", Role::kClass},
    {"deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler", Role::kClass},
    {"deepspeed.utils.tensor_fragment", "fragment_address", Role::kClass},
    // The dataclasses of PyTorch DCP's .metadata file and what their fields pickle as.
    {kDcpMetadataModule, "Metadata", Role::kClass, Dtype::kU8, kInDcpMetadata},
    {kDcpMetadataModule, "TensorStorageMetadata", Role::kClass, Dtype::kU8, kInDcpMetadata},
    {kDcpMetadataModule, "BytesStorageMetadata", Role::kClass, Dtype::kU8, kInDcpMetadata},
    {kDcpMetadataModule, "ChunkStorageMetadata", Role::kClass, Dtype::kU8, kInDcpMetadata},
    {kDcpMetadataModule, "TensorProperties", Role::kClass, Dtype::kU8, kInDcpMetadata},
    {kDcpMetadataModule, "MetadataIndex", Role::kClass, Dtype::kU8, kInDcpMetadata},
    {kDcpMetadataModule, "StorageMeta", Role::kClass, Dtype::kU8, kInDcpMetadata},
    {kDcpMetadataModule, "_MEM_FORMAT_ENCODING", Role::kMemoryFormat, Dtype::kU8, kInDcpMetadata},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo", Role::kClass, Dtype::kU8, kInDcpMetadata},
    {"torch.serialization", "_get_layout", Role::kLayout, Dtype::kU8, kInDcpMetadata},
    {"torch", "strided", Role::kLayoutConstant, Dtype::kU8, kInDcpMetadata},
    {"pathlib", "PosixPath", Role::kPath, Dtype::kU8, kInDcpMetadata},
};

// ZeroStageEnum's members and values (deepspeed/runtime/zero/config.py).
constexpr std::pair<std::string_view, int64_t> kStageMembers[] = {
    {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};

// Bytes of bookkeeping charged per memo entry and per storage record (hash map nodes).
constexpr uint64_t kMapNodeBytes = 64;
// Charges reach the checkpoint's budget in steps of this many bytes (fewer atomic operations).
constexpr uint64_t kBudgetStep = uint64_t{1} << 20;

}  // namespace

std::optional<Dtype> dtype_of(const Value& v) noexcept {
  if (v.kind != Value::Kind::kGlobal) return std::nullopt;
  const Known& k = kKnown[static_cast<size_t>(v.integer)];
  if (k.role != Role::kConstant) return std::nullopt;
  return k.dtype;
}

const char* storage_class_name(Dtype dtype) noexcept {
  for (const Known& k : kKnown) {
    if (k.role == Role::kStorageType && k.dtype == dtype) return k.name.data();
  }
  return "ByteStorage";
}

namespace {

class Machine {
 public:
  Machine(std::string_view data, const std::string& where, std::deque<Value>& arena, ParseBudget* budget,
          Globals globals)
      : data_(data),
        where_(where),
        arena_(arena),
        budget_(budget),
        globals_(globals),
        limit_(std::clamp<uint64_t>(data.size() * kPickleMemoryPerByte, kMinPickleMemory, kMaxPickleMemory)) {}

  const Value* run();
  // Indexes the keys of every large dict and object; charges the rest to the budget. Returns the bytes
  // charged in all.
  uint64_t finish();

 private:
  [[noreturn]] void refuse(const std::string& what) const {
    fail(ErrorKind::kInvalidInput, where_ + (globals_ == Globals::kTorchSave ? ": data.pkl byte " : ": pickle byte ") +
                                       std::to_string(op_at_) + ": " + what);
  }
  const unsigned char* take(size_t n) {
    if (data_.size() - pos_ < n) refuse("the pickle ends inside an instruction (truncated?)");
    const auto* p = reinterpret_cast<const unsigned char*>(data_.data() + pos_);
    pos_ += n;
    return p;
  }
  uint64_t le(size_t n) {
    const unsigned char* p = take(n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
  }
  std::string_view bytes(uint64_t n) {
    if (n > data_.size() - pos_) {
      refuse("a string of " + std::to_string(n) + " bytes runs past the end of the pickle");
    }
    return {reinterpret_cast<const char*>(take(static_cast<size_t>(n))), static_cast<size_t>(n)};
  }
  std::string_view line() {
    const size_t end = data_.find('\n', pos_);
    if (end == std::string_view::npos) refuse("the pickle ends inside a GLOBAL instruction");
    const std::string_view s = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  // Every allocation the pickle asks for is charged here first, so that a crafted one is refused
  // before its memory is taken.
  void charge(uint64_t bytes) {
    used_ += bytes;
    if (used_ > limit_) {
      refuse("the parsed pickle needs more than " + std::to_string(limit_ >> 20) + " MiB of memory (" +
             std::to_string(kPickleMemoryPerByte) + " bytes per byte of its " + std::to_string(data_.size()) +
             " bytes; real DeepSpeed files need under 40)");
    }
    if (budget_ && used_ - flushed_ >= kBudgetStep) {
      budget_->charge(used_ - flushed_, where_);
      flushed_ = used_;
    }
  }
  // Makes room for `more` slots in `v`, charging the capacity it grows by.
  template <typename T>
  void grow(std::vector<T>& v, size_t more) {
    if (v.capacity() - v.size() >= more) return;
    const size_t want = std::max(v.size() + more, 2 * v.capacity());
    charge((want - v.capacity()) * sizeof(T));
    v.reserve(want);
  }
  void set_text(Value* v, std::string_view text) {
    charge(text.size());
    v->text = std::string(text);
  }
  void add_items(Value* v, const std::vector<const Value*>& items) {
    grow(v->items, items.size());
    v->items.insert(v->items.end(), items.begin(), items.end());
  }
  Value* make(Value::Kind kind) {
    charge(sizeof(Value));
    Value& v = arena_.emplace_back();
    v.kind = kind;
    return &v;
  }
  void push(Value* v) {
    if (stack_.size() >= kMaxStack) refuse("the stack grows past " + std::to_string(kMaxStack) + " entries");
    stack_.push_back(v);
  }
  Value* pop() {
    if (stack_.size() <= floor()) refuse("an instruction needs a value the stack does not hold");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top() {
    if (stack_.size() <= floor()) refuse("an instruction needs a value the stack does not hold");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The values above the last MARK, which is removed.
  std::vector<Value*> pop_mark() {
    if (marks_.empty()) refuse("an instruction needs a MARK that was not set");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  void memo_put(uint64_t index) {
    if (index >= kMaxMemo) refuse("memo index " + std::to_string(index) + " is past the bound");
    if (!memo_.count(index)) charge(kMapNodeBytes);
    memo_[index] = top();
    if (memo_.size() > kMaxMemo) refuse("the memo grows past its bound");
  }
  Value* memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) refuse("memo entry " + std::to_string(index) + " was never stored");
    return it->second;
  }
  Value* integer(int64_t i) {
    Value* v = make(Value::Kind::kInt);
    v->integer = i;
    return v;
  }
  Value* tuple(const std::vector<Value*>& items) {
    Value* v = make(Value::Kind::kTuple);
    grow(v->items, items.size());
    v->items.assign(items.begin(), items.end());
    return v;
  }
  Value* global(std::string_view module, std::string_view name);
  Value* reduce(const Value* callable, const Value* args);
  void index_keys(Value* v);
  Value* rebuild_tensor(const Value& args);
  Value* persistent(const Value* pid);
  void build(Value* target, const Value* state);
  void set_item(Value* dict, Value* key, Value* value) {
    if (dict->kind != Value::Kind::kDict) refuse(std::string("SETITEM on ") + dict->describe());
    grow(dict->pairs, 1);
    dict->pairs.emplace_back(key, value);
  }
  void append(Value* list, Value* item) {
    if (list->kind != Value::Kind::kList && list->kind != Value::Kind::kSet) {
      refuse(std::string("APPEND on ") + list->describe());
    }
    grow(list->items, 1);
    list->items.push_back(item);
  }
  const Known& known(const Value* v) const { return kKnown[static_cast<size_t>(v->integer)]; }

  std::string_view data_;
  const std::string& where_;
  std::deque<Value>& arena_;
  ParseBudget* budget_;
  const Globals globals_;
  const uint64_t limit_;  // bytes this pickle may charge
  uint64_t used_ = 0;     // bytes charged for this pickle
  uint64_t flushed_ = 0;  // of which passed on to budget_
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;
  std::unordered_map<std::string, const StorageRef*> storages_;
};

Value* Machine::global(std::string_view module, std::string_view name) {
  for (size_t i = 0; i < std::size(kKnown); ++i) {
    if (kKnown[i].module == module && kKnown[i].name == name &&
        (kKnown[i].files & (1u << static_cast<unsigned>(globals_)))) {
      Value* v = make(Value::Kind::kGlobal);
      set_text(v, std::string(module) + "." + std::string(name));
      v->integer = static_cast<int64_t>(i);  // index into kKnown
      return v;
    }
  }
  refuse("refused the Python global " + quoted_excerpt(std::string(module) + "." + std::string(name)) +
         (globals_ == Globals::kTorchSave
              ? ": DeepSpeed checkpoints need only torch tensors, containers and DeepSpeed's own state classes"
              : ": a DCP .metadata file needs only torch.distributed.checkpoint.metadata's classes"));
}

Value* Machine::rebuild_tensor(const Value& args) {
  if (args.items.size() < 4 || args.items[0]->kind != Value::Kind::kStorage) {
    refuse("_rebuild_tensor_v2 called without (storage, offset, size, stride, ...)");
  }
  Value* v = make(Value::Kind::kTensor);
  TensorRef& t = v->tensor;
  t.storage = &args.items[0]->storage;
  const Value* offset = args.items[1];
  const Value* size = args.items[2];
  const Value* stride = args.items[3];
  if (offset->kind != Value::Kind::kInt || offset->integer < 0) refuse("a tensor with a bad storage offset");
  if (size->kind != Value::Kind::kTuple || stride->kind != Value::Kind::kTuple ||
      size->items.size() != stride->items.size() || size->items.size() > 64) {
    refuse("a tensor whose size and stride are not tuples of one length (at most 64)");
  }
  t.offset = offset->integer;
  // The last element the view reaches must lie inside the storage; with each step bounded by it,
  // nothing there overflows. A stride of 0 reaches no further however large the size, so the element
  // count is bounded on its own (with and without the empty dimensions: contiguous() multiplies the
  // sizes of the others).
  constexpr int64_t kMaxElements = int64_t{1} << 62;
  const int64_t limit = t.storage->numel;
  int64_t last = t.offset;
  int64_t numel = 1;
  int64_t nonempty = 1;  // product of the sizes other than 0
  charge(2 * size->items.size() * sizeof(int64_t));
  for (size_t i = 0; i < size->items.size(); ++i) {
    const Value* d = size->items[i];
    const Value* s = stride->items[i];
    if (d->kind != Value::Kind::kInt || s->kind != Value::Kind::kInt || d->integer < 0 || s->integer < 0) {
      refuse("a tensor with a negative or non-integer size or stride");
    }
    t.shape.push_back(d->integer);
    t.stride.push_back(s->integer);
    if (d->integer == 0) numel = 0;
    if (d->integer != 0 && (__builtin_mul_overflow(nonempty, d->integer, &nonempty) || nonempty > kMaxElements)) {
      refuse("a tensor of more than 2^62 elements");
    }
  }
  if (numel != 0) {
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (t.shape[i] > limit || (t.stride[i] != 0 && (t.shape[i] - 1) > (limit - last) / t.stride[i])) {
        refuse("a tensor of shape reaching past its storage " + quoted_excerpt(t.storage->key) + " of " +
               std::to_string(limit) + " elements");
      }
      last += (t.shape[i] - 1) * t.stride[i];
    }
    if (last >= limit) {
      refuse("a tensor reaching past its storage " + quoted_excerpt(t.storage->key) + " of " + std::to_string(limit) +
             " elements");
    }
  } else if (t.offset > limit) {
    refuse("an empty tensor at an offset past its storage");
  }
  return v;
}

Value* Machine::reduce(const Value* callable, const Value* args) {
  if (callable->kind != Value::Kind::kGlobal) refuse(std::string("REDUCE calls ") + callable->describe());
  if (args->kind != Value::Kind::kTuple) refuse("REDUCE with arguments that are not a tuple");
  const Known& k = known(callable);
  const auto& a = args->items;
  switch (k.role) {
    case Role::kOrderedDict:
      if (!a.empty()) refuse("OrderedDict called with arguments");
      return make(Value::Kind::kDict);
    case Role::kRebuildTensor:
      return rebuild_tensor(*args);
    case Role::kRebuildParameter:
      // The requires_grad flag, the hooks and a Parameter's attribute state say nothing about its values.
      if (a.empty() || a[0]->kind != Value::Kind::kTensor) refuse("_rebuild_parameter called without a tensor");
      return const_cast<Value*>(a[0]);
    case Role::kRebuildFromType: {
      // (func, type, args, state): func(*args) rebuilds the tensor, type is the class to cast it to, and
      // state the Python attributes to set on it (DeepSpeed's ds_* bookkeeping), which are dropped. Only
      // the tensor rebuild functions are applied, once: func cannot be _rebuild_from_type_v2 itself.
      if (a.size() != 4 || a[0]->kind != Value::Kind::kGlobal || a[1]->kind != Value::Kind::kGlobal ||
          a[2]->kind != Value::Kind::kTuple) {
        refuse("_rebuild_from_type_v2 called without (function, type, arguments, state)");
      }
      const Role func = known(a[0]).role;
      if (func != Role::kRebuildTensor && func != Role::kRebuildParameter) {
        refuse("_rebuild_from_type_v2 applies " + quoted_excerpt(a[0]->text) +
               "; only torch's tensor rebuild functions are read");
      }
      if (known(a[1]).role != Role::kTensorType) {
        refuse("_rebuild_from_type_v2 makes a " + quoted_excerpt(a[1]->text) +
               "; only torch.Tensor and torch.nn.parameter.Parameter are read");
      }
      return reduce(a[0], a[2]);
    }
    case Role::kSize: {
      if (a.size() != 1 || a[0]->kind != Value::Kind::kTuple) refuse("torch.Size called without a tuple");
      Value* v = make(Value::Kind::kTuple);
      add_items(v, a[0]->items);
      return v;
    }
    case Role::kSet: {
      Value* v = make(Value::Kind::kSet);
      if (a.size() == 1 && (a[0]->kind == Value::Kind::kList || a[0]->kind == Value::Kind::kTuple)) {
        add_items(v, a[0]->items);
      } else if (!a.empty()) {
        refuse("set called with something other than a list");
      }
      return v;
    }
    case Role::kGetattr: {
      if (a.size() != 2 || a[0]->kind != Value::Kind::kGlobal || known(a[0]).role != Role::kStageEnum ||
          a[1]->kind != Value::Kind::kString) {
        refuse("getattr is only read on ZeroStageEnum");
      }
      for (const auto& [member, value] : kStageMembers) {
        if (member == a[1]->text) return integer(value);
      }
      refuse("ZeroStageEnum has no member " + quoted_excerpt(a[1]->text));
    }
    case Role::kStageEnum:
      if (a.size() != 1 || a[0]->kind != Value::Kind::kInt || a[0]->integer < 0 || a[0]->integer > 3) {
        refuse("ZeroStageEnum called without a stage 0-3");
      }
      return integer(a[0]->integer);
    case Role::kMemoryFormat:
      // torch.contiguous_format, channels_last, preserve_format.
      if (a.size() != 1 || a[0]->kind != Value::Kind::kInt || a[0]->integer < 0 || a[0]->integer > 2) {
        refuse("_MEM_FORMAT_ENCODING called without a member 0-2");
      }
      return integer(a[0]->integer);
    case Role::kLayout: {
      if (a.size() != 1 || a[0]->kind != Value::Kind::kString) refuse("_get_layout called without a name");
      Value* v = make(Value::Kind::kString);
      set_text(v, a[0]->text);
      return v;
    }
    case Role::kPath: {
      std::string path;
      for (const Value* part : a) {
        if (part->kind != Value::Kind::kString) refuse("PosixPath called with " + std::string(part->describe()));
        if (!path.empty() && path.back() != '/') path += '/';
        path += part->text;
      }
      Value* v = make(Value::Kind::kString);
      set_text(v, path);
      return v;
    }
    case Role::kStorageType:
    case Role::kTensorType:
    case Role::kClass:
    case Role::kConstant:
    case Role::kLayoutConstant:
      break;
  }
  refuse("'" + callable->text + "' is not called by REDUCE in these files");
}

Value* Machine::persistent(const Value* pid) {
  if (globals_ != Globals::kTorchSave) refuse("a persistent id (a tensor) in a file that holds none");
  // ('storage', storage class, key, location, numel)
  if (pid->kind != Value::Kind::kTuple || pid->items.size() != 5 || pid->items[0]->kind != Value::Kind::kString ||
      pid->items[0]->text != "storage" || pid->items[1]->kind != Value::Kind::kGlobal ||
      known(pid->items[1]).role != Role::kStorageType || pid->items[2]->kind != Value::Kind::kString ||
      pid->items[4]->kind != Value::Kind::kInt || pid->items[4]->integer < 0) {
    refuse("a persistent id that is not ('storage', <torch storage class>, key, location, numel)");
  }
  const std::string& key = pid->items[2]->text;
  if (key.empty() || key.size() > 64 ||
      key.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_") != std::string::npos) {
    refuse("a storage key " + quoted_excerpt(key) + " that is not a short alphanumeric name");
  }
  Value* v = make(Value::Kind::kStorage);
  charge(key.size() + kMapNodeBytes);
  v->storage = {key, known(pid->items[1]).dtype, pid->items[4]->integer};
  // One storage record, one element type and size, however many tensors view it.
  const auto [it, fresh] = storages_.emplace(key, &v->storage);
  if (!fresh && (it->second->dtype != v->storage.dtype || it->second->numel != v->storage.numel)) {
    refuse("storage '" + key + "' is declared twice with different types or sizes");
  }
  return v;
}

void Machine::build(Value* target, const Value* state) {
  // A (dict, slots) pair from classes with __slots__; only the dict part carries attributes here.
  if (state->kind == Value::Kind::kTuple && state->items.size() == 2 &&
      (state->items[0]->kind == Value::Kind::kDict || state->items[0]->kind == Value::Kind::kNone)) {
    state = state->items[0];
  }
  if (state->kind == Value::Kind::kNone) return;
  if (state->kind == Value::Kind::kTuple && target->kind == Value::Kind::kObject) {
    // What a class's own __getstate__ returned (DCP's TensorProperties: its fields in order): kept whole
    // as the attribute kStateAttribute.
    Value* key = make(Value::Kind::kString);
    set_text(key, kStateAttribute);
    grow(target->pairs, 1);
    target->pairs.emplace_back(key, state);
    return;
  }
  if (state->kind != Value::Kind::kDict) refuse("BUILD with a state that is not a dict");
  if (target->kind == Value::Kind::kObject) {
    grow(target->pairs, state->pairs.size());
    target->pairs.insert(target->pairs.end(), state->pairs.begin(), state->pairs.end());
  } else if (target->kind != Value::Kind::kDict) {
    // A state dict's OrderedDict gets its `_metadata` attribute this way; nothing else is built.
    refuse(std::string("BUILD on ") + target->describe());
  }
}

const Value* Machine::run() {
  while (true) {
    op_at_ = pos_;
    const unsigned char op = *take(1);
    switch (op) {
      case 0x80:  // PROTO
        if (*take(1) > 5) refuse("pickle protocol above 5");
        break;
      case 0x95:  // FRAME: a length hint only
        take(8);
        break;
      case '.':  // STOP
        if (stack_.size() != 1 || !marks_.empty()) refuse("STOP with " + std::to_string(stack_.size()) + " values");
        return stack_.back();
      case '(':  // MARK
        if (marks_.size() >= kMaxMarks) refuse("MARKs nested deeper than " + std::to_string(kMaxMarks));
        marks_.push_back(stack_.size());
        break;
      case '0':  // POP
        pop();
        break;
      case '1':  // POP_MARK
        pop_mark();
        break;
      case '2':  // DUP
        push(top());
        break;
      case 'c': {  // GLOBAL
        const std::string_view module = line();
        const std::string_view name = line();
        push(global(module, name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        Value* name = pop();
        Value* module = pop();
        if (module->kind != Value::Kind::kString || name->kind != Value::Kind::kString) {
          refuse("STACK_GLOBAL without two strings");
        }
        push(global(module->text, name->text));
        break;
      }
      case 'q':  // BINPUT
        memo_put(le(1));
        break;
      case 'r':  // LONG_BINPUT
        memo_put(le(4));
        break;
      case 0x94:  // MEMOIZE
        memo_put(memo_.size());
        break;
      case 'h':  // BINGET
        push(memo_get(le(1)));
        break;
      case 'j':  // LONG_BINGET
        push(memo_get(le(4)));
        break;
      case ')':  // EMPTY_TUPLE
        push(make(Value::Kind::kTuple));
        break;
      case 't':  // TUPLE
        push(tuple(pop_mark()));
        break;
      case 0x85:    // TUPLE1
      case 0x86:    // TUPLE2
      case 0x87: {  // TUPLE3
        const size_t n = static_cast<size_t>(op - 0x84);
        if (stack_.size() < floor() + n) refuse("TUPLE" + std::to_string(n) + " with too few values");
        std::vector<Value*> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        push(tuple(std::move(items)));
        break;
      }
      case ']':  // EMPTY_LIST
        push(make(Value::Kind::kList));
        break;
      case 'l': {  // LIST
        Value* v = make(Value::Kind::kList);
        const std::vector<Value*> items = pop_mark();
        grow(v->items, items.size());
        v->items.assign(items.begin(), items.end());
        push(v);
        break;
      }
      case 'a': {  // APPEND
        Value* item = pop();
        append(top(), item);
        break;
      }
      case 'e':     // APPENDS
      case 0x90: {  // ADDITEMS
        const std::vector<Value*> items = pop_mark();
        Value* list = top();
        for (Value* item : items) append(list, item);
        break;
      }
      case 0x8f:  // EMPTY_SET
        push(make(Value::Kind::kSet));
        break;
      case 0x91: {  // FROZENSET
        Value* v = make(Value::Kind::kSet);
        const std::vector<Value*> items = pop_mark();
        grow(v->items, items.size());
        v->items.assign(items.begin(), items.end());
        push(v);
        break;
      }
      case '}':  // EMPTY_DICT
        push(make(Value::Kind::kDict));
        break;
      case 'd': {  // DICT
        const std::vector<Value*> items = pop_mark();
        if (items.size() % 2) refuse("DICT with an odd number of values");
        Value* v = make(Value::Kind::kDict);
        for (size_t i = 0; i < items.size(); i += 2) set_item(v, items[i], items[i + 1]);
        push(v);
        break;
      }
      case 's': {  // SETITEM
        Value* value = pop();
        Value* key = pop();
        set_item(top(), key, value);
        break;
      }
      case 'u': {  // SETITEMS
        const std::vector<Value*> items = pop_mark();
        if (items.size() % 2) refuse("SETITEMS with an odd number of values");
        Value* dict = top();
        for (size_t i = 0; i < items.size(); i += 2) set_item(dict, items[i], items[i + 1]);
        break;
      }
      case 'X':     // BINUNICODE
      case 0x8c:    // SHORT_BINUNICODE
      case 0x8d:    // BINUNICODE8
      case 'B':     // BINBYTES
      case 'C':     // SHORT_BINBYTES
      case 0x8e: {  // BINBYTES8
        const bool unicode = op == 'X' || op == 0x8c || op == 0x8d;
        const size_t width = (op == 0x8c || op == 'C') ? 1 : (op == 0x8d || op == 0x8e) ? 8 : 4;
        Value* v = make(unicode ? Value::Kind::kString : Value::Kind::kBytes);
        set_text(v, bytes(le(width)));
        push(v);
        break;
      }
      case 'J':  // BININT (signed)
        push(integer(static_cast<int32_t>(static_cast<uint32_t>(le(4)))));
        break;
      case 'K':  // BININT1
        push(integer(static_cast<int64_t>(le(1))));
        break;
      case 'M':  // BININT2
        push(integer(static_cast<int64_t>(le(2))));
        break;
      case 0x8a: {  // LONG1: little-endian two's complement of n bytes
        const size_t n = static_cast<size_t>(le(1));
        if (n > 8) refuse("an integer of " + std::to_string(n) + " bytes (at most 8 are read)");
        uint64_t raw = n ? le(n) : 0;
        if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t{0} << (8 * n);  // sign-extend
        push(integer(static_cast<int64_t>(raw)));
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        const unsigned char* p = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
        Value* v = make(Value::Kind::kFloat);
        v->real = std::bit_cast<double>(bits);
        push(v);
        break;
      }
      case 0x88:    // NEWTRUE
      case 0x89: {  // NEWFALSE
        Value* v = make(Value::Kind::kBool);
        v->boolean = op == 0x88;
        push(v);
        break;
      }
      case 'N':  // NONE
        push(make(Value::Kind::kNone));
        break;
      case 'R': {  // REDUCE
        Value* args = pop();
        Value* callable = pop();
        push(reduce(callable, args));
        break;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
        Value* args = pop();
        Value* cls = pop();
        if (cls->kind != Value::Kind::kGlobal || known(cls).role != Role::kClass) {
          refuse("NEWOBJ of " + (cls->kind == Value::Kind::kGlobal ? "'" + cls->text + "'" : cls->describe()));
        }
        if (args->kind != Value::Kind::kTuple) refuse("NEWOBJ with arguments that are not a tuple");
        Value* v = make(Value::Kind::kObject);
        set_text(v, cls->text);
        push(v);
        break;
      }
      case 'b': {  // BUILD
        Value* state = pop();
        build(top(), state);
        break;
      }
      case 'Q': {  // BINPERSID
        Value* pid = pop();
        push(persistent(pid));
        break;
      }
      default: {
        static const char* hex = "0123456789abcdef";
        refuse(std::string("opcode 0x") + hex[op >> 4] + hex[op & 15] + " is not one torch.save writes");
      }
    }
  }
}

void Machine::index_keys(Value* v) {
  auto index = std::make_shared<Value::KeyIndex>();
  for (const auto& [key, value] : v->pairs) {
    if (key->kind == Value::Kind::kString) index->text.emplace_back(key->text, value);
    if (key->kind == Value::Kind::kInt) index->integer.emplace_back(key->integer, value);
  }
  charge(sizeof(Value::KeyIndex) + index->text.size() * sizeof(index->text[0]) +
         index->integer.size() * sizeof(index->integer[0]));
  sort_keep_last(index->text);
  sort_keep_last(index->integer);
  v->index = std::move(index);
}

uint64_t Machine::finish() {
  op_at_ = pos_;
  for (Value& v : arena_) {
    if ((v.kind == Value::Kind::kDict || v.kind == Value::Kind::kObject) && v.pairs.size() > kIndexAbove) {
      index_keys(&v);
    }
  }
  if (budget_ && used_ > flushed_) budget_->charge(used_ - flushed_, where_);
  flushed_ = used_;
  return used_;
}

}  // namespace

Pickle unpickle(std::string_view data, const std::string& where, ParseBudget* budget, Globals globals) {
  Pickle p;
  Machine m(data, where, *p.arena_, budget, globals);
  p.root_ = m.run();
  p.memory_ = m.finish();
  return p;
}

}  // namespace shardkit::convert::torch
