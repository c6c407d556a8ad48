// `convert import-deepspeed`: DeepSpeed checkpoints written as DeepSpeed lays them out (by
// make_deepspeed_fixture.py with Debian's PyTorch) come in bit for bit, moments and step included, at
// any world size and stage; crafted pickles, damaged archives and mismatched folders are refused with
// the file named and nothing written.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>

#include "base/error.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/safetensors.hpp"
#include "convert/consolidate.hpp"
#include "convert/export_deepspeed.hpp"
#include "convert/import_checkpoint.hpp"
#include "convert/torch/unpickler.hpp"
#include "convert/torch/zip_reader.hpp"
#include "model/registry.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

using testing::TempDir;
namespace pt = convert::torch;

const char* const kModels[] = {"gpt2", "llama"};

std::string preset(const std::string& model) {
  return model + "-tiny";
}

// A string literal's bytes, NULs included.
template <size_t N>
std::string bytes(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

// The fixtures of both models. PyTorch takes seconds to start, and ctest runs every test in a process of
// its own: the first process writes them into the build tree, keyed by the script and the models'
// tables, and the others (and later runs) reuse them. Tests damage copies only.
class DeepSpeedImport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string key, args;
    {
      std::ifstream script(SHARDKIT_DEEPSPEED_FIXTURE_SCRIPT);
      key.assign(std::istreambuf_iterator<char>(script), {});
    }
    std::vector<std::pair<std::string, std::string>> tables;
    for (const char* m : kModels) {
      nlohmann::json table = nlohmann::json::array();
      const auto model = model::resolve_model(preset(m));
      for (const ckpt::TensorInfo& t : model->table()) table.push_back({{"name", t.name}, {"shape", t.shape}});
      tables.emplace_back(m, table.dump());
      key += table.dump();
    }
    root_ =
        std::filesystem::path(SHARDKIT_DEEPSPEED_FIXTURE_DIR) / ("fx-" + std::to_string(std::hash<std::string>()(key)));
    if (std::filesystem::exists(root_ / "done")) return;
    const std::filesystem::path scratch = root_.string() + ".tmp-" + std::to_string(::getpid());
    std::filesystem::remove_all(scratch);
    std::filesystem::create_directories(scratch);
    std::string command =
        std::string("/usr/bin/python3 " SHARDKIT_DEEPSPEED_FIXTURE_SCRIPT " --out ") + scratch.string();
    for (const auto& [name, table] : tables) {
      std::ofstream(scratch / (name + ".json")) << table;
      command += " --table " + name + "=" + (scratch / (name + ".json")).string();
    }
    const int status = std::system(command.c_str());
    skip_ = WIFEXITED(status) && WEXITSTATUS(status) == 77;
    if (!skip_ && status == 0) {
      std::ofstream(scratch / "done") << "complete\n";
      std::error_code ec;
      std::filesystem::rename(scratch, root_, ec);  // another test process may have been first: use its copy
    }
    std::filesystem::remove_all(scratch);
    ASSERT_TRUE(skip_ || status == 0) << command;
  }
  void SetUp() override {
    if (skip_) GTEST_SKIP() << "the fixtures need PyTorch (/usr/bin/python3 with Debian's python3-torch)";
  }

  static std::filesystem::path fixture(const std::string& model, const std::string& layout) {
    return root_ / model / layout;
  }
  // A copy of a fixture's tag folder to damage.
  std::filesystem::path copy_tag(const std::string& model, const std::string& layout) {
    const auto to = work_ / (model + "-" + layout);
    std::filesystem::copy(fixture(model, layout) / "global_step9", to, std::filesystem::copy_options::recursive);
    return to;
  }

  static convert::ConvertOptions options() {
    convert::ConvertOptions o;
    o.threads = 2;
    o.piece_elems = 4096;  // pieces that cross partition and sub-group boundaries
    return o;
  }

  // Imports, exports with the moments, and checks every value and counter against the fixture's.
  void round_trip(const std::string& model, const std::string& layout, std::optional<int> world,
                  std::optional<int> stage) {
    SCOPED_TRACE(model + " " + layout);
    convert::CheckpointImportRequest r;
    r.source = fixture(model, layout);
    r.output = work_ / ("ckpt-" + model + "-" + layout);
    r.model = preset(model);
    r.world_size = world;
    r.stage = stage;
    const convert::CheckpointImportResult result = convert::import_checkpoint(r, options());
    EXPECT_EQ(result.world_size, world.value_or(layout == "universal" ? 1 : 2));
    EXPECT_EQ(result.stage, stage.value_or(layout == "universal" ? 0
                                           : layout == "zero3"   ? 3
                                           : layout == "zero2"   ? 2
                                                                 : 1));
    ckpt::CheckpointReader reader(result.step_dir);
    EXPECT_TRUE(reader.verify().ok());
    const nlohmann::json& ts = reader.manifest().trainer_state;
    EXPECT_EQ(reader.manifest().step, 9);
    EXPECT_EQ(ts["step"], 9);
    EXPECT_EQ(ts["optimizer_steps"], 7);
    EXPECT_EQ(ts["skipped_steps"], 2);
    EXPECT_EQ(ts["consumed_samples"], 72);
    EXPECT_EQ(ts["lr_scheduler"]["last_batch_iteration"], 8);

    convert::ConsolidateRequest c;
    c.source = r.output;
    c.output = work_ / ("hf-" + model + "-" + layout);
    c.with_optimizer = true;
    convert::consolidate(c, options());
    const ckpt::safetensors::Reader exported(c.output / "model.safetensors");
    const auto table = model::resolve_model(preset(model))->table();
    const std::pair<const char*, std::string> states[] = {
        {"fp32", ""}, {"exp_avg", "optimizer.exp_avg."}, {"exp_avg_sq", "optimizer.exp_avg_sq."}};
    for (const auto& [state, prefix] : states) {
      std::ifstream expected(fixture(model, "expected") / (std::string(state) + ".bin"), std::ios::binary);
      for (const ckpt::TensorInfo& t : table) {
        std::vector<uint32_t> want(static_cast<size_t>(t.numel())), got(want.size());
        expected.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
        const ckpt::safetensors::TensorInfo* info = exported.header().find(prefix + t.name);
        ASSERT_NE(info, nullptr) << prefix + t.name;
        exported.read(*info, 0, std::as_writable_bytes(std::span<uint32_t>(got)));
        ASSERT_EQ(got, want) << state << " " << t.name;  // bit patterns: bit for bit
      }
    }
  }

  // Import of `source` must fail with kInvalidInput, a message holding each of `fragments`, and no output.
  void expect_refused(const std::filesystem::path& source, const std::string& model,
                      const std::vector<std::string>& fragments) {
    convert::CheckpointImportRequest r;
    r.source = source;
    r.output = work_ / "refused";
    r.model = model;
    try {
      convert::import_checkpoint(r, options());
      ADD_FAILURE() << "accepted " << source;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      for (const std::string& f : fragments) EXPECT_NE(what.find(f), std::string::npos) << f << " in: " << what;
    }
    // Nothing that looks like a checkpoint, and no staging folder left beside it.
    for (const auto& entry : std::filesystem::directory_iterator(work_)) {
      EXPECT_EQ(entry.path().filename().string().find("refused"), std::string::npos) << entry.path();
    }
  }

  TempDir work_dir_;
  const std::filesystem::path work_ = work_dir_.path();
  static inline std::filesystem::path root_;
  static inline bool skip_ = false;
};

TEST_F(DeepSpeedImport, EveryLayoutComesInBitForBitWithMomentsAndStep) {
  for (const char* model : kModels) {
    for (const char* layout : {"zero1", "zero2", "zero3", "universal"}) round_trip(model, layout, {}, {});
  }
}

TEST_F(DeepSpeedImport, AnyWorldSizeAndStage) {
  round_trip("gpt2", "zero3", 3, 1);
  round_trip("llama", "zero2", 1, 3);
  round_trip("llama", "universal", 4, 2);
}

TEST_F(DeepSpeedImport, WithoutModelTheConfigJsonOrTheCheckpointNamesTheTensors) {
  // Hugging Face's Trainer keeps config.json beside `latest` (checkpoint-N/); no --model needed.
  const std::filesystem::path run = work_ / "checkpoint-9";
  std::filesystem::copy(fixture("llama", "zero3"), run, std::filesystem::copy_options::recursive);
  convert::CheckpointImportRequest r;
  r.output = work_ / "out";
  // Without one, the checkpoint's own parameters: a model of no family, which reshards and exports.
  r.source = run;
  {
    const convert::CheckpointImportResult result = convert::import_checkpoint(r, options());
    ckpt::CheckpointReader reader(result.step_dir);
    EXPECT_EQ(reader.manifest().model["family"], "external");
    EXPECT_EQ(reader.tensors().size(), model::resolve_model("llama-tiny")->table().size());
    std::filesystem::remove_all(r.output);
  }
  // A config.json of a known model_type that asks for what its family does not compute: the tensors
  // as the files give them, as without one (`--model` would name the field).
  nlohmann::json gelu = model::resolve_model("llama-tiny")->hf_config("float32");
  gelu["hidden_act"] = "gelu";
  std::ofstream(run / "config.json") << gelu.dump();
  r.source = run;
  {
    const convert::CheckpointImportResult result = convert::import_checkpoint(r, options());
    ckpt::CheckpointReader reader(result.step_dir);
    EXPECT_EQ(reader.manifest().model["family"], "external");
    std::filesystem::remove_all(r.output);
  }
  std::ofstream(run / "config.json") << model::resolve_model("llama-tiny")->hf_config("float32").dump();
  for (const std::filesystem::path& source : {run, run / "global_step9"}) {
    r.source = source;
    const convert::CheckpointImportResult result = convert::import_checkpoint(r, options());
    ckpt::CheckpointReader reader(result.step_dir);
    EXPECT_EQ(reader.manifest().model["family"], "llama");
    EXPECT_EQ(reader.tensors().size(), model::resolve_model("llama-tiny")->table().size());
    std::filesystem::remove_all(r.output);
  }
}

TEST_F(DeepSpeedImport, AnOutputOverlappingTheSourceIsRefusedAndTheSourceSurvives) {
  const std::filesystem::path tag = copy_tag("gpt2", "zero3");
  convert::ConvertOptions forced = options();
  forced.force = true;
  for (const auto& [output, says] : {std::pair{tag, "is the input"}, std::pair{tag.parent_path(), "contains the input"},
                                     std::pair{tag / "out", "lies inside the input"}}) {
    convert::CheckpointImportRequest r;
    r.source = tag;
    r.output = output;
    r.model = "gpt2-tiny";
    try {
      convert::import_checkpoint(r, forced);
      ADD_FAILURE() << "accepted " << output;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(std::filesystem::exists(tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"));
  EXPECT_FALSE(std::filesystem::exists(tag / "out"));
}

// What DeepSpeed -> DeepSpeed and shardkit -> DeepSpeed refuse: each in one line naming the problem,
// before anything is written, leaving no output and no staging folder.
TEST_F(DeepSpeedImport, ExportsRefuseBadInputAndLeaveNothingBehind) {
  auto expect_export_refused = [&](const std::filesystem::path& source, int world, std::optional<int> stage,
                                   const std::filesystem::path& output, const std::vector<std::string>& fragments) {
    convert::DeepSpeedExportRequest e;
    e.source = source;
    e.output = output;
    e.world_size = world;
    e.stage = stage;
    try {
      convert::export_deepspeed(e, options());
      ADD_FAILURE() << "exported " << source;
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kInvalidInput) << err.what();
      const std::string what = err.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      for (const std::string& f : fragments) EXPECT_NE(what.find(f), std::string::npos) << f << " in: " << what;
    }
    for (const auto& entry : std::filesystem::directory_iterator(work_)) {
      EXPECT_EQ(entry.path().filename().string().find("refused"), std::string::npos) << entry.path();
    }
  };
  // A pickle naming any other global.
  expect_export_refused(fixture("gpt2", "evil"), 2, 3, work_ / "refused", {"'posix.system'"});
  EXPECT_FALSE(std::filesystem::exists(fixture("gpt2", "pwned")));
  // A missing rank.
  const std::filesystem::path holed = copy_tag("gpt2", "zero2");
  std::filesystem::remove(holed / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  std::filesystem::remove(holed / "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  expect_export_refused(holed, 2, 2, work_ / "refused", {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "missing"});
  // World size 0, stage 0 (DeepSpeed writes no ZeRO files for it).
  expect_export_refused(fixture("gpt2", "zero2"), 0, 2, work_ / "refused", {"--world-size 0"});
  expect_export_refused(fixture("gpt2", "zero2"), 2, 0, work_ / "refused", {"--stage 0"});
  // An output that exists is left as it was.
  std::filesystem::create_directories(work_ / "taken");
  std::ofstream(work_ / "taken" / "mine.txt") << "keep";
  expect_export_refused(fixture("gpt2", "zero2"), 2, 3, work_ / "taken", {"exists"});
  std::ifstream kept(work_ / "taken" / "mine.txt");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(kept)), {}), "keep");
  // An output inside its source.
  expect_export_refused(fixture("gpt2", "zero2"), 1, 1, fixture("gpt2", "zero2") / "refused-out", {});
  EXPECT_FALSE(std::filesystem::exists(fixture("gpt2", "zero2") / "refused-out"));
}

TEST_F(DeepSpeedImport, APickleCallingAnyOtherGlobalIsRefusedByName) {
  // Rank 1's file of this copy holds an object whose unpickling would run `touch pwned`.
  expect_refused(fixture("gpt2", "evil"), "gpt2-tiny",
                 {"bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "'posix.system'"});
  EXPECT_FALSE(std::filesystem::exists(fixture("gpt2", "pwned")));
}

TEST(Unpickler, RefusesEveryOtherGlobalByName) {
  // Hand-made pickles: protocol 2 GLOBAL, and protocol 4 STACK_GLOBAL.
  const std::pair<std::string, std::string> cases[] = {
      {bytes("\x80\x02"
             "cos\nsystem\nX\x02\x00\x00\x00lsq\x00\x85R."),
       "'os.system'"},
      {bytes("\x80\x02"
             "c__builtin__\neval\nq\x00."),
       "'__builtin__.eval'"},
      {bytes("\x80\x04\x8c\x08"
             "builtins\x8c\x04"
             "eval\x93."),
       "'builtins.eval'"},
      {bytes("\x80\x02"
             "csubprocess\nPopen\n."),
       "'subprocess.Popen'"},
      {bytes("\x80\x02"
             "ctorch\nload\n."),
       "'torch.load'"},
  };
  for (const auto& [pickle, name] : cases) {
    try {
      pt::unpickle(pickle, "crafted.pt");
      ADD_FAILURE() << "accepted " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find("refused the Python global " + name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("crafted.pt"), std::string::npos) << e.what();
    }
  }
}

TEST(Unpickler, CraftedPicklesAreBoundedNotObeyed) {
  const std::pair<std::string, std::string> cases[] = {
      {bytes("\x80\x02h\x05."), "memo entry 5 was never stored"},
      {bytes("\x80\x02X\xff\xff\xff\x7f"
             "abc"),
       "runs past the end of the pickle"},
      {bytes("\x80\x02]"), "ends inside an instruction"},
      {bytes("\x80\x02"
             "I1\n."),
       "opcode 0x49"},
      {std::string(5000, '('), "MARKs nested deeper than"},
      // A list that contains itself: no recursion and no leak.
      {bytes("\x80\x02]q\x00h\x00"
             "a."),
       ""},
  };
  for (const auto& [pickle, fragment] : cases) {
    try {
      pt::unpickle(pickle, "crafted.pt");
      EXPECT_TRUE(fragment.empty()) << "accepted: " << fragment;
    } catch (const Error& e) {
      EXPECT_FALSE(fragment.empty()) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  }
}

TEST_F(DeepSpeedImport, DamagedArchivesAreRefusedNamingTheFile) {
  const std::filesystem::path tag = copy_tag("gpt2", "zero2");
  const std::filesystem::path file = tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt";
  const auto size = std::filesystem::file_size(file);
  std::filesystem::resize_file(file, size / 2);
  expect_refused(tag, "gpt2-tiny", {file.string(), "no end-of-central-directory record"});
  std::filesystem::resize_file(file, 0);
  expect_refused(tag, "gpt2-tiny", {file.string(), "too short"});

  // A compressed entry: the central directory's method field of the first entry set to deflate.
  const std::filesystem::path model = tag / "mp_rank_00_model_states.pt";
  std::string archive;
  {
    std::ifstream in(model, std::ios::binary);
    archive.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t central = archive.find(bytes("PK\x01\x02"));
  ASSERT_NE(central, std::string::npos);
  std::string compressed = archive;
  compressed[central + 10] = 8;
  std::ofstream(model, std::ios::binary | std::ios::trunc) << compressed;
  std::filesystem::copy_file(fixture("gpt2", "zero2") / "global_step9" / file.filename(), file,
                             std::filesystem::copy_options::overwrite_existing);
  expect_refused(tag, "gpt2-tiny", {model.string(), "is compressed (method 8)", "data.pkl"});
  // An entry that claims to run past the end of the file.
  std::string oversized = archive;
  oversized[central + 20 + 3] = 0x7f;  // compressed size
  oversized[central + 24 + 3] = 0x7f;  // uncompressed size
  std::ofstream(model, std::ios::binary | std::ios::trunc) << oversized;
  expect_refused(tag, "gpt2-tiny", {model.string(), "runs past the end of the file"});
}

TEST_F(DeepSpeedImport, MissingAndMismatchedRankFilesAreRefused) {
  const std::filesystem::path tag = copy_tag("llama", "zero2");
  std::filesystem::remove(tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  expect_refused(tag, "llama-tiny", {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "missing", "ranks 0-0"});
  std::filesystem::copy_file(
      fixture("llama", "zero2") / "global_step9" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
      tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  std::filesystem::remove(tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt");
  expect_refused(tag, "llama-tiny",
                 {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "partition_count says 2 ranks", "holds 1"});
  // A rank file of another run (stage 3) beside stage 2 ones.
  std::filesystem::copy_file(fixture("llama", "zero3") / "global_step9" / "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                             tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt");
  expect_refused(tag, "llama-tiny", {"bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "ZeRO stage 3"});
  const std::filesystem::path stage3 = copy_tag("gpt2", "zero3");
  std::filesystem::remove(stage3 / "zero_pp_rank_0_mp_rank_00_model_states.pt");
  expect_refused(stage3, "gpt2-tiny", {"zero_pp_rank_0_mp_rank_00_model_states.pt", "missing"});
}

TEST_F(DeepSpeedImport, LinksLeadingOutOfTheFolderAreRefused) {
  namespace fs = std::filesystem;
  const fs::path outside = work_ / "outside";
  fs::create_directories(outside);
  const auto copy_run = [&](const std::string& layout, const std::string& name) {
    const fs::path to = work_ / name;
    fs::copy(fixture("gpt2", layout), to, fs::copy_options::recursive);
    return to;
  };
  // The tag folder that `latest` names is a link to a folder elsewhere.
  const fs::path run = copy_run("zero3", "tag-link");
  fs::rename(run / "global_step9", outside / "global_step9");
  fs::create_directory_symlink(outside / "global_step9", run / "global_step9");
  expect_refused(run, "gpt2-tiny", {(run / "global_step9").string(), "leads out of"});
  // A rank file that is a link to a file elsewhere.
  const fs::path tag = copy_tag("gpt2", "zero3");
  const fs::path rank = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt";
  fs::rename(rank, outside / rank.filename());
  fs::create_symlink(outside / rank.filename(), rank);
  expect_refused(tag, "gpt2-tiny", {rank.string(), "leads out of"});
  // A link that stays inside the folder is followed, and the folder named may itself be a link.
  fs::rename(outside / rank.filename(), tag / "kept.pt");
  fs::remove(rank);
  fs::create_symlink("kept.pt", rank);
  fs::create_directory_symlink(tag, work_ / "named-link");
  const fs::path named = work_ / "named-link";
  convert::CheckpointImportRequest r;
  r.source = named;
  r.output = work_ / "linked-import";
  r.model = "gpt2-tiny";
  EXPECT_NO_THROW(convert::import_checkpoint(r, options()));
  // A universal checkpoint's files and parameter folders.
  const fs::path uni = copy_run("universal", "uni-file");
  const fs::path param = uni / "global_step9_universal" / "zero" / "transformer.wte.weight";
  fs::rename(param / "exp_avg.pt", outside / "exp_avg.pt");
  fs::create_symlink(outside / "exp_avg.pt", param / "exp_avg.pt");
  expect_refused(uni, "gpt2-tiny", {(param / "exp_avg.pt").string(), "leads out of"});
  const fs::path uni2 = copy_run("universal", "uni-dir");
  const fs::path param2 = uni2 / "global_step9_universal" / "zero" / "transformer.wpe.weight";
  fs::rename(param2, outside / "wpe");
  fs::create_directory_symlink(outside / "wpe", param2);
  expect_refused(uni2, "gpt2-tiny", {param2.string(), "leads out of"});
}

TEST_F(DeepSpeedImport, LatestIsNeverFollowedOutsideNorPrinted) {
  namespace fs = std::filesystem;
  const fs::path run = work_ / "run";
  fs::copy(fixture("gpt2", "zero3"), run, fs::copy_options::recursive);
  // `latest` as a link to a file elsewhere (here one that names the right tag): not read.
  const fs::path secret = work_ / "secret.txt";
  std::ofstream(secret) << "global_step9";
  fs::remove(run / "latest");
  fs::create_symlink(secret, run / "latest");
  expect_refused(run, "gpt2-tiny", {(run / "latest").string(), "leads out of"});
  // Content that is no tag is not quoted.
  fs::remove(run / "latest");
  std::ofstream(run / "latest") << "password: hunter2 (do not share)";
  convert::CheckpointImportRequest r;
  r.source = run;
  r.output = work_ / "refused";
  r.model = "gpt2-tiny";
  try {
    convert::import_checkpoint(r, options());
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not name a tag folder"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
  }
}

TEST_F(DeepSpeedImport, ParametersMustBeTheModels) {
  expect_refused(fixture("gpt2", "zero2"), "llama-tiny",
                 {"mp_rank_00_model_states.pt", "unknown parameter 'transformer.wte.weight'"});
  // gpt2-tiny with half the positions: one tensor's shape disagrees.
  const std::filesystem::path small = work_ / "gpt2-short.json";
  std::ofstream(small) << R"({"name": "short", "n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 256,
                              "n_positions": 32})";
  expect_refused(fixture("gpt2", "zero3"), small.string(),
                 {"zero_pp_rank_0_mp_rank_00_model_states.pt", "'transformer.wpe.weight' has shape [64, 128]",
                  "expects [32, 128]"});
  expect_refused(fixture("llama", "universal"), "gpt2-tiny",
                 {"lm_head.weight/fp32.pt", "model gpt2-tiny ties the output projection"});
  expect_refused(work_, "gpt2-tiny", {"no zero_pp_rank_*_mp_rank_00_optim_states.pt files"});
}

}  // namespace
}  // namespace shardkit
