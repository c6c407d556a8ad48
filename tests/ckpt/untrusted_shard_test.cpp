// A shard from a stranger: HDF5 constructs that lead outside the file, objects outside the schema,
// filters that would make libhdf5 load a library, and metadata that crashes or hangs the parser. Each
// is refused with an error naming the shard, before any of its data is used, and the process reading
// it survives. The shards are edited with raw HDF5 calls, as an attacker would craft them.
#include <gtest/gtest.h>

#include <hdf5.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/h5.hpp"
#include "ckpt/isolated_process.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/shard_format.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

using testing::TempDir;
namespace h5 = ckpt::h5;

struct Fixture {
  TempDir dir;
  ckpt::TensorTable table{{{"emb", {64, 16}, ckpt::DType::kF32}, {"head", {40, 16}, ckpt::DType::kF32}}};
  std::filesystem::path step;
  std::filesystem::path shard;  // rank 1's
  std::filesystem::path outside;

  Fixture() {
    ckpt::ShardOptions options;
    options.chunk_elems = 128;
    step = testing::write_synthetic_checkpoint(dir / "run", table, {2, 1, 16}, options, 1);
    shard = step / ckpt::shard_file_name(1, 2);
    outside = dir / "outside";
  }
};

// The error of opening every shard and reading every chunk, or "" when all of it is accepted.
std::string read_error(const std::filesystem::path& step) {
  try {
    ckpt::CheckpointReader reader(step);
    const ckpt::VerifyReport report = reader.verify();
    std::string all;
    for (const auto& p : report.problems) all += p + "\n";
    return all;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
    return e.what();
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

h5::Id open_rw(const std::filesystem::path& path) {
  return h5::check_id(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), path.string());
}

// Records rank 1's edited shard's size in the manifest, as an attacker would (its digest is redone).
void reseal(const Fixture& f) {
  ckpt::Manifest manifest = ckpt::read_manifest(f.step);
  manifest.shards.at(1).bytes = static_cast<int64_t>(std::filesystem::file_size(f.shard));
  ckpt::write_manifest(f.step, manifest);
}

std::vector<uint64_t> checksums_of(hid_t file, const char* state) {
  h5::Id group = h5::open_group(file, "checksum", "test");
  h5::Id ds = h5::open_dataset(group.get(), state, "test");
  const std::vector<hsize_t> dims = h5::dataset_dims(ds.get(), "test");
  return h5::read_uint64_dataset(group.get(), state, dims.at(0), "test");
}

// Replaces /checksum/<state> with a dataset made by `create(group, values)`.
template <typename Create>
void replace_checksums(const Fixture& f, const char* state, Create create) {
  h5::Id file = open_rw(f.shard);
  const std::vector<uint64_t> values = checksums_of(file.get(), state);
  h5::Id group = h5::open_group(file.get(), "checksum", "test");
  h5::check(H5Ldelete(group.get(), state, H5P_DEFAULT), "H5Ldelete");
  create(group.get(), values);
  group = h5::Id();
  file.close("test");
  reseal(f);
}

TEST(UntrustedShard, ALinkToAnotherFileIsRefused) {
  Fixture f;
  {
    // The outside file holds a copy of the real checksums: read through the link, they pass.
    h5::Id file = open_rw(f.shard);
    h5::Id other = h5::check_id(H5Fcreate(f.outside.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "create");
    h5::check(H5Ocopy(file.get(), "checksum", other.get(), "checksum", H5P_DEFAULT, H5P_DEFAULT), "H5Ocopy");
    other.close("test");
    h5::check(H5Ldelete(file.get(), "checksum", H5P_DEFAULT), "H5Ldelete");
    h5::check(H5Lcreate_external(f.outside.c_str(), "/checksum", file.get(), "checksum", H5P_DEFAULT, H5P_DEFAULT),
              "H5Lcreate_external");
    file.close("test");
  }
  reseal(f);
  const std::string error = read_error(f.step);
  EXPECT_TRUE(contains(error, f.shard.string())) << error;
  EXPECT_TRUE(contains(error, "/checksum is a soft or external link")) << error;
}

TEST(UntrustedShard, RawDataInAnExternalFileIsRefused) {
  Fixture f;
  replace_checksums(f, "fp32", [&](hid_t group, const std::vector<uint64_t>& values) {
    std::ofstream(f.outside, std::ios::binary)
        .write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 8));
    h5::Id dcpl = h5::check_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate");
    h5::check(H5Pset_external(dcpl.get(), f.outside.c_str(), 0, values.size() * 8), "H5Pset_external");
    const hsize_t n = values.size();
    h5::Id space = h5::check_id(H5Screate_simple(1, &n, nullptr), "space");
    h5::check_id(H5Dcreate2(group, "fp32", H5T_STD_U64LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), "create");
  });
  const std::string error = read_error(f.step);
  EXPECT_TRUE(contains(error, f.shard.string())) << error;
  EXPECT_TRUE(contains(error, "keeps its data in external files")) << error;
}

TEST(UntrustedShard, AVirtualDatasetIsRefused) {
  Fixture f;
  replace_checksums(f, "fp32", [&](hid_t group, const std::vector<uint64_t>& values) {
    const hsize_t n = values.size();
    h5::Id space = h5::check_id(H5Screate_simple(1, &n, nullptr), "space");
    {
      h5::Id other = h5::check_id(H5Fcreate(f.outside.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "create");
      h5::write_uint64_dataset(other.get(), "sums", n, values.data(), "outside");
      other.close("test");
    }
    h5::Id dcpl = h5::check_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate");
    h5::check(H5Pset_virtual(dcpl.get(), space.get(), f.outside.c_str(), "/sums", space.get()), "H5Pset_virtual");
    h5::check_id(H5Dcreate2(group, "fp32", H5T_STD_U64LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), "create");
  });
  const std::string error = read_error(f.step);
  EXPECT_TRUE(contains(error, f.shard.string())) << error;
  EXPECT_TRUE(contains(error, "virtual dataset")) << error;
}

TEST(UntrustedShard, AnObjectOutsideTheSchemaIsRefused) {
  Fixture f;
  {
    h5::Id file = open_rw(f.shard);
    h5::create_group(file.get(), "extra", "test");
    file.close("test");
  }
  reseal(f);
  const std::string error = read_error(f.step);
  EXPECT_TRUE(contains(error, f.shard.string())) << error;
  EXPECT_TRUE(contains(error, "unexpected object /extra")) << error;
}

// Sets an environment variable for one scope, for this process and for fresh isolated children.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
    ckpt::isolated::restart_for_testing();
  }
  ~ScopedEnv() {
    ::unsetenv(name_);
    ckpt::isolated::restart_for_testing();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// A filter that stores bytes unchanged, registered in this process only while the shard is written.
size_t passthrough(unsigned, size_t, const unsigned[], size_t nbytes, size_t*, void**) {
  return nbytes;
}

TEST(UntrustedShard, AnUnknownFilterLoadsNoLibrary) {
  // Before HDF5 reads its plugin path: a folder whose library announces being loaded.
  const std::filesystem::path marker =
      std::filesystem::temp_directory_path() / ("shardkit-plugin-marker-" + std::to_string(::getpid()));
  std::filesystem::remove(marker);
  ScopedEnv path("HDF5_PLUGIN_PATH", SHARDKIT_TEST_MARKER_PLUGIN_DIR);
  ScopedEnv announce("SHARDKIT_TEST_PLUGIN_MARKER", marker.string());
  Fixture f;
  constexpr H5Z_filter_t kUnknown = 32999;
  const H5Z_class2_t filter{H5Z_CLASS_T_VERS, kUnknown, 1, 1, "test passthrough", nullptr, nullptr, passthrough};
  ASSERT_GE(H5Zregister(&filter), 0);
  replace_checksums(f, "fp32", [&](hid_t group, const std::vector<uint64_t>& values) {
    const hsize_t n = values.size();
    h5::Id space = h5::check_id(H5Screate_simple(1, &n, nullptr), "space");
    h5::Id dcpl = h5::check_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate");
    h5::check(H5Pset_chunk(dcpl.get(), 1, &n), "H5Pset_chunk");
    h5::check(H5Pset_filter(dcpl.get(), kUnknown, H5Z_FLAG_MANDATORY, 0, nullptr), "H5Pset_filter");
    h5::Id ds = h5::check_id(
        H5Dcreate2(group, "fp32", H5T_STD_U64LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), "create");
    h5::check(H5Dwrite(ds.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "write");
  });
  ASSERT_GE(H5Zunregister(kUnknown), 0);
  const std::string error = read_error(f.step);
  EXPECT_FALSE(std::filesystem::exists(marker)) << "a library from HDF5_PLUGIN_PATH was loaded";
  std::filesystem::remove(marker);
  EXPECT_TRUE(contains(error, f.shard.string())) << error;
  EXPECT_TRUE(contains(error, "dataset /fp32 is filtered")) << error;
}

TEST(UntrustedShard, AParserCrashIsAnErrorNamingTheShard) {
  Fixture f;
  ScopedEnv fault("SHARDKIT_FAULT", "shard-index-crash");
  ScopedEnv rank("SHARDKIT_FAULT_RANK", "1");
  const std::string error = read_error(f.step);
  EXPECT_TRUE(contains(error, f.shard.string() + ": reading its HDF5 metadata crashed (signal 11, SIGSEGV)")) << error;
  EXPECT_FALSE(contains(error, ckpt::shard_file_name(0, 2))) << "rank 0's sound shard was blamed: " << error;
}

TEST(UntrustedShard, AParserThatNeverEndsIsStopped) {
  Fixture f;
  ScopedEnv fault("SHARDKIT_FAULT", "shard-index-hang");
  ScopedEnv rank("SHARDKIT_FAULT_RANK", "1");
  ckpt::isolated::restart_for_testing(1.0 / 60);  // one second of CPU time
  const auto start = std::chrono::steady_clock::now();
  const std::string error = read_error(f.step);
  ckpt::isolated::restart_for_testing();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  // Stopped by its CPU limit, or by the wall-clock limit when a loaded machine gave it little CPU.
  EXPECT_TRUE(contains(error, f.shard.string() + ": reading its HDF5 metadata used more than") ||
              contains(error, f.shard.string() + ": reading its HDF5 metadata did not finish within"))
      << error;
}

TEST(UntrustedShard, ASoundShardStillReadsWhenTheEnvironmentPointsAtPlugins) {
  Fixture f;
  ScopedEnv path("HDF5_PLUGIN_PATH", "/nonexistent");
  EXPECT_EQ(read_error(f.step), "");
}

TEST(UntrustedShard, AFifoInPlaceOfAShardIsRefusedWithoutWaiting) {
  Fixture f;
  std::filesystem::remove(f.shard);
  ASSERT_EQ(::mkfifo(f.shard.c_str(), 0600), 0);
  const std::string error = read_error(f.step);
  EXPECT_TRUE(contains(error, f.shard.string() + ": not a regular file")) << error;
}

// The isolated child must hold none of the caller's files: libhdf5 opens its files without
// O_CLOEXEC, and a child that kept one would keep its lock (a writer reopening it fails) and its space.
TEST(UntrustedShard, TheIsolatedChildHoldsNoFileOfTheCaller) {
  Fixture f;
  const std::filesystem::path locked = f.dir / "locked";
  const int fd = ::open(locked.c_str(), O_RDWR | O_CREAT, 0600);  // inheritable, as libhdf5's are
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ckpt::isolated::restart_for_testing();
  EXPECT_EQ(read_error(f.step), "");  // starts a child while the file is open and locked
  ::close(fd);
  const int again = ::open(locked.c_str(), O_RDWR);
  ASSERT_GE(again, 0);
  EXPECT_EQ(::flock(again, LOCK_EX | LOCK_NB), 0) << "the child still holds the caller's lock";
  ::close(again);
}

}  // namespace
}  // namespace shardkit
