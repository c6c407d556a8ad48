// The torch.save reader of `convert import-deepspeed` on its own: the pickle shapes current PyTorch and
// DeepSpeed write (tests/data/deepspeed/, made by make_torch2_pickles.py beside them), and crafted
// inputs that must be refused within the reader's bounds, each with a one-line Error naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "convert/deepspeed/torch_file.hpp"
#include "convert/deepspeed/unpickler.hpp"

namespace shardkit {
namespace {

namespace ds = convert::deepspeed;
using Kind = ds::Value::Kind;

std::filesystem::path data_file(const std::string& name) {
  return std::filesystem::path(SHARDKIT_TEST_DATA_DIR) / "deepspeed" / name;
}

std::vector<float> values(const ds::TorchFile& file, const ds::Value* v) {
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
  const ds::TorchFile file(data_file("torch2_tensors.pt"));
  const ds::Value& root = file.root();
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
  const ds::TorchFile file(data_file("torch2_tensors.pt"));
  const ds::Value& root = file.root();
  const ds::Value* dims = root.get("checkpoint_parallel_dimensions");
  ASSERT_NE(dims, nullptr);
  ASSERT_EQ(dims->kind, Kind::kDict);
  EXPECT_EQ(dims->get("tp_degree")->integer, 1);
  const ds::Value* groups = root.get("ds_zero_partition_groups");
  ASSERT_NE(groups, nullptr);
  ASSERT_EQ(groups->kind, Kind::kList);
  EXPECT_EQ(groups->items.at(0)->get("partition_count")->integer, 2);
  const ds::Value* info = root.get("universal_checkpoint_info");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->get("universal_checkpoint_version")->kind, Kind::kFloat);
}

TEST(TorchFile, Torch2WrappersOfOtherTypesOrFunctionsAreRefused) {
  // A tensor subclass: its class is a global outside the list, refused by its name.
  expect_refused([] { ds::TorchFile f(data_file("subclass_type.pt")); },
                 {"subclass_type.pt", "refused the Python global '__main__.SubTensor'"});
  // A known global that is not a tensor type.
  expect_refused([] { ds::TorchFile f(data_file("size_as_type.pt")); },
                 {"size_as_type.pt", "_rebuild_from_type_v2 makes a 'torch.Size'"});
  // A function outside the list: by name when unknown, by role when known but not a rebuild function.
  expect_refused([] { ds::TorchFile f(data_file("unknown_function.pt")); },
                 {"unknown_function.pt", "refused the Python global 'torch._utils._rebuild_tensor'"});
  expect_refused([] { ds::TorchFile f(data_file("ordereddict_as_function.pt")); },
                 {"ordereddict_as_function.pt", "_rebuild_from_type_v2 applies 'collections.OrderedDict'"});
}

}  // namespace
}  // namespace shardkit
