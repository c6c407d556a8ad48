// Inputs as an attacker would craft them: FIFOs and directories where files are expected, JSON nested
// 100,000 levels deep or larger than any real file, numbers that a narrowing would wrap, steps and
// chunk sizes past the format's caps, models larger than the machine. Each must end in a clean
// Error, never a hang, a crash or a silent change of value. Calls that could hang or crash run in a
// child process with a deadline, so that a regression fails the test instead of stalling the suite.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/safetensors.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/virtual_view.hpp"
#include "convert/stream.hpp"
#include "model/hf_weights.hpp"
#include "model/registry.hpp"
#include "tests/support/test_support.hpp"
#include "trainer/data.hpp"
#include "trainer/ds_config.hpp"

namespace shardkit {
namespace {

using testing::TempDir;

// How a call ended in a child process.
struct Outcome {
  enum Kind { kError, kReturned, kCrashed, kHung } kind = kHung;
  std::string message;  // the Error's, for kError
};

std::string describe(const Outcome& o) {
  const char* names[] = {"an error", "a normal return", "a crash", "a hang"};
  return std::string(names[o.kind]) + (o.message.empty() ? "" : ": " + o.message);
}

// Runs `call` in a child process and waits at most `seconds` for it.
Outcome run_isolated(const std::function<void()>& call, int seconds = 10) {
  int fds[2];
  if (::pipe(fds) != 0) return {Outcome::kCrashed, "pipe failed"};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string report = "R";
    try {
      call();
    } catch (const Error& e) {
      report = std::string("E") + e.what();
    } catch (const std::exception& e) {
      report = std::string("X") + e.what();
    }
    (void)!::write(fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string report;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  bool hung = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      hung = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    report.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (hung) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (hung) return {Outcome::kHung, ""};
  if (!WIFEXITED(status) || report.empty()) return {Outcome::kCrashed, "status " + std::to_string(status)};
  if (report[0] == 'E') return {Outcome::kError, report.substr(1)};
  if (report[0] == 'X') return {Outcome::kCrashed, "uncaught " + report.substr(1)};
  return {Outcome::kReturned, ""};
}

// `call` ends with an Error whose message holds `name` and `says`.
void expect_refused(const std::function<void()>& call, const std::string& name, const std::string& says) {
  const Outcome o = run_isolated(call);
  ASSERT_EQ(o.kind, Outcome::kError) << describe(o);
  EXPECT_NE(o.message.find(name), std::string::npos) << o.message;
  EXPECT_NE(o.message.find(says), std::string::npos) << o.message;
  EXPECT_EQ(o.message.find('\n'), std::string::npos) << o.message;
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void make_fifo(const std::filesystem::path& path) {
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
}

// ---- Inputs must be regular files ------------------------------------------------------------------

TEST(UntrustedInput, FifosAndDirectoriesAreRefusedWithoutBlocking) {
  const TempDir dir;
  const std::filesystem::path fifo = dir / "fifo";
  make_fifo(fifo);
  expect_refused([&] { read_small_file(fifo, 4096); }, fifo.string(), "not a regular file (a FIFO)");
  expect_refused([&] { open_input_file(dir.path()); }, dir.path().string(), "not a regular file (a directory)");
  expect_refused([&] { open_input_file("/dev/null"); }, "/dev/null", "not a regular file (a character device)");

  // Each kind of input, named as shardkit looks for it.
  const std::filesystem::path step = dir / "run" / "step-00000001";
  std::filesystem::create_directories(step);
  make_fifo(step / "manifest.json");
  expect_refused([&] { ckpt::read_manifest(step); }, "manifest.json", "not a regular file");
  expect_refused([&] { ckpt::CheckpointReader reader(step); }, "manifest.json", "not a regular file");

  make_fifo(dir / "model.safetensors");
  expect_refused([&] { ckpt::safetensors::Reader reader(dir / "model.safetensors"); }, "model.safetensors",
                 "not a regular file");
  make_fifo(dir / "ds.json");
  expect_refused([&] { trainer::load_ds_config(dir / "ds.json", 1, {}); }, "ds.json", "not a regular file");
  make_fifo(dir / "tokens.bin");
  expect_refused([&] { trainer::TokenFile tokens(dir / "tokens.bin"); }, "tokens.bin", "not a regular file");

  // Hugging Face weights whose config.json is a FIFO.
  std::filesystem::create_directories(dir / "hf");
  write(dir / "hf" / "model.safetensors", "");
  make_fifo(dir / "hf" / "config.json");
  expect_refused([&] { model::HfWeights weights(dir / "hf"); }, "config.json", "not a regular file");
}

TEST(UntrustedInput, SymbolicLinksToRegularFilesStayAllowed) {
  const TempDir dir;
  write(dir / "real.json", R"({"train_batch_size": 4})");
  std::filesystem::create_symlink(dir / "real.json", dir / "link.json");
  EXPECT_EQ(trainer::load_ds_config(dir / "link.json", 1, {}).train_batch_size, 4);
}

// ---- Links inside input folders stay inside them -------------------------------------------------

// A Hugging Face folder of gpt2-tiny as save_pretrained writes it (config.json, model.safetensors;
// zero weights are enough to be read).
void write_hf_folder(const std::filesystem::path& dir, const std::string& weights_name = "model.safetensors") {
  std::filesystem::create_directories(dir);
  const std::shared_ptr<const model::Model> m = model::resolve_model("gpt2-tiny");
  write(dir / "config.json", m->hf_config("float32").dump());
  std::vector<ckpt::safetensors::TensorSpec> specs;
  for (const ckpt::TensorInfo& t : m->table().tensors()) specs.push_back({t.name, "F32", t.shape});
  ckpt::safetensors::Writer writer(dir / weights_name, specs, {});
  writer.finish();
}

TEST(UntrustedInput, WeightsFolderFilesLinkedFromOutsideItAreRefused) {
  const TempDir dir;
  write_hf_folder(dir / "outside");
  // model.safetensors a link to weights elsewhere on the machine: they would be imported.
  std::filesystem::create_directories(dir / "single");
  write(dir / "single" / "config.json", read_small_file(dir / "outside" / "config.json", 1 << 20));
  std::filesystem::create_symlink(dir / "outside" / "model.safetensors", dir / "single" / "model.safetensors");
  ASSERT_NO_THROW(model::HfWeights(dir / "outside"));
  expect_refused([&] { model::HfWeights weights(dir / "single"); }, (dir / "single" / "model.safetensors").string(),
                 "leads out of " + (dir / "single").string() + " through a symbolic link");
  // A shard named by the index, through a relative link.
  std::filesystem::create_directories(dir / "sharded");
  write(dir / "sharded" / "config.json", read_small_file(dir / "outside" / "config.json", 1 << 20));
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  const std::shared_ptr<const model::Model> tiny = model::resolve_model("gpt2-tiny");
  for (const ckpt::TensorInfo& t : tiny->table().tensors()) {
    index["weight_map"][t.name] = "model-00001-of-00001.safetensors";
  }
  write(dir / "sharded" / "model.safetensors.index.json", index.dump());
  std::filesystem::create_symlink("../outside/model.safetensors", dir / "sharded" / "model-00001-of-00001.safetensors");
  expect_refused([&] { model::HfWeights weights(dir / "sharded"); }, "model-00001-of-00001.safetensors",
                 "leads out of");
  // The index and config.json, read from elsewhere through a link, are refused the same way.
  std::filesystem::remove(dir / "sharded" / "model-00001-of-00001.safetensors");
  std::filesystem::copy_file(dir / "outside" / "model.safetensors",
                             dir / "sharded" / "model-00001-of-00001.safetensors");
  ASSERT_NO_THROW(model::HfWeights(dir / "sharded"));
  std::filesystem::rename(dir / "sharded" / "model.safetensors.index.json", dir / "index.json");
  std::filesystem::create_symlink(dir / "index.json", dir / "sharded" / "model.safetensors.index.json");
  expect_refused([&] { model::HfWeights weights(dir / "sharded"); }, "model.safetensors.index.json", "leads out of");
  std::filesystem::remove(dir / "single" / "config.json");
  std::filesystem::create_symlink(dir / "outside" / "config.json", dir / "single" / "config.json");
  expect_refused([&] { model::HfWeights weights(dir / "single"); }, "config.json", "leads out of");
}

TEST(UntrustedInput, LinksWithinAWeightsFolderAndTheFolderNamedStayAllowed) {
  const TempDir dir;
  write_hf_folder(dir / "hf", "weights.safetensors");
  std::filesystem::create_symlink("weights.safetensors", dir / "hf" / "model.safetensors");
  std::filesystem::create_directory_symlink(dir / "hf", dir / "alias");
  for (const char* name : {"hf", "alias"}) {
    EXPECT_NO_THROW(model::HfWeights(dir / name)) << name;
    EXPECT_NO_THROW(model::HfWeights(dir / name / "model.safetensors")) << name;
  }
  // A file the user names is theirs to link: its config.json is beside the link.
  std::filesystem::create_directories(dir / "mine");
  std::filesystem::copy_file(dir / "hf" / "config.json", dir / "mine" / "config.json");
  std::filesystem::create_symlink(dir / "hf" / "weights.safetensors", dir / "mine" / "gpt2.safetensors");
  EXPECT_NO_THROW(model::HfWeights(dir / "mine" / "gpt2.safetensors"));
}

// Hugging Face's download cache keeps a snapshot's files as links into its repository's blobs/: a
// snapshot loads; a link out of the repository folder is still refused, as is one from a folder that
// only looks like a snapshot elsewhere.
TEST(UntrustedInput, ASnapshotOfTheDownloadCacheLoadsAndStaysInItsRepository) {
  const TempDir dir;
  const std::filesystem::path repo = dir / "hub" / "models--org--tiny";
  write_hf_folder(repo / "blobs", "weights.safetensors");
  std::filesystem::rename(repo / "blobs" / "config.json", repo / "blobs" / "c0ffee");
  std::filesystem::rename(repo / "blobs" / "weights.safetensors", repo / "blobs" / "beef");
  const std::filesystem::path snapshot = repo / "snapshots" / "0123abc";
  std::filesystem::create_directories(snapshot);
  std::filesystem::create_symlink("../../blobs/c0ffee", snapshot / "config.json");
  std::filesystem::create_symlink("../../blobs/beef", snapshot / "model.safetensors");
  EXPECT_NO_THROW(model::HfWeights{snapshot});

  write_hf_folder(dir / "elsewhere", "weights.safetensors");
  std::filesystem::remove(snapshot / "model.safetensors");
  std::filesystem::create_symlink(dir / "elsewhere" / "weights.safetensors", snapshot / "model.safetensors");
  expect_refused([&] { model::HfWeights{snapshot}; }, "model.safetensors", "leads out of");

  const std::filesystem::path fake = dir / "snapshots" / "0123abc";  // no models--* repository above it
  std::filesystem::create_directories(fake);
  std::filesystem::create_symlink(repo / "blobs" / "c0ffee", fake / "config.json");
  std::filesystem::create_symlink(repo / "blobs" / "beef", fake / "model.safetensors");
  expect_refused([&] { model::HfWeights{fake}; }, "config.json", "leads out of");
}

TEST(UntrustedInput, CheckpointFilesLinkedFromOutsideTheStepDirectoryAreRefused) {
  const TempDir dir;
  const ckpt::TensorTable table({{"w", {64}, ckpt::DType::kF32}});
  const std::filesystem::path source = testing::write_synthetic_checkpoint(dir / "a", table, {1, 1, 16}, {}, 7);
  // A step directory of another run whose shard is a link to the first run's: its bytes match the
  // copied manifest, so only the link gives it away.
  const std::filesystem::path step = dir / "b" / source.filename();
  std::filesystem::create_directories(step);
  std::filesystem::copy_file(source / ckpt::kManifestFileName, step / ckpt::kManifestFileName);
  std::filesystem::create_symlink(source / ckpt::shard_file_name(0, 1), step / ckpt::shard_file_name(0, 1));
  std::vector<float> out(64);
  expect_refused(
      [&] {
        ckpt::CheckpointReader reader(step);
        reader.read(0, 0, 0, out);
      },
      ckpt::shard_file_name(0, 1), "leads out of " + step.string());
  // The HDF5 view opens every shard too; it would point h5py at the other run's file.
  expect_refused([&] { ckpt::write_virtual_view(step, dir / "view.h5"); }, ckpt::shard_file_name(0, 1),
                 "leads out of " + step.string());
  EXPECT_FALSE(std::filesystem::exists(dir / "view.h5"));
  // The manifest too.
  std::filesystem::remove(step / ckpt::kManifestFileName);
  std::filesystem::create_symlink(source / ckpt::kManifestFileName, step / ckpt::kManifestFileName);
  expect_refused([&] { ckpt::CheckpointReader reader(step); }, std::string(ckpt::kManifestFileName), "leads out of");
  // A whole step directory named through a link is the user's choice.
  std::filesystem::create_directory_symlink(source, dir / "alias");
  ckpt::CheckpointReader reader(dir / "alias");
  EXPECT_NO_THROW(reader.read(0, 0, 0, out));
}

// ---- JSON: depth, size and value count bounded before parsing ------------------------------------

std::string nested(size_t levels) {
  return std::string(levels, '[') + std::string(levels, ']');
}

TEST(UntrustedInput, DeeplyNestedJsonIsRefusedBeforeParsing) {
  const std::string deep = nested(100'000);
  // Inside a manifest's opaque config, behind a digest that cannot match: the parse must stop first.
  const std::string manifest = R"({"format": "shardkit-checkpoint", "config": )" + deep + "}";
  expect_refused([&] { ckpt::parse_manifest(manifest, "m.json"); }, "m.json", "nested deeper than 64 levels");
  const std::string ds =
      R"({"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"betas": )" + deep + "}}}";
  expect_refused([&] { trainer::parse_ds_config_text(ds, 1, {}, "ds.json"); }, "ds.json", "nested deeper");
  const TempDir dir;
  write(dir / "model.json", R"({"n_layer": )" + deep + "}");
  expect_refused([&] { model::resolve_model((dir / "model.json").string()); }, "model.json", "nested deeper");
  // Comments are skipped exactly as the parser skips them: a quote in a comment hides nothing.
  const std::string commented = "{\"a\": // \"\r" + nested(1000) + "}";
  expect_refused([&] { trainer::parse_ds_config_text(commented, 1, {}, "c.json"); }, "c.json", "nested deeper");
  // 64 levels are fine.
  EXPECT_NO_THROW(parse_untrusted_json(nested(64), {1 << 20, false}, "ok", ErrorKind::kCorrupt));
}

TEST(UntrustedInput, OversizedOrDenseJsonIsRefusedBeforeParsing) {
  std::string big = R"({"format": "shardkit-checkpoint", "pad": ")";
  big += std::string(ckpt::kMaxManifestBytes, 'x') + "\"}";
  expect_refused([&] { ckpt::parse_manifest(big, "m.json"); }, "m.json", "more than the 16777216");
  // 2 bytes of text per value: a tree many times larger than its text.
  std::string dense = "[0";
  for (int i = 0; i < 300'000; ++i) dense += ",0";
  dense += "]";
  expect_refused([&] { trainer::parse_ds_config_text(dense, 1, {}, "ds.json"); }, "ds.json",
                 "more than 65536 JSON values");
  const TempDir dir;
  const std::filesystem::path file = dir / "huge.json";
  write(file, std::string((size_t{1} << 20) + 1, ' '));
  expect_refused([&] { trainer::load_ds_config(file, 1, {}); }, "huge.json", "larger than the 1048576 bytes");
}

TEST(UntrustedInput, ValuesInMessagesAreCutShortAndEscaped) {
  const std::string long_text(10'000, 'a');
  const std::string shown = quoted_excerpt(long_text + "\x1b[32m");
  EXPECT_LT(shown.size(), 200u);
  EXPECT_EQ(quoted_excerpt("a\x1b[32mOK\n"), "'a\\x1b[32mOK\\x0a'");
  const std::string ds = R"({"train_batch_size": ")" + long_text + "\"}";
  const Outcome o = run_isolated([&] { trainer::parse_ds_config_text(ds, 1, {}, "ds.json"); });
  ASSERT_EQ(o.kind, Outcome::kError) << describe(o);
  EXPECT_LT(o.message.size(), 400u) << o.message;
}

// ---- Numbers range-checked before any narrowing --------------------------------------------------

TEST(UntrustedInput, MicroBatchBeyondAnIntIsRefusedNotTruncated) {
  // 2^32 + 1 used to become a micro-batch of 1 in the trainer's int.
  expect_refused(
      [] { trainer::parse_ds_config_text(R"({"train_micro_batch_size_per_gpu": 4294967297})", 1, {}, "ds.json"); },
      "train_micro_batch_size_per_gpu", "4294967297");
  // The same size reached through train_batch_size / world size / accumulation.
  expect_refused(
      [] {
        trainer::parse_ds_config_text(R"({"train_batch_size": 8589934594, "gradient_accumulation_steps": 1})", 2, {},
                                      "ds.json");
      },
      "ds.json", "micro-batch of 4294967297");
}

TEST(UntrustedInput, CheckedIntegerNamesFileKeyValueAndRange) {
  const nlohmann::json j = {{"n", -2}, {"big", uint64_t{1} << 63}, {"f", 2.5}, {"s", "7"}};
  auto message = [&](const char* key) {
    try {
      integer_field(j, key, "f.json", 0, 100, ErrorKind::kCorrupt);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message("n"), "f.json: n = -2 is not an integer in [0, 100]");
  EXPECT_EQ(message("big"), "f.json: big = 9223372036854775808 is not an integer in [0, 100]");
  EXPECT_EQ(message("f"), "f.json: f = 2.5 is not an integer in [0, 100]");
  EXPECT_EQ(message("s"), "f.json: s = \"7\" is not an integer in [0, 100]");
  EXPECT_EQ(message("absent"), "f.json: absent is missing");
}

ckpt::Manifest sample_manifest() {
  ckpt::Manifest m;
  m.format_version = ckpt::kFormatVersion;
  m.checkpoint_uid = ckpt::make_checkpoint_uid();
  m.step = 42;
  m.created = ckpt::utc_timestamp();
  m.writer = "shardkit test";
  m.tensors = ckpt::TensorTable({{"w", {4, 3}, ckpt::DType::kF32}});
  m.layout = {1, 2, 16};
  m.states = {"fp32"};
  m.chunk_elems = 1024;
  m.shards.push_back({0, ckpt::shard_file_name(0, 1), 1000, 0x1234u});
  return m;
}

TEST(UntrustedInput, StepsBeyondTheFormatsCapAreRefused) {
  ckpt::Manifest m = sample_manifest();
  m.step = ckpt::kMaxStep + 1;
  const std::string text = ckpt::manifest_to_json(m).dump();
  expect_refused([&] { ckpt::parse_manifest(text, "m.json"); }, "m.json", "step = 1000000000000");
  EXPECT_EQ(ckpt::parse_step_dir_name("step-1000000000000"), -1);
  EXPECT_EQ(ckpt::parse_step_dir_name("step-999999999999"), ckpt::kMaxStep);
  expect_refused([] { ckpt::step_dir_name(-2); }, "step -2", "outside [0, 999999999999]");
}

// ---- Allocations sized by input bounded before they are made -------------------------------------

TEST(UntrustedInput, ChunkSizesAboveTheCapAreRefusedByReaderAndWriter) {
  ckpt::Manifest m = sample_manifest();
  m.chunk_elems = ckpt::kMaxChunkElems * 2;  // 2^28 used to pass: 1 GiB per chunk per reader thread
  const std::string text = ckpt::manifest_to_json(m).dump();
  expect_refused([&] { ckpt::parse_manifest(text, "m.json"); }, "m.json", "chunk_elems = 8388608");
  const TempDir dir;
  ckpt::ShardOptions options;
  options.chunk_elems = ckpt::kMaxChunkElems * 2;
  expect_refused(
      [&] {
        testing::write_synthetic_checkpoint(dir.path(), ckpt::TensorTable({{"w", {8}, ckpt::DType::kF32}}), {1, 1, 1},
                                            options, 1);
      },
      "chunk size", "exceeds the maximum");
}

TEST(UntrustedInput, ConverterBuffersIncludeTheSourcesChunksWithinMaxMemory) {
  for (const int64_t chunk : {ckpt::kDefaultChunkElems, ckpt::kMaxChunkElems}) {
    for (const int64_t max_memory : {int64_t{128} << 20, int64_t{512} << 20}) {
      convert::ConvertOptions options;
      options.max_memory = max_memory;
      options.threads = 8;
      const convert::StreamPlan plan = convert::plan_stream(options, 8, chunk);
      // Each thread: two pieces, and a chunk decoded and stored on each of the read and write sides.
      const int64_t per_thread = 2 * plan.piece_elems * 4 + 4 * chunk * 4;
      EXPECT_LE(plan.threads * per_thread, max_memory) << chunk << " " << max_memory;
      EXPECT_GE(plan.piece_elems, int64_t{1} << 16);
    }
  }
}

}  // namespace
}  // namespace shardkit
