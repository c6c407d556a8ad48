// The torch.save reader of `convert import-deepspeed` on its own: the pickle shapes current PyTorch and
// DeepSpeed write (tests/data/torch/, made by make_torch2_pickles.py beside them), and crafted
// inputs that must be refused within the reader's bounds, each with a one-line Error naming the file.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "convert/torch/torch_file.hpp"
#include "convert/torch/unpickler.hpp"

namespace shardkit {
namespace {

namespace pt = convert::torch;
using Kind = pt::Value::Kind;

std::filesystem::path data_file(const std::string& name) {
  return std::filesystem::path(SHARDKIT_TEST_DATA_DIR) / "torch" / name;
}

std::vector<float> values(const pt::TorchFile& file, const pt::Value* v) {
  EXPECT_NE(v, nullptr);
  if (!v) return {};
  EXPECT_EQ(v->kind, Kind::kTensor) << v->describe();
  if (v->kind != Kind::kTensor) return {};
  std::vector<float> out(static_cast<size_t>(v->tensor.numel()));
  file.read(v->tensor, 0, out, "test");
  return out;
}

// Runs `open` and expects Error(kInvalidInput), one line, holding each of `fragments`.
template <typename F>
void expect_refused(F open, const std::vector<std::string>& fragments) {
  try {
    open();
    ADD_FAILURE() << "accepted; expected: " << fragments.front();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    for (const std::string& f : fragments) EXPECT_NE(what.find(f), std::string::npos) << f << " in: " << what;
  }
}

TEST(TorchFile, ReadsTensorsWithAttributesAsTorch2PicklesThem) {
  const pt::TorchFile file(data_file("torch2_tensors.pt"));
  const pt::Value& root = file.root();
  ASSERT_EQ(root.kind, Kind::kDict);
  // _rebuild_from_type_v2(_rebuild_tensor_v2, torch.Tensor, args, {'ds_id': ..., 'ds_shape': torch.Size})
  EXPECT_EQ(values(file, root.get("tensor_with_attributes")), (std::vector<float>{1, 2, 3}));
  // _rebuild_parameter_with_state(tensor, True, OrderedDict(), {'ds_id': 7})
  EXPECT_EQ(values(file, root.get("parameter_with_attributes")), (std::vector<float>{4, 5}));
  // _rebuild_from_type_v2(_rebuild_tensor_v2, torch.nn.parameter.Parameter, args, None)
  EXPECT_EQ(values(file, root.get("parameter_as_type")), (std::vector<float>{6}));
  // _rebuild_parameter(tensor, True, OrderedDict())
  EXPECT_EQ(values(file, root.get("parameter")), (std::vector<float>{7, 8}));
}

TEST(TorchFile, AcceptsTheKeysDeepSpeed016Adds) {
  const pt::TorchFile file(data_file("torch2_tensors.pt"));
  const pt::Value& root = file.root();
  const pt::Value* dims = root.get("checkpoint_parallel_dimensions");
  ASSERT_NE(dims, nullptr);
  ASSERT_EQ(dims->kind, Kind::kDict);
  EXPECT_EQ(dims->get("tp_degree")->integer, 1);
  const pt::Value* groups = root.get("ds_zero_partition_groups");
  ASSERT_NE(groups, nullptr);
  ASSERT_EQ(groups->kind, Kind::kList);
  EXPECT_EQ(groups->items.at(0)->get("partition_count")->integer, 2);
  const pt::Value* info = root.get("universal_checkpoint_info");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->get("universal_checkpoint_version")->kind, Kind::kFloat);
}

TEST(TorchFile, Torch2WrappersOfOtherTypesOrFunctionsAreRefused) {
  // A tensor subclass: its class is a global outside the list, refused by its name.
  expect_refused([] { pt::TorchFile f(data_file("subclass_type.pt")); },
                 {"subclass_type.pt", "refused the Python global '__main__.SubTensor'"});
  // A known global that is not a tensor type.
  expect_refused([] { pt::TorchFile f(data_file("size_as_type.pt")); },
                 {"size_as_type.pt", "_rebuild_from_type_v2 makes a 'torch.Size'"});
  // A function outside the list: by name when unknown, by role when known but not a rebuild function.
  expect_refused([] { pt::TorchFile f(data_file("unknown_function.pt")); },
                 {"unknown_function.pt", "refused the Python global 'torch._utils._rebuild_tensor'"});
  expect_refused([] { pt::TorchFile f(data_file("ordereddict_as_function.pt")); },
                 {"ordereddict_as_function.pt", "_rebuild_from_type_v2 applies 'collections.OrderedDict'"});
}

// Pickle bytes, built up by instruction (protocol 2, as torch.save writes).
struct PickleBuilder {
  std::string b = std::string("\x80\x02", 2);
  PickleBuilder& raw(std::string_view s) {
    b += s;
    return *this;
  }
  PickleBuilder& global(std::string_view module, std::string_view name) {
    return raw("c").raw(module).raw("\n").raw(name).raw("\n");
  }
  PickleBuilder& put(uint32_t i) { return raw("r").u32(i); }  // LONG_BINPUT
  PickleBuilder& get(uint32_t i) { return raw("j").u32(i); }  // LONG_BINGET
  PickleBuilder& integer(int32_t v) { return raw("J").u32(static_cast<uint32_t>(v)); }
  PickleBuilder& long8(int64_t v) {  // LONG1 of 8 bytes
    raw("\x8a\x08");
    for (int i = 0; i < 8; ++i) b += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
    return *this;
  }
  PickleBuilder& text(std::string_view s) { return raw("X").u32(static_cast<uint32_t>(s.size())).raw(s); }
  PickleBuilder& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  // A tuple of `n` copies of memo entry `item`, stored as memo entry `as`.
  PickleBuilder& tuple_of(uint32_t item, size_t n, uint32_t as) {
    raw("(");
    for (size_t i = 0; i < n; ++i) get(item);
    return raw("t").put(as).raw("0");
  }
};

// What each test case expects: refused with `fragment`, or (fragment empty) accepted.
void expect_unpickle_refused(const std::string& pickle, const std::string& fragment) {
  expect_refused([&] { pt::unpickle(pickle, "crafted.pt"); }, {"crafted.pt", fragment});
}

TEST(Unpickler, ASmallPickleCannotCopyItsWayToGigabytes) {
  // Each case is under 200 kB and, unbounded, would allocate over 1 GB.
  const std::string kMemory = "the parsed pickle needs more than";
  {
    // torch.Size called 3000 times on one tuple of 50,000 items: 7 bytes a call, 400 kB a copy.
    PickleBuilder p;
    p.raw("N").put(0).raw("0").tuple_of(0, 50000, 1).global("torch", "Size").put(2).raw("0").raw("]");
    for (int i = 0; i < 3000; ++i) p.get(2).get(1).raw("\x85R0");
    expect_unpickle_refused(p.raw(".").b, kMemory);
  }
  {
    // set() of the same list, the same way.
    PickleBuilder p;
    p.raw("N").put(0).raw("0").raw("]").put(1).raw("(");
    for (int i = 0; i < 50000; ++i) p.get(0);
    p.raw("e0").global("builtins", "set").put(2).raw("0").raw("]");
    for (int i = 0; i < 3000; ++i) p.get(2).get(1).raw("\x85R0");
    expect_unpickle_refused(p.raw(".").b, kMemory);
  }
  {
    // BUILD of one loss scaler with a dict of 25,000 pairs, 3,000 times: each appends the pairs.
    PickleBuilder p;
    p.raw("N").put(0).raw("0").raw("}").put(1).raw("(");
    for (int i = 0; i < 25000; ++i) p.get(0).get(0);
    p.raw("u0");
    p.global("deepspeed.runtime.fp16.loss_scaler", "LossScaler").raw(")\x81");
    for (int i = 0; i < 3000; ++i) p.get(1).raw("b");
    expect_unpickle_refused(p.raw(".").b, kMemory);
  }
  {
    // Many containers, each a byte: 900,000 empty dicts in lists.
    PickleBuilder p;
    p.raw("]");
    for (int k = 0; k < 9; ++k) p.raw("(").raw(std::string(100000, '}')).raw("e");
    expect_unpickle_refused(p.raw(".").b, kMemory);
  }
}

TEST(Unpickler, ACheckpointsFilesShareOneBudget) {
  // Each pickle alone is within its bound; the budget of their checkpoint is not.
  PickleBuilder p;
  p.raw("]");
  for (int k = 0; k < 2; ++k) p.raw("(").raw(std::string(50000, '}')).raw("e");
  const std::string pickle = p.raw(".").b;
  pt::ParseBudget budget(uint64_t{64} << 20);
  int accepted = 0;
  try {
    for (; accepted < 100; ++accepted) pt::unpickle(pickle, "rank.pt", &budget);
    ADD_FAILURE() << "100 files accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("rank.pt: the pickles of this checkpoint's files need more than 64 MiB"),
              std::string::npos)
        << e.what();
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LE(budget.used(), budget.limit() + (uint64_t{2} << 20));
}

TEST(Unpickler, LookupsInLargeDictsAreFastAndTheLastKeyWins) {
  // 200,000 integer keys (a state dict of that many groups) and as many string keys, each looked up:
  // linear lookups would take 4 * 10^10 steps.
  constexpr int kKeys = 200000;
  PickleBuilder p;
  p.raw("}(");
  for (int i = 0; i < kKeys; ++i) p.integer(i).integer(i);
  p.integer(7).integer(-7);  // a key given twice: the last one wins
  p.raw("u}(");
  for (int i = 0; i < kKeys; ++i) p.text("k" + std::to_string(i)).integer(i);
  p.text("k7").integer(-7);
  p.raw("u\x86.");
  const pt::Pickle pickle = pt::unpickle(p.b, "groups.pt");
  const pt::Value& ints = *pickle.root().items.at(0);
  const pt::Value& names = *pickle.root().items.at(1);
  const auto start = std::chrono::steady_clock::now();
  int64_t sum = 0;
  for (int i = 0; i < kKeys; ++i) {
    sum += ints.get(int64_t{i})->integer;
    sum += names.get("k" + std::to_string(i))->integer;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(ints.get(int64_t{7})->integer, -7);
  EXPECT_EQ(names.get("k7")->integer, -7);
  EXPECT_EQ(names.get("k"), nullptr);
  EXPECT_EQ(ints.get(int64_t{kKeys}), nullptr);
  EXPECT_EQ(sum, 2 * (int64_t{kKeys} * (kKeys - 1) / 2 - 7 - 7));
}

TEST(Unpickler, TensorSizesThatOverflowAreRefused) {
  // _rebuild_tensor_v2(storage, 0, size, stride) on a storage that declares 2^40 elements (its record is
  // checked only when read): zero strides keep every view inside it, so only the element count can say
  // that the view is too large.
  const auto view = [](const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
    PickleBuilder p;
    p.global("torch._utils", "_rebuild_tensor_v2").raw("((").text("storage").global("torch", "FloatStorage");
    p.text("0").text("cpu").long8(int64_t{1} << 40).raw("tQ").integer(0).raw("(");
    for (int64_t d : size) p.long8(d);
    p.raw("t(");
    for (int64_t s : stride) p.long8(s);
    return p.raw("t\x89NtR.").b;
  };
  expect_unpickle_refused(view({int64_t{1} << 32, int64_t{1} << 32}, {0, 0}), "more than 2^62 elements");
  expect_unpickle_refused(view({0, int64_t{1} << 40, int64_t{1} << 40}, {0, 0, 0}), "more than 2^62 elements");
  // Within the bound a zero-stride view is read as what it says.
  const pt::Pickle ok = pt::unpickle(view({int64_t{1} << 30, 4}, {0, 0}), "view.pt");
  EXPECT_EQ(ok.root().tensor.numel(), int64_t{1} << 32);
  EXPECT_FALSE(ok.root().tensor.contiguous());
}

// Each kind of file has its own closed list: DCP's metadata classes are refused in a torch.save
// archive, tensors and DeepSpeed's classes in a DCP .metadata, and the metadata's own forms read.
TEST(Unpickler, TorchSaveAndDcpMetadataEachHaveTheirOwnGlobals) {
  const auto metadata = [](std::string_view module, std::string_view name) {
    return PickleBuilder().global(module, name).raw(")\x81}b.").b;  // NEWOBJ of the class, BUILD with {}
  };
  const std::string dcp_class = metadata("torch.distributed.checkpoint.metadata", "Metadata");
  expect_unpickle_refused(dcp_class, "'torch.distributed.checkpoint.metadata.Metadata'");
  const pt::Pickle md = pt::unpickle(dcp_class, "m", nullptr, pt::Globals::kDcpMetadata);
  EXPECT_EQ(md.root().text, "torch.distributed.checkpoint.metadata.Metadata");
  for (const auto& [module, name] :
       {std::pair{"deepspeed.runtime.fp16.loss_scaler", "LossScaler"}, std::pair{"torch._utils", "_rebuild_tensor_v2"},
        std::pair{"collections", "OrderedDict"}, std::pair{"os", "system"}}) {
    expect_refused([&] { pt::unpickle(metadata(module, name), "m", nullptr, pt::Globals::kDcpMetadata); },
                   {"refused the Python global '" + std::string(module) + "." + name + "'", ".metadata"});
  }
  // TensorProperties keeps its __getstate__ tuple; a layout and a path read as their names.
  PickleBuilder props;
  props.global("torch.distributed.checkpoint.metadata", "TensorProperties").raw(")\x81(");
  props.global("torch", "bfloat16").global("torch.serialization", "_get_layout").raw("(").text("torch.strided");
  props.raw("tR\x89").global("pathlib", "PosixPath").raw("(").text("/").text("tmp").raw("tRtb.");
  const pt::Pickle p = pt::unpickle(props.b, "m", nullptr, pt::Globals::kDcpMetadata);
  const pt::Value* state = p.root().get(pt::kStateAttribute);
  ASSERT_NE(state, nullptr);
  ASSERT_EQ(state->items.size(), 4u);
  EXPECT_EQ(pt::dtype_of(*state->items[0]), pt::Dtype::kBF16);
  EXPECT_EQ(state->items[1]->text, "torch.strided");
  EXPECT_EQ(state->items[3]->text, "/tmp");
  // No tensors in a metadata file.
  PickleBuilder tensor;
  tensor.global("torch._utils", "_rebuild_tensor_v2");
  expect_refused([&] { pt::unpickle(tensor.raw(".").b, "m", nullptr, pt::Globals::kDcpMetadata); },
                 {"'torch._utils._rebuild_tensor_v2'"});
}

}  // namespace
}  // namespace shardkit
