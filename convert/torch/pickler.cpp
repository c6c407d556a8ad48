#include "convert/torch/pickler.hpp"

#include <bit>
#include <map>

#include "base/error.hpp"

namespace shardkit::convert::torch {

Value* ValueBuilder::make(Value::Kind kind) {
  Value& v = values_.emplace_back();
  v.kind = kind;
  return &v;
}

const Value* ValueBuilder::none() {
  return make(Value::Kind::kNone);
}

const Value* ValueBuilder::boolean(bool b) {
  Value* v = make(Value::Kind::kBool);
  v->boolean = b;
  return v;
}

const Value* ValueBuilder::integer(int64_t i, std::string python_class) {
  Value* v = make(Value::Kind::kInt);
  v->integer = i;
  v->text = std::move(python_class);
  return v;
}

const Value* ValueBuilder::real(double d) {
  Value* v = make(Value::Kind::kFloat);
  v->real = d;
  return v;
}

const Value* ValueBuilder::str(std::string s) {
  Value* v = make(Value::Kind::kString);
  v->text = std::move(s);
  return v;
}

const Value* ValueBuilder::list(std::vector<const Value*> items) {
  Value* v = make(Value::Kind::kList);
  v->items = std::move(items);
  return v;
}

const Value* ValueBuilder::tuple(std::vector<const Value*> items) {
  Value* v = make(Value::Kind::kTuple);
  v->items = std::move(items);
  return v;
}

const Value* ValueBuilder::set(std::vector<const Value*> items) {
  Value* v = make(Value::Kind::kSet);
  v->items = std::move(items);
  return v;
}

const Value* ValueBuilder::dict(Pairs pairs, bool ordered) {
  Value* v = make(Value::Kind::kDict);
  v->pairs = std::move(pairs);
  if (ordered) v->text = "collections.OrderedDict";
  return v;
}

const Value* ValueBuilder::dict(std::initializer_list<std::pair<std::string, const Value*>> pairs, bool ordered) {
  Pairs p;
  for (const auto& [key, value] : pairs) p.emplace_back(str(key), value);
  return dict(std::move(p), ordered);
}

const Value* ValueBuilder::size(const std::vector<int64_t>& shape) {
  std::vector<const Value*> dims;
  for (int64_t d : shape) dims.push_back(integer(d));
  Value* v = make(Value::Kind::kTuple);
  v->items = std::move(dims);
  v->text = "torch.Size";
  return v;
}

const Value* ValueBuilder::object(std::string python_class, Pairs attributes) {
  Value* v = make(Value::Kind::kObject);
  v->text = std::move(python_class);
  v->pairs = std::move(attributes);
  return v;
}

const Value* ValueBuilder::global(std::string qualified_name) {
  Value* v = make(Value::Kind::kGlobal);
  v->text = std::move(qualified_name);
  return v;
}

const StorageRef* ValueBuilder::storage(std::string key, Dtype dtype, int64_t numel) {
  return &storages_.emplace_back(StorageRef{std::move(key), dtype, numel});
}

const Value* ValueBuilder::tensor(const StorageRef* storage, int64_t offset, const std::vector<int64_t>& shape) {
  Value* v = make(Value::Kind::kTensor);
  v->tensor.storage = storage;
  v->tensor.offset = offset;
  v->tensor.shape = shape;
  v->tensor.stride.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) v->tensor.stride[i - 1] = v->tensor.stride[i] * shape[i];
  return v;
}

namespace {

// Opcodes of protocol 2 (pickletools names them).
constexpr char kProto = '\x80', kStop = '.', kMark = '(', kNone = 'N', kNewTrue = '\x88', kNewFalse = '\x89',
               kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kLong1 = '\x8a', kBinFloat = 'G', kBinUnicode = 'X',
               kEmptyTuple = ')', kTuple = 't', kTuple1 = '\x85', kTuple2 = '\x86', kTuple3 = '\x87', kEmptyList = ']',
               kAppends = 'e', kEmptyDict = '}', kSetItems = 'u', kGlobal = 'c', kReduce = 'R', kNewObj = '\x81',
               kBuild = 'b', kBinPersId = 'Q';
// pickle batches APPENDS and SETITEMS by this many items.
constexpr size_t kBatch = 1000;

class Writer {
 public:
  PickledValue run(const Value& root) {
    out_.bytes.push_back(kProto);
    out_.bytes.push_back('\x02');
    value(root, 0);
    out_.bytes.push_back(kStop);
    return std::move(out_);
  }

 private:
  [[noreturn]] static void refuse(const std::string& what) {
    fail(ErrorKind::kInvalidInput, "cannot write this value into a torch.save file: " + what);
  }
  void op(char c) { out_.bytes.push_back(c); }
  void le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void global(const std::string& qualified) {
    const size_t dot = qualified.rfind('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == qualified.size() ||
        qualified.find_first_of("\n\r") != std::string::npos) {
      refuse("the Python name " + qualified + " is not module.name");
    }
    op(kGlobal);
    out_.bytes += qualified.substr(0, dot);
    out_.bytes += '\n';
    out_.bytes += qualified.substr(dot + 1);
    out_.bytes += '\n';
  }
  void integer(int64_t i) {
    if (i >= 0 && i < 256) {
      op(kBinInt1);
      le(static_cast<uint64_t>(i), 1);
    } else if (i >= 0 && i < 65536) {
      op(kBinInt2);
      le(static_cast<uint64_t>(i), 2);
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
      op(kBinInt);
      le(static_cast<uint32_t>(static_cast<int32_t>(i)), 4);
    } else {
      op(kLong1);
      op('\x08');
      le(static_cast<uint64_t>(i), 8);
    }
  }
  void string(const std::string& s) {
    op(kBinUnicode);
    le(s.size(), 4);
    out_.bytes += s;
  }
  void items(const std::vector<const Value*>& items, int depth) {
    for (size_t i = 0; i < items.size(); i += kBatch) {
      op(kMark);
      for (size_t k = i; k < std::min(items.size(), i + kBatch); ++k) value(*items[k], depth + 1);
      op(kAppends);
    }
  }
  void pairs(const std::vector<std::pair<const Value*, const Value*>>& pairs, int depth) {
    for (size_t i = 0; i < pairs.size(); i += kBatch) {
      op(kMark);
      for (size_t k = i; k < std::min(pairs.size(), i + kBatch); ++k) {
        value(*pairs[k].first, depth + 1);
        value(*pairs[k].second, depth + 1);
      }
      op(kSetItems);
    }
  }
  void tuple(const std::vector<const Value*>& items, int depth) {
    if (items.empty()) return op(kEmptyTuple);
    if (items.size() > 3) op(kMark);
    for (const Value* v : items) value(*v, depth + 1);
    op(items.size() == 1 ? kTuple1 : items.size() == 2 ? kTuple2 : items.size() == 3 ? kTuple3 : kTuple);
  }
  void ints(const std::vector<int64_t>& values) {
    if (values.empty()) return op(kEmptyTuple);
    if (values.size() > 3) op(kMark);
    for (int64_t v : values) integer(v);
    op(values.size() == 1 ? kTuple1 : values.size() == 2 ? kTuple2 : values.size() == 3 ? kTuple3 : kTuple);
  }
  void tensor(const TensorRef& t) {
    const StorageRef& s = *t.storage;
    const auto [it, fresh] = seen_.emplace(s.key, &s);
    if (fresh) {
      out_.storages.push_back(&s);
    } else if (it->second->dtype != s.dtype || it->second->numel != s.numel) {
      refuse("storage '" + s.key + "' is given twice with different types or sizes");
    }
    global("torch._utils._rebuild_tensor_v2");
    op(kMark);
    op(kMark);
    string("storage");
    global(std::string("torch.") + storage_class_name(s.dtype));
    string(s.key);
    string("cpu");
    integer(s.numel);
    op(kTuple);
    op(kBinPersId);
    integer(t.offset);
    ints(t.shape);
    ints(t.stride);
    op(kNewFalse);  // requires_grad
    global("collections.OrderedDict");
    op(kEmptyTuple);
    op(kReduce);  // backward hooks: none
    op(kTuple);
    op(kReduce);
  }
  void value(const Value& v, int depth) {
    if (depth > kMaxPickleDepth) refuse("values nested deeper than " + std::to_string(kMaxPickleDepth));
    if (++count_ > kMaxPickleValues) refuse("more than " + std::to_string(kMaxPickleValues) + " values");
    using Kind = Value::Kind;
    switch (v.kind) {
      case Kind::kNone:
        return op(kNone);
      case Kind::kBool:
        return op(v.boolean ? kNewTrue : kNewFalse);
      case Kind::kInt:
        if (v.text.empty()) return integer(v.integer);
        global(v.text);
        integer(v.integer);
        op(kTuple1);
        return op(kReduce);
      case Kind::kFloat:
        op(kBinFloat);
        for (int i = 7; i >= 0; --i) op(static_cast<char>((std::bit_cast<uint64_t>(v.real) >> (8 * i)) & 0xff));
        return;
      case Kind::kString:
        return string(v.text);
      case Kind::kTuple:
        if (v.text.empty()) return tuple(v.items, depth);
        global(v.text);  // torch.Size(tuple)
        tuple(v.items, depth);
        op(kTuple1);
        return op(kReduce);
      case Kind::kList:
        op(kEmptyList);
        return items(v.items, depth);
      case Kind::kSet:
        global("__builtin__.set");
        op(kEmptyList);
        items(v.items, depth);
        op(kTuple1);
        return op(kReduce);
      case Kind::kDict:
        if (v.text.empty()) {
          op(kEmptyDict);
        } else {
          global(v.text);
          op(kEmptyTuple);
          op(kReduce);
        }
        return pairs(v.pairs, depth);
      case Kind::kGlobal:
        return global(v.text);
      case Kind::kTensor:
        return tensor(v.tensor);
      case Kind::kObject:
        global(v.text);
        op(kEmptyTuple);
        op(kNewObj);
        if (v.pairs.size() == 1 && v.pairs[0].first->kind == Kind::kString &&
            v.pairs[0].first->text == kStateAttribute) {
          value(*v.pairs[0].second, depth + 1);  // what the class's __setstate__ takes
        } else {
          op(kEmptyDict);
          pairs(v.pairs, depth);
        }
        return op(kBuild);
      case Kind::kBytes:
      case Kind::kStorage:
        break;
    }
    refuse(std::string(v.describe()) + " is not written");
  }

  PickledValue out_;
  std::map<std::string, const StorageRef*> seen_;
  int64_t count_ = 0;
};

}  // namespace

PickledValue pickle(const Value& root) {
  return Writer().run(root);
}

}  // namespace shardkit::convert::torch
