// The HDF5 virtual view of a checkpoint: every tensor of every state read back through the C API's
// H5Dread of the virtual dataset, for many layouts, compressed and not; the view opened from other
// working directories, after moving it with its checkpoint, through a symlinked directory; refusals;
// and what a missing shard reads as.
#include "ckpt/virtual_view.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/h5.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/synthetic.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;
using testing::TempDir;

constexpr uint64_t kSeed = 2024;

// Shapes of 0-3 dimensions whose sizes straddle ranks at every world size used here, with a scalar
// and two empty tensors between them.
ckpt::TensorTable mixed_table() {
  return ckpt::TensorTable({
      {"embed.weight", {11, 7}, DType::kF32},
      {"scale", {}, DType::kF32},
      {"blocks.0.attn.weight", {3, 5, 7}, DType::kF32},
      {"empty.bias", {0}, DType::kF32},
      {"blocks.0.bias", {29}, DType::kF32},
      {"empty.matrix", {4, 0, 3}, DType::kF32},
      {"head.weight", {6, 1, 9}, DType::kF32},
      {"tail", {2}, DType::kF32},
  });
}

ckpt::ShardOptions small_chunks(int compression_level) {
  ckpt::ShardOptions options;
  options.chunk_elems = 13;  // odd and small: fragments cross chunk boundaries everywhere
  options.compression_level = compression_level;
  options.threads = 2;
  options.durable = false;
  return options;
}

// Changes the working directory for a scope and restores it.
class WorkingDirectory {
 public:
  explicit WorkingDirectory(const fs::path& dir) : saved_(fs::current_path()) { fs::current_path(dir); }
  ~WorkingDirectory() {
    std::error_code ec;
    fs::current_path(saved_, ec);
  }
  WorkingDirectory(const WorkingDirectory&) = delete;
  WorkingDirectory& operator=(const WorkingDirectory&) = delete;

 private:
  fs::path saved_;
};

// One dataset of a view as the HDF5 C API returns it.
struct ViewDataset {
  H5D_layout_t layout = H5D_LAYOUT_ERROR;
  H5S_class_t space_class = H5S_NO_CLASS;
  std::vector<hsize_t> dims;
  std::vector<float> values;  // row-major
  std::vector<std::string> source_files;
  std::vector<std::string> source_datasets;
};

// A source file or dataset name of mapping `index`, through H5Pget_virtual_filename or _dsetname.
std::string mapping_name(ssize_t (*get)(hid_t, size_t, char*, size_t), hid_t dcpl, size_t index) {
  const ssize_t size = get(dcpl, index, nullptr, 0);
  ckpt::h5::check(size < 0 ? -1 : 0, "virtual mapping name");
  std::string name(static_cast<size_t>(size) + 1, '\0');
  ckpt::h5::check(get(dcpl, index, name.data(), name.size()) < 0 ? -1 : 0, "virtual mapping name");
  name.resize(static_cast<size_t>(size));
  return name;
}

// Opens `view` and reads /<state>/<tensor> whole with H5Dread; throws Error when HDF5 fails.
ViewDataset read_view(const fs::path& view, const std::string& state, const std::string& tensor) {
  const std::string where = view.string() + ": " + state + "/" + tensor;
  ckpt::h5::Id file = ckpt::h5::open_file(view);
  ckpt::h5::Id dataset = ckpt::h5::open_dataset(file.get(), (state + "/" + tensor).c_str(), where);
  ckpt::h5::Id dcpl = ckpt::h5::check_id(H5Dget_create_plist(dataset.get()), where);
  ckpt::h5::Id type = ckpt::h5::check_id(H5Dget_type(dataset.get()), where);
  ckpt::h5::Id space = ckpt::h5::check_id(H5Dget_space(dataset.get()), where);
  EXPECT_GT(H5Tequal(type.get(), H5T_IEEE_F32LE), 0) << where;
  ViewDataset out;
  out.layout = H5Pget_layout(dcpl.get());
  out.space_class = H5Sget_simple_extent_type(space.get());
  out.dims = ckpt::h5::dataset_dims(dataset.get(), where);
  size_t count = 0;
  ckpt::h5::check(H5Pget_virtual_count(dcpl.get(), &count), where);
  for (size_t i = 0; i < count; ++i) {
    out.source_files.push_back(mapping_name(H5Pget_virtual_filename, dcpl.get(), i));
    out.source_datasets.push_back(mapping_name(H5Pget_virtual_dsetname, dcpl.get(), i));
  }
  const hssize_t points = H5Sget_simple_extent_npoints(space.get());
  out.values.resize(static_cast<size_t>(points));
  if (points > 0) {
    ckpt::h5::check(H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.values.data()),
                    where + ": H5Dread");
  }
  return out;
}

std::vector<hsize_t> dims_of(const ckpt::TensorInfo& info) {
  return {info.shape.begin(), info.shape.end()};
}

// Every state of `states` (manifest indices) and every tensor of the view hold the synthetic values.
void expect_view_holds(const fs::path& view, const ckpt::TensorTable& table, const std::vector<int>& states,
                       uint64_t seed) {
  for (int s : states) {
    const std::string& state = testing::adam_states()[static_cast<size_t>(s)];
    for (size_t t = 0; t < table.size(); ++t) {
      SCOPED_TRACE(state + "/" + table[t].name);
      const ViewDataset d = read_view(view, state, table[t].name);
      ASSERT_EQ(d.layout, H5D_VIRTUAL);
      ASSERT_EQ(d.dims, dims_of(table[t]));
      ASSERT_EQ(static_cast<int64_t>(d.values.size()), table[t].numel());
      for (size_t i = 0; i < d.values.size(); ++i) {
        ASSERT_EQ(d.values[i], ckpt::synthetic_value(seed, static_cast<int>(t), s, static_cast<int64_t>(i)))
            << "element " << i;
      }
    }
  }
}

void expect_full_view_holds(const fs::path& view, const ckpt::TensorTable& table, uint64_t seed) {
  expect_view_holds(view, table, {0, 1, 2}, seed);
}

template <typename Fn>
ErrorKind error_kind_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no Error thrown";
  return ErrorKind::kInternal;
}

TEST(VirtualView, EveryLayoutReadsBackExactly) {
  const ckpt::TensorTable table = mixed_table();
  for (int w : {1, 2, 3, 5}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int level : {0, 3}) {
        const int64_t alignment = stage % 2 == 0 ? 4 : 16;
        SCOPED_TRACE("W=" + std::to_string(w) + " stage=" + std::to_string(stage) + " zstd=" + std::to_string(level));
        TempDir dir;
        const fs::path step =
            testing::write_synthetic_checkpoint(dir / "run", table, {w, stage, alignment}, small_chunks(level), kSeed);
        const fs::path view = dir / "view.h5";
        EXPECT_EQ(ckpt::write_virtual_view(step, view), 3 * static_cast<int64_t>(table.size()));
        expect_full_view_holds(view, table, kSeed);
        EXPECT_FALSE(fs::exists(fs::path(view) += ".tmp"));
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(VirtualView, RandomTablesReadBackExactly) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("table seed " + std::to_string(seed));
    const ckpt::TensorTable table = testing::random_table(seed, 10, 40);
    TempDir dir;
    const int stage = static_cast<int>(seed % 4);
    testing::write_synthetic_checkpoint(dir / "run", table, {3, stage, 8}, small_chunks(0), kSeed);
    const fs::path view = dir / "view.h5";
    ckpt::write_virtual_view(dir / "run", view);  // a run directory: `latest` is followed
    expect_full_view_holds(view, table, kSeed);
    if (HasFatalFailure()) return;
  }
}

TEST(VirtualView, ScalarIsZeroDimensionalAndEmptyTensorsAreEmptyVirtualDatasets) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  const fs::path step = testing::write_synthetic_checkpoint(dir / "run", table, {2, 3, 4}, small_chunks(0), kSeed);
  ckpt::write_virtual_view(step, dir / "view.h5");
  const ViewDataset scalar = read_view(dir / "view.h5", "exp_avg", "scale");
  EXPECT_EQ(scalar.space_class, H5S_SCALAR);
  EXPECT_TRUE(scalar.dims.empty());
  ASSERT_EQ(scalar.values.size(), 1u);
  EXPECT_EQ(scalar.values[0], ckpt::synthetic_value(kSeed, 1, 1, 0));
  for (const char* name : {"empty.bias", "empty.matrix"}) {
    const ViewDataset empty = read_view(dir / "view.h5", "fp32", name);
    EXPECT_EQ(empty.layout, H5D_VIRTUAL) << name;
    EXPECT_EQ(empty.dims, dims_of(table[static_cast<size_t>(table.find(name))])) << name;
    EXPECT_TRUE(empty.values.empty()) << name;
    EXPECT_TRUE(empty.source_files.empty()) << name;
  }
}

TEST(VirtualView, ARangeBecomesAFewBoxesNotOneMappingPerRow) {
  const ckpt::TensorTable table({{"cube", {4, 5, 6}, DType::kF32}, {"matrix", {9, 8}, DType::kF32}});
  TempDir dir;
  // Stage 3 at W=3 cuts the cube into [0, 40), [40, 80), [80, 120): none aligned to a row or a slab.
  const fs::path step = testing::write_synthetic_checkpoint(dir / "w3", table, {3, 3, 1}, small_chunks(0), kSeed);
  ckpt::write_virtual_view(step, dir / "w3.h5");
  const ViewDataset cube = read_view(dir / "w3.h5", "fp32", "cube");
  EXPECT_GE(cube.source_files.size(), 3u * 2);  // each piece needs more than one box
  EXPECT_LE(cube.source_files.size(), 3u * 5);  // at most 2 * rank - 1 boxes per piece
  // One rank: every tensor is one contiguous fragment, hence one box.
  const fs::path one = testing::write_synthetic_checkpoint(dir / "w1", table, {1, 0, 1}, small_chunks(0), kSeed);
  ckpt::write_virtual_view(one, dir / "w1.h5");
  EXPECT_EQ(read_view(dir / "w1.h5", "fp32", "cube").source_files.size(), 1u);
  EXPECT_EQ(read_view(dir / "w1.h5", "fp32", "matrix").source_files.size(), 1u);
  expect_full_view_holds(dir / "w3.h5", table, kSeed);
}

TEST(VirtualView, RootAttributesAndRelativeSourcePaths) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  const fs::path step =
      testing::write_synthetic_checkpoint(dir / "runs" / "gpt", table, {2, 1, 4}, small_chunks(0), kSeed, 42);
  const fs::path view = dir / "views" / "gpt.h5";  // "views" does not exist yet: it is created
  ckpt::write_virtual_view(step, view);
  const ckpt::CheckpointReader reader(step);
  {
    ckpt::h5::Id file = ckpt::h5::open_file(view);
    const std::string where = view.string();
    EXPECT_EQ(ckpt::h5::read_string_attribute(file.get(), "format", where), "shardkit-virtual-view");
    EXPECT_EQ(ckpt::h5::read_int_attribute(file.get(), "format_version", where), 1);
    EXPECT_EQ(ckpt::h5::read_int_attribute(file.get(), "step", where), 42);
    EXPECT_EQ(ckpt::h5::read_string_attribute(file.get(), "checkpoint_uid", where), reader.manifest().checkpoint_uid);
    EXPECT_EQ(ckpt::h5::read_string_attribute(file.get(), "model", where), reader.manifest().model.dump());
    EXPECT_EQ(ckpt::h5::read_string_attribute(file.get(), "source", where), "../runs/gpt/step-00000042");
  }
  const ViewDataset d = read_view(view, "exp_avg_sq", "embed.weight");
  ASSERT_FALSE(d.source_files.empty());
  for (size_t i = 0; i < d.source_files.size(); ++i) {
    EXPECT_TRUE(d.source_files[i] == "../runs/gpt/step-00000042/shard-00000-of-00002.h5" ||
                d.source_files[i] == "../runs/gpt/step-00000042/shard-00001-of-00002.h5")
        << d.source_files[i];
    EXPECT_EQ(d.source_datasets[i], "/state/exp_avg_sq");
  }
}

TEST(VirtualView, ViewInsideTheStepDirectoryNamesShardsPlainly) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  const fs::path step = testing::write_synthetic_checkpoint(dir / "run", table, {3, 2, 4}, small_chunks(0), kSeed);
  ckpt::write_virtual_view(step, step / "view.h5");
  {
    ckpt::h5::Id file = ckpt::h5::open_file(step / "view.h5");
    EXPECT_EQ(ckpt::h5::read_string_attribute(file.get(), "source", "view"), ".");
  }
  EXPECT_EQ(read_view(step / "view.h5", "fp32", "tail").source_files.at(0), "shard-00002-of-00003.h5");
  // Readers still accept the step directory: the view is not a file of the checkpoint.
  EXPECT_TRUE(ckpt::CheckpointReader(step).verify().ok());
  expect_full_view_holds(step / "view.h5", table, kSeed);
}

TEST(VirtualView, OpensFromAnyWorkingDirectory) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  TempDir elsewhere;
  const fs::path step = testing::write_synthetic_checkpoint(dir / "run", table, {3, 1, 4}, small_chunks(3), kSeed);
  const fs::path view = dir / "views" / "view.h5";
  {
    // A relative output path, written from inside the run directory.
    WorkingDirectory cwd(dir / "run");
    ckpt::write_virtual_view("step-00000001", "../views/view.h5");
  }
  for (const fs::path& cwd_path : {elsewhere.path(), dir.path(), step, fs::path("/")}) {
    SCOPED_TRACE("cwd " + cwd_path.string());
    WorkingDirectory cwd(cwd_path);
    expect_full_view_holds(view, table, kSeed);
    expect_view_holds(view.lexically_relative(cwd_path), table, {1}, kSeed);
    if (HasFatalFailure()) return;
  }
}

TEST(VirtualView, TheViewsDirectoryWinsOverTheWorkingDirectory) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  TempDir decoy;
  testing::write_synthetic_checkpoint(dir / "run", table, {2, 2, 4}, small_chunks(0), kSeed);
  ckpt::write_virtual_view(dir / "run", dir / "views" / "view.h5");
  // The same relative shard paths ("../run/step-00000001/...") exist below the working directory too,
  // holding other values: HDF5 must take the ones relative to the view.
  testing::write_synthetic_checkpoint(decoy / "run", table, {2, 2, 4}, small_chunks(0), kSeed + 1);
  fs::create_directories(decoy / "views");
  WorkingDirectory cwd(decoy / "views");
  ASSERT_TRUE(fs::exists("../run/step-00000001/shard-00000-of-00002.h5"));
  expect_full_view_holds(dir / "views" / "view.h5", table, kSeed);
}

TEST(VirtualView, MovingTheCheckpointAndTheViewTogetherKeepsItWorking) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  testing::write_synthetic_checkpoint(dir / "old" / "run", table, {5, 3, 4}, small_chunks(3), kSeed);
  ckpt::write_virtual_view(dir / "old" / "run", dir / "old" / "views" / "view.h5");
  fs::rename(dir / "old", dir / "new");
  WorkingDirectory cwd(dir.path());
  expect_full_view_holds(dir / "new" / "views" / "view.h5", table, kSeed);
}

TEST(VirtualView, OutputThroughASymlinkedDirectory) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  testing::write_synthetic_checkpoint(dir / "run", table, {2, 0, 4}, small_chunks(0), kSeed);
  fs::create_directories(dir / "deep" / "views");
  fs::create_directory_symlink(dir / "deep" / "views", dir / "link");
  // Relative to the link's name the run is "../run"; the kernel resolves ".." after the link, so the
  // stored path must be relative to the real directory.
  ckpt::write_virtual_view(dir / "run", dir / "link" / "view.h5");
  {
    ckpt::h5::Id file = ckpt::h5::open_file(dir / "link" / "view.h5");
    EXPECT_EQ(ckpt::h5::read_string_attribute(file.get(), "source", "view"), "../../run/step-00000001");
  }
  expect_full_view_holds(dir / "link" / "view.h5", table, kSeed);
  expect_full_view_holds(dir / "deep" / "views" / "view.h5", table, kSeed);
}

TEST(VirtualView, PercentSignsInPathsAreLiteral) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  // "%1b" would be a block-count pattern to H5Pset_virtual if it were not escaped.
  const fs::path step = testing::write_synthetic_checkpoint(dir / "100%1b", table, {2, 3, 4}, small_chunks(0), kSeed);
  ckpt::write_virtual_view(step, dir / "view.h5");
  // HDF5 keeps the escaped pattern; the "source" attribute is the plain path.
  EXPECT_EQ(read_view(dir / "view.h5", "fp32", "tail").source_files.at(0),
            "100%%1b/step-00000001/shard-00000-of-00002.h5");
  {
    ckpt::h5::Id file = ckpt::h5::open_file(dir / "view.h5");
    EXPECT_EQ(ckpt::h5::read_string_attribute(file.get(), "source", "view"), "100%1b/step-00000001");
  }
  expect_full_view_holds(dir / "view.h5", table, kSeed);
}

TEST(VirtualView, SelectedStatesOnly) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  const fs::path step = testing::write_synthetic_checkpoint(dir / "run", table, {3, 2, 4}, small_chunks(0), kSeed);
  ckpt::VirtualViewOptions options;
  options.states = {"exp_avg_sq", "fp32"};
  EXPECT_EQ(ckpt::write_virtual_view(step, dir / "view.h5", options), 2 * static_cast<int64_t>(table.size()));
  expect_view_holds(dir / "view.h5", table, {2, 0}, kSeed);
  ckpt::h5::Id file = ckpt::h5::open_file(dir / "view.h5");
  EXPECT_FALSE(ckpt::h5::link_exists(file.get(), "exp_avg"));
}

TEST(VirtualView, RefusesUnknownAndRepeatedStates) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  const fs::path step = testing::write_synthetic_checkpoint(dir / "run", table, {2, 2, 4}, small_chunks(0), kSeed);
  ckpt::VirtualViewOptions unknown;
  unknown.states = {"fp32", "momentum"};
  EXPECT_EQ(error_kind_of([&] { ckpt::write_virtual_view(step, dir / "a.h5", unknown); }), ErrorKind::kInvalidInput);
  ckpt::VirtualViewOptions repeated;
  repeated.states = {"fp32", "fp32"};
  EXPECT_EQ(error_kind_of([&] { ckpt::write_virtual_view(step, dir / "b.h5", repeated); }), ErrorKind::kInvalidInput);
  EXPECT_FALSE(fs::exists(dir / "a.h5"));
  EXPECT_FALSE(fs::exists(dir / "b.h5"));
}

TEST(VirtualView, RefusesAnExistingOutputFile) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  const fs::path step = testing::write_synthetic_checkpoint(dir / "run", table, {2, 2, 4}, small_chunks(0), kSeed);
  std::ofstream(dir / "taken.h5") << "keep me";
  EXPECT_EQ(error_kind_of([&] { ckpt::write_virtual_view(step, dir / "taken.h5"); }), ErrorKind::kInvalidInput);
  std::string content;
  std::getline(std::ifstream(dir / "taken.h5"), content);
  EXPECT_EQ(content, "keep me");
  // A second view to the same file, and a dangling symlink, are refused too.
  ckpt::write_virtual_view(step, dir / "view.h5");
  EXPECT_EQ(error_kind_of([&] { ckpt::write_virtual_view(step, dir / "view.h5"); }), ErrorKind::kInvalidInput);
  fs::create_symlink(dir / "nowhere.h5", dir / "dangling.h5");
  EXPECT_EQ(error_kind_of([&] { ckpt::write_virtual_view(step, dir / "dangling.h5"); }), ErrorKind::kInvalidInput);
  EXPECT_FALSE(fs::exists(dir / "nowhere.h5"));
  expect_full_view_holds(dir / "view.h5", table, kSeed);
}

TEST(VirtualView, ShardMissingAtReadTimeReadsAsNaN) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  TempDir empty_cwd;  // nothing under it that HDF5's last-resort lookup could pick up
  const ckpt::LayoutSpec spec{3, 2, 4};
  const fs::path step = testing::write_synthetic_checkpoint(dir / "run", table, spec, small_chunks(0), kSeed);
  ckpt::write_virtual_view(step, dir / "view.h5");
  fs::remove(step / ckpt::shard_file_name(1, 3));
  WorkingDirectory cwd(empty_cwd.path());
  const ckpt::Layout layout(table, spec);
  int64_t missing = 0;
  int64_t present = 0;
  for (size_t t = 0; t < table.size(); ++t) {
    const ViewDataset d = read_view(dir / "view.h5", "fp32", table[t].name);  // H5Dread succeeds
    for (const ckpt::Placement& p : layout.locate(static_cast<int>(t), 0, table[t].numel())) {
      for (int64_t i = p.tensor_offset; i < p.tensor_offset + p.length; ++i) {
        const float value = d.values[static_cast<size_t>(i)];
        if (p.rank == 1) {
          EXPECT_TRUE(std::isnan(value)) << table[t].name << " element " << i;
          ++missing;
        } else {
          EXPECT_EQ(value, ckpt::synthetic_value(kSeed, static_cast<int>(t), 0, i)) << table[t].name << " " << i;
          ++present;
        }
      }
    }
  }
  EXPECT_GT(missing, 0);
  EXPECT_GT(present, 0);
}

TEST(VirtualView, RefusesACheckpointWithAMissingOrForeignShard) {
  const ckpt::TensorTable table = mixed_table();
  TempDir dir;
  const fs::path step = testing::write_synthetic_checkpoint(dir / "a", table, {2, 1, 4}, small_chunks(0), kSeed);
  const fs::path other = testing::write_synthetic_checkpoint(dir / "b", table, {2, 1, 4}, small_chunks(0), kSeed);
  const fs::path shard = step / ckpt::shard_file_name(0, 2);
  fs::rename(shard, dir / "saved.h5");
  EXPECT_EQ(error_kind_of([&] { ckpt::write_virtual_view(step, dir / "view.h5"); }), ErrorKind::kCorrupt);
  // Same layout and values, but another checkpoint's uid: the view would silently mix checkpoints.
  fs::copy_file(other / ckpt::shard_file_name(0, 2), shard);
  EXPECT_EQ(error_kind_of([&] { ckpt::write_virtual_view(step, dir / "view.h5"); }), ErrorKind::kCorrupt);
  EXPECT_FALSE(fs::exists(dir / "view.h5"));
  EXPECT_FALSE(fs::exists(dir / "view.h5.tmp"));
  fs::remove(shard);
  fs::rename(dir / "saved.h5", shard);
  ckpt::write_virtual_view(step, dir / "view.h5");
  expect_full_view_holds(dir / "view.h5", table, kSeed);
}

}  // namespace
}  // namespace shardkit
