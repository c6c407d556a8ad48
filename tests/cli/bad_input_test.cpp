// A battery of bad inputs as a user or a damaged file would present them: each is refused with exit
// code 1 or 2 and one line on stderr that names the file or option and what was expected.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "base/sanitizers.hpp"
#include "ckpt/manifest.hpp"
#include "model/gpt2/config.hpp"
#include "tests/cli/cli_support.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

struct Case {
  std::string what;
  std::string args;
  int code;               // expected exit code
  std::string must_name;  // a substring of the one line
  std::string must_say;   // and another
};

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(BadInput, EachIsRefusedWithOneLineNamingTheProblem) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string tiny = samples() + "tiny_zero2.json";
  auto path = [&](const std::string& name) { return (dir / name).string(); };
  write(dir / "bad.json", "{\"train_batch_size\": 4,");
  write(dir / "inconsistent.json", R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3})");
  write(dir / "huge_batch.json", R"({"train_micro_batch_size_per_gpu": 1073741824})");
  write(dir / "odd.bin", "abc");
  write(dir / "short.bin", std::string(20, 'a'));
  write(dir / "heads.json", R"({"n_layer": 1, "n_head": 3, "n_embd": 64, "vocab_size": 256, "n_positions": 64})");
  write(dir / "small.json", R"({"n_layer": 1, "n_head": 2, "n_embd": 64, "vocab_size": 256, "n_positions": 64})");
  write(dir / "regular.txt", "not a checkpoint\n");
  // Hugging Face weights: a header length of 2^63 - 1, and offsets past the end of the file.
  std::filesystem::create_directories(dir / "hf");
  write(dir / "hf" / "config.json",
        R"({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 64, "vocab_size": 256, "n_positions": 64})");
  write(dir / "hf" / "absurd.safetensors", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10));
  const std::string header = R"({"wte": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  std::string past(8, '\0');
  for (int i = 0; i < 8; ++i) past[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write(dir / "hf" / "past.safetensors", past + header + std::string(8, '\0'));  // 16 bytes promised, 8 there

  // A checkpoint of gpt2-tiny, to resume into another model.
  Result r =
      run("train --config " + tiny + " --model gpt2-tiny --data " + data + " --steps 1 --save-dir " + path("run"));
  ASSERT_EQ(r.code, 0) << r.err;
  // A checkpoint whose manifest (digest recomputed, as an attacker would) names ../../etc/passwd.
  r = run("bench ckpt --size 1MiB --dir " + path("ckpt"), mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::filesystem::path step = dir / "ckpt" / "step-00000001";
  ckpt::Manifest manifest = ckpt::read_manifest(step);
  manifest.shards[1].file = "../../etc/passwd";
  ckpt::write_manifest(step, manifest);

  const std::string train = "train --config ";
  const std::vector<Case> cases = {
      {"config that is not JSON", train + path("bad.json") + " --model gpt2-tiny --data " + data + " --steps 1", 2,
       "bad.json", "not valid JSON"},
      {"inconsistent batch sizes",
       train + path("inconsistent.json") + " --model gpt2-tiny --data " + data + " --steps 1", 2, "inconsistent.json",
       "train_batch_size 10 != train_micro_batch_size_per_gpu 3"},
      {"micro-batch larger than the machine",
       train + path("huge_batch.json") + " --model gpt2-tiny --data " + data + " --steps 1", 2,
       "micro-batch of 1073741824 x 64 tokens needs", "activations 1.70 PB), more than this machine's"},
      {"missing data", train + tiny + " --model gpt2-tiny --data " + path("none.bin") + " --steps 1", 2, "none.bin",
       "no such file"},
      {"odd-length data", train + tiny + " --model gpt2-tiny --data " + path("odd.bin") + " --steps 1", 2, "odd.bin",
       "odd size"},
      {"data shorter than one sequence", train + tiny + " --model gpt2-tiny --data " + path("short.bin") + " --steps 1",
       2, "short.bin", "fewer than"},
      {"n_embd not divisible by n_head",
       train + tiny + " --model " + path("heads.json") + " --data " + data + " --steps 1", 2, "heads.json",
       "not divisible by n_head"},
      {"resume from a regular file",
       train + tiny + " --model gpt2-tiny --data " + data + " --steps 1 --resume " + path("regular.txt"), 2,
       "regular.txt", "not a directory"},
      {"resume into a model of another shape",
       train + tiny + " --model " + path("small.json") + " --data " + data + " --steps 2 --resume " + path("run"), 2,
       "step-00000001", "holds another model"},
      {"manifest naming ../../etc/passwd", "ckpt verify " + step.string(), 1, "manifest.json",
       "file '../../etc/passwd', expected rank 1 in shard-00001-of-00002.h5"},
      {"safetensors header length 2^63", "convert import " + path("hf/absurd.safetensors") + " -o " + path("o1"), 1,
       "absurd.safetensors", "header length"},
      {"safetensors offsets past the end", "convert import " + path("hf/past.safetensors") + " -o " + path("o2"), 1,
       "past.safetensors", "truncated"},
      {"unknown command", "frobnicate", 2, "frobnicate", "unknown command"},
      {"unknown ckpt command", "ckpt frobnicate", 2, "frobnicate", "one of: ls"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    r = run(c.args);
    EXPECT_EQ(r.code, c.code) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.must_name), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.must_say), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
}

// `--device cuda` where no GPU can be used -- none visible (CUDA_VISIBLE_DEVICES empty hides them all,
// so this runs on GPU machines too), or a build without CUDA -- is refused before any work, in one line,
// by train and by eval; a GPU precision asked of the CPU's eval too (--device cpu, or auto without a GPU).
TEST(BadInput, CudaWithoutAGpuIsRefusedWithOneLine) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string train = "train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data;
  ASSERT_EQ(run(train + " --steps 1 --save-dir " + (dir / "run").string()).code, 0);
  const std::string eval = "eval " + (dir / "run").string() + " --data " + data + " --windows 2";
  for (const std::string& args : {train + " --device cuda --steps 1", eval + " --device cuda"}) {
    SCOPED_TRACE(args);
    const Result r = run(args, "", "CUDA_VISIBLE_DEVICES=");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("--device cuda: "), std::string::npos) << r.err;
    const bool none_visible = r.err.find("no CUDA device is visible") != std::string::npos;
    const bool not_built = r.err.find("built without CUDA") != std::string::npos;
    EXPECT_TRUE(none_visible || not_built) << r.err;
  }
  // Asked of the CPU, or of auto where no GPU can be used: the line says why eval runs on the CPU.
  const std::pair<std::string, std::string> devices[] = {
      {"--device cpu", "(--device cpu)"}, {"--device auto", "(auto: "}, {"", "(auto: "}};
  for (const auto& [device, reason] : devices) {
    const Result r = run(eval + " --dtype bf16 " + device, "", "CUDA_VISIBLE_DEVICES=");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("--dtype bf16 is a GPU precision and eval runs on the CPU " + reason), std::string::npos)
        << r.err;
  }
}

// A monitor's folder that cannot be made is refused before training, in one line naming the config key.
TEST(BadInput, AMonitorFolderThatCannotBeMadeIsRefusedNamingTheKey) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  std::ofstream(dir / "a-file") << "x";
  nlohmann::json config = nlohmann::json::parse(slurp(samples() + "tiny_zero2.json"));
  config["tensorboard"] = {{"enabled", true}, {"output_path", (dir / "a-file").string()}};
  std::ofstream(dir / "tb.json") << config.dump();
  const Result r = run("train --config " + (dir / "tb.json").string() + " --model gpt2-tiny --data " + data +
                       " --steps 1 --threads 1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("tb.json: tensorboard.output_path / tensorboard.job_name: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(expected a folder shardkit can write)"), std::string::npos) << r.err;
}

// A FIFO where a command expects a file used to block it forever in open(2); each is refused at once.
// (`timeout` ends a regression instead of the test's own time limit.)
TEST(BadInput, FifosInPlaceOfInputFilesAreRefusedAtOnce) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string tiny = samples() + "tiny_zero2.json";
  auto fifo = [&](const std::filesystem::path& path) {
    std::filesystem::create_directories(path.parent_path());
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  };
  fifo(dir / "ckpt" / "step-00000001" / "manifest.json");
  fifo(dir / "hf" / "config.json");
  write(dir / "hf" / "model.safetensors", "");
  fifo(dir / "st" / "model.safetensors");
  write(dir / "st" / "config.json",
        R"({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 64, "vocab_size": 256, "n_positions": 64})");
  fifo(dir / "ds.json");
  fifo(dir / "tokens.bin");
  fifo(dir / "zero" / "latest");
  fifo(dir / "zero2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  const std::vector<Case> cases = {
      // A checkpoint's own file: a damaged checkpoint (exit 1), which --resume auto moves past.
      {"manifest.json", "ckpt verify " + (dir / "ckpt" / "step-00000001").string(), 1, "manifest.json", ""},
      {"config.json", "convert import " + (dir / "hf").string() + " -o " + (dir / "o1").string(), 2, "config.json", ""},
      {"model.safetensors", "convert import " + (dir / "st").string() + " -o " + (dir / "o2").string(), 2,
       "model.safetensors", ""},
      {"DeepSpeed checkpoint's latest",
       "convert import-deepspeed " + (dir / "zero").string() + " --model gpt2-tiny -o " + (dir / "o3").string(), 2,
       "latest", ""},
      {"DeepSpeed rank file",
       "convert import-deepspeed " + (dir / "zero2").string() + " --model gpt2-tiny -o " + (dir / "o4").string(), 2,
       "zero_pp_rank_0_mp_rank_00_optim_states.pt", ""},
      {"DeepSpeed config",
       "train --config " + (dir / "ds.json").string() + " --model gpt2-tiny --data " + data + " --steps 1", 2,
       "ds.json", ""},
      {"token file",
       "train --config " + tiny + " --model gpt2-tiny --data " + (dir / "tokens.bin").string() + " --steps 1", 2,
       "tokens.bin", ""},
      {"text to encode", "data encode " + (dir / "tokens.bin").string() + " -o " + (dir / "out.bin").string(), 2,
       "tokens.bin", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Result r = run(c.args, "timeout -s KILL 30");
    EXPECT_EQ(r.code, c.code) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.must_name + ": not a regular file (a FIFO)"), std::string::npos) << r.err;
  }
}

// Numbers from a checkpoint that the trainer and eval used to take as they came: a negative step
// (step directories "step--0000002"), and a model larger than the machine, allocated before any shard
// was read.
TEST(BadInput, CheckpointNumbersBeyondTheirRangesAreRefused) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string tiny = samples() + "tiny_zero2.json";
  auto path = [&](const std::string& name) { return (dir / name).string(); };
  Result r =
      run("train --config " + tiny + " --model gpt2-tiny --data " + data + " --steps 1 --save-dir " + path("run"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::filesystem::path step = dir / "run" / "step-00000001";
  // Digests recomputed, as an attacker would.
  ckpt::Manifest manifest = ckpt::read_manifest(step);
  manifest.trainer_state["step"] = -2;
  ckpt::write_manifest(step, manifest);
  r = run("train --config " + tiny + " --model gpt2-tiny --data " + data + " --steps 2 --resume " + step.string() +
          " --save-dir " + path("run2"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("trainer_state: step = -2 is not an integer in [0, 999999999999]"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "run2" / "step--0000001"));
  // In range, but not the checkpoint's step: the run would go on from the wrong place.
  manifest.trainer_state["step"] = 1000;
  ckpt::write_manifest(step, manifest);
  r = run("train --config " + tiny + " --model gpt2-tiny --data " + data + " --steps 2 --resume " + step.string() +
          " --save-dir " + path("run2"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("trainer_state.step is 1000, but the checkpoint is of step 1"), std::string::npos) << r.err;
  manifest.trainer_state["step"] = 1;

  // The largest model the config checks admit: 1024 layers of width 65536, some 200 TB to evaluate.
  model::gpt2::GptConfig huge{1024, 64, 65536, 65536, 1024, "huge"};
  manifest.model = model::gpt2::to_json(huge);
  manifest.tensors = model::gpt2::tensor_table(huge);
  ckpt::write_manifest(step, manifest);
  // (The address-space limit makes the code before the check fail fast instead of filling the machine;
  // AddressSanitizer reserves terabytes of shadow at start-up and brings a limit of its own.)
  r = run("eval " + step.string() + " --data " + data,
          kUnderAddressSanitizer ? "timeout -s KILL 60" : "timeout -s KILL 60 prlimit --as=17179869184");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("step-00000001: evaluating its model needs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("of memory"), std::string::npos) << r.err;
}

// `train --model` of a model whose parameters, gradients and optimizer states exceed the machine used
// to end in std::bad_alloc (or the out-of-memory killer) after the allocation: train checked the
// activations only. (SHARDKIT_HOST_MEMORY makes this machine a 1 GiB one, so gpt2's 2.5 GB at stage 2
// exceed it on any machine, and the old behaviour was a run that went on.)
TEST(BadInput, TrainRefusesAModelLargerThanTheMachineBeforeAllocatingIt) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  write(dir / "one.json", R"({"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
                              "zero_optimization": {"stage": 2}})");
  const Result r =
      run("train --config " + (dir / "one.json").string() + " --model gpt2 --seq-len 16 --data " + data + " --steps 1",
          "timeout -s KILL 120", "SHARDKIT_HOST_MEMORY=1GiB");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  for (const char* says : {"model gpt2 at ZeRO stage 2 on 1 rank: training with a micro-batch of 1 x 16 tokens needs",
                           "(parameters 497.76 MB, gradients 497.76 MB, optimizer states 1.49 GB, activations",
                           "more than this machine's 1.07 GB of memory"}) {
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  }
}

// A run that fits only with activation checkpointing is refused with the option named: gpt2 at 4 x
// 1,024 tokens needs 5.1 GB with every activation kept (2.6 GB of them), 3.0 GB with each block
// recomputed (0.55 GB); SHARDKIT_HOST_MEMORY makes this a 4 GiB machine.
TEST(BadInput, TrainOffersActivationCheckpointingWhereItWouldFit) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  write(dir / "four.json", R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1})");
  const std::string command =
      "train --config " + (dir / "four.json").string() + " --model gpt2 --seq-len 1024 --data " + data + " --steps 1";
  const Result r = run(command, "timeout -s KILL 120", "SHARDKIT_HOST_MEMORY=4GiB");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  for (const char* says : {"model gpt2 at ZeRO stage 0 on 1 rank: training with a micro-batch of 4 x 1024 tokens needs",
                           "more than this machine's 4.29 GB of memory; would fit: --activation-checkpointing "
                           "(activations "}) {
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  }
  // Not offered where it is on already.
  const Result on = run(command + " --activation-checkpointing", "timeout -s KILL 120", "SHARDKIT_HOST_MEMORY=1GiB");
  EXPECT_EQ(on.code, 2) << on.err;
  EXPECT_EQ(on.err.find("would fit"), std::string::npos) << on.err;
}

}  // namespace
}  // namespace shardkit
